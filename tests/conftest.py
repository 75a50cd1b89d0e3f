from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# dtype "auto" (the default) would be bf16 on CPUs with AMX and float32 elsewhere: tests compare logprobs at
# 1e-4 and must mean the same on every machine, so they pin it (tests/engine/test_dtype.py covers "auto")
os.environ.setdefault("ENVACE_DTYPE", "float32")
sys.path.insert(0, str(Path(__file__).parent))

from helpers import PROBE  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def probe_log(tmp_path: Path) -> Path:
    return tmp_path / "probe-calls.jsonl"


@pytest.fixture
def probe_stdio(probe_log: Path) -> dict:
    """An mcpServers entry that runs the probe server over stdio, logging calls to `probe_log`."""
    return {"command": sys.executable, "args": [PROBE], "env": {"PROBE_LOG": str(probe_log)}}


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    """A ~1M-parameter Qwen3-shaped model with a locally trained tokenizer (plumbing, not accuracy)."""
    from envace_mcp.testing import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session")
def bank_catalog():
    """The bank server's catalog entries, read through a real in-process MCP session."""
    import anyio

    from envace_mcp.envs import get_suite
    from envace_mcp.toolbox import Toolbox

    async def read():
        async with Toolbox({"bank": get_suite("bank").build_server()}) as toolbox:
            return list(toolbox.catalog)

    return anyio.run(read)

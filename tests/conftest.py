from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
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



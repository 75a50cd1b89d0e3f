from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TESTS = Path(__file__).parent
PROBE = str(TESTS / "probe_server.py")
sys.path.insert(0, str(TESTS))


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


def logged_calls(path: Path) -> list[dict]:
    import json

    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def children_of(pid: int) -> set[int]:
    """Every live descendant of `pid`, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()

"""Reliability under server kills (the full 100-kill run is `benchmarks/chaos_kill_servers.py`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import anyio

BENCH = Path(__file__).parent.parent / "benchmarks" / "chaos_kill_servers.py"


def test_killing_the_server_mid_runs_leaves_every_run_finished_traced_and_no_orphans(tmp_path):
    spec = importlib.util.spec_from_file_location("chaos_kill_servers", BENCH)
    chaos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos)
    report = anyio.run(lambda: chaos.chaos(kills=10, runs=16, concurrency=4, out=tmp_path))
    assert report["kills"] == 10 and report["restarts"] >= 9
    assert report["runs"] == report["traces"] and report["store_problems"] == 0
    assert set(report["outcomes"]) <= {"finished", "max_steps"}  # no exception escaped any run
    assert report["tool_results"].get("server_died", 0) >= 1  # the kills really hit calls
    assert report["orphans"] == 0

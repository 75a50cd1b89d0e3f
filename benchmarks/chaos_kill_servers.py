"""Kill the MCP server again and again while graph runs use it; every run must end cleanly.

Runs of the EnvACE graph (a scripted policy making several `get_balance` calls, then answering) go
through one toolbox to the bundled bank server over stdio, several at a time, while a killer sends
SIGKILL to the server process at random moments. Checked at the end:

- every run finished or failed cleanly, and every run left a trace (a killed call is a
  `server_died` result the agent sees, not an exception);
- the toolbox restarted the server after each kill (its restart count);
- no server process outlives the toolbox.

    python benchmarks/chaos_kill_servers.py [--kills 100] [--runs 120] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from langchain_core.messages import HumanMessage

from envace_mcp._progress import Progress


def server_pids() -> set[int]:
    """Live child processes of this process running the bank server (read from /proc)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[1]) == os.getpid() and b"envace_mcp.servers.bank" in cmdline:
            pids.add(int(entry.name))
    return pids


async def chaos(kills: int, runs: int, concurrency: int, calls: int = 5, seed: int = 0,
                out: Path | None = None) -> dict[str, Any]:
    from envace_mcp.envs import get_suite
    from envace_mcp.graph import EnvaceContext, GateConfig, RunLimits, create_envace_graph
    from envace_mcp.policy.prompts import tool_call_text
    from envace_mcp.testing import ScriptedPolicy
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.traces import TraceStore, record_run

    rng = random.Random(seed)
    suite = get_suite("bank")
    account = next(iter(suite.build_server().episodes.state("default")["accounts"]))
    script = [tool_call_text("get_balance", {"account_id": account})] * calls + ["done"]
    store = TraceStore(out or Path(tempfile.mkdtemp(prefix="envace-chaos-")))
    graph = create_envace_graph().compile()
    outcomes: Counter[str] = Counter()
    results: Counter[str] = Counter()
    done_killing = anyio.Event()
    killed = 0
    started = time.perf_counter()
    async with Toolbox({"bank": suite.stdio_config()}, timeout=20) as toolbox:

        async def killer() -> None:
            nonlocal killed
            while killed < kills:
                await anyio.sleep(rng.uniform(0.05, 0.4))
                pids = server_pids()
                if pids:
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    killed += 1
            done_killing.set()

        async def one(i: int, limiter: anyio.Semaphore) -> None:
            async with limiter:
                context = EnvaceContext(policy=ScriptedPolicy(act=script), toolbox=toolbox,
                                        gate=GateConfig(require_approval="never"), limits=RunLimits(max_steps=calls + 2))
                try:
                    state, trace = await record_run(graph, {"messages": [HumanMessage(content="balances")]},
                                                    context=context, store=store, task_id=f"run-{i}")
                    outcomes[state.get("status") or "finished"] += 1
                    for step in trace.steps:
                        if step.role == "tool":
                            results[(step.result or {}).get("error_kind") or "ok"] += 1
                except Exception as exc:  # noqa: BLE001 - counted: a clean failure still leaves a trace
                    outcomes[f"failed: {type(exc).__name__}"] += 1
                progress.advance(kills=killed)

        with Progress("runs under SIGKILL", total=runs) as progress:
            async with anyio.create_task_group() as tg:
                tg.start_soon(killer)
                limiter = anyio.Semaphore(concurrency)
                i = 0
                while i < runs or not done_killing.is_set():  # keep runs going until every kill has landed
                    for _ in range(concurrency):
                        tg.start_soon(one, i, limiter)
                        i += 1
                    await anyio.sleep(0.05)
                    while limiter.value == 0:
                        await anyio.sleep(0.01)
        restarts = toolbox.restarts("bank")
    await anyio.sleep(0.5)
    traces = list(store.read())
    return {"kills": killed, "runs": sum(outcomes.values()), "outcomes": dict(outcomes), "tool_results": dict(results),
            "traces": len(traces), "store_problems": len(store.problems), "restarts": restarts,
            "orphans": len(server_pids()), "wall_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--runs", type=int, default=120)
    parser.add_argument("--concurrency", type=int, default=8)
    ns = parser.parse_args()
    report = anyio.run(chaos, ns.kills, ns.runs, ns.concurrency)
    for key, value in report.items():
        print(f"  {key:14}: {value}")
    ok = (report["runs"] == report["traces"] and report["orphans"] == 0 and report["store_problems"] == 0
          and not any(k.startswith("failed") for k in report["outcomes"]) and report["restarts"] >= report["kills"] - 1)
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

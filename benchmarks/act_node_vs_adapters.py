"""One tool call through the EnvACE act node vs langchain-mcp-adapters' default tools vs a raw SDK session.

Same stdio server (the bundled bank server), same call (`get_balance`), measured in one run:

- **raw**: an `mcp.Client` session kept open (the floor: what the protocol itself costs);
- **toolbox**: `Toolbox.call` (argument validation, timeout scope, result conversion);
- **act node**: the graph's `act` node function on a persistent toolbox (argument validation, the
  call, result conversion, the rehearsal record and the ToolMessage);
- **adapters**: `langchain-mcp-adapters` 0.3.2 with its default `MultiServerMCPClient(...).get_tools()`
  tools, which open a new session (a new server process, over stdio) for every call. It needs
  `mcp<2`, so it runs in its own virtual environment (created on first use under
  `~/.cache/envace-mcp/bench-venv-lma`, or pass `--adapters-python`) as a child process.

    python benchmarks/act_node_vs_adapters.py [--calls 300] [--rounds 5] [--adapter-calls 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio

ADAPTERS_CHILD = textwrap.dedent("""
    import asyncio, json, sys, time
    from langchain_mcp_adapters.client import MultiServerMCPClient

    async def main(command, args, account, calls):
        client = MultiServerMCPClient({"bank": {"transport": "stdio", "command": command, "args": args}})
        tools = {t.name: t for t in await client.get_tools()}
        tool = tools["get_balance"]
        await tool.ainvoke({"account_id": account})  # warm
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            out = await tool.ainvoke({"account_id": account})
            times.append(time.perf_counter() - start)
        assert "balance" in str(out), out
        print(json.dumps(times))

    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
""")


def adapters_python(explicit: str | None) -> str:
    if explicit:
        return explicit
    venv = Path(os.environ.get("ENVACE_CACHE", Path.home() / ".cache" / "envace-mcp")) / "bench-venv-lma"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} (langchain-mcp-adapters==0.3.2, mcp<2) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "langchain-mcp-adapters==0.3.2", "mcp<2"], check=True)
    return str(python)


async def ours(calls: int, rounds: int) -> tuple[dict[str, list[float]], str, dict]:
    from langgraph.runtime import Runtime
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from envace_mcp.envs import get_suite
    from envace_mcp.graph import EnvaceContext, GateConfig
    from envace_mcp.graph.nodes.act import act
    from envace_mcp.testing import ScriptedPolicy
    from envace_mcp.toolbox import Toolbox

    suite = get_suite("bank")
    entry = suite.stdio_config()
    account = next(iter(suite.build_server().episodes.state("default")["accounts"]))
    args = {"account_id": account}
    times: dict[str, list[float]] = {"raw": [], "toolbox": [], "act node": []}
    with open(os.devnull, "w") as devnull:
        params = StdioServerParameters(command=entry["command"], args=entry["args"])
        async with Client(stdio_client(params, errlog=devnull)) as raw, Toolbox({"bank": entry}) as toolbox:
            runtime = Runtime(context=EnvaceContext(policy=ScriptedPolicy(), toolbox=toolbox, gate=GateConfig(require_approval="never")))

            def payload(i: int) -> dict:
                return {"call": {"name": "get_balance", "args": args, "id": f"c{i}", "type": "tool_call"},
                        "record": {"call_id": f"c{i}", "decision": "execute"}}

            paths = {"raw": lambda i: raw.call_tool("get_balance", args),
                     "toolbox": lambda i: toolbox.call("get_balance", args),
                     "act node": lambda i: act(payload(i), runtime)}
            for i in range(20):  # warm every path
                for path in paths.values():
                    await path(i)
            for _ in range(rounds):  # alternate so drift hits every path alike
                for name, path in paths.items():
                    start = time.perf_counter()
                    for i in range(calls):
                        out = await path(i)
                    times[name].append((time.perf_counter() - start) / calls)
                assert out["messages"][0].status == "success", out
    return times, account, entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--adapter-calls", type=int, default=20)
    parser.add_argument("--adapters-python", default=None)
    ns = parser.parse_args()
    python = adapters_python(ns.adapters_python)
    times, account, entry = anyio.run(ours, ns.calls, ns.rounds)
    child = subprocess.run([python, "-c", ADAPTERS_CHILD, entry["command"], json.dumps(entry["args"]), account,
                            str(ns.adapter_calls)], capture_output=True, text=True, check=True)
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    ms["adapters"] = statistics.median(json.loads(child.stdout.strip().splitlines()[-1])) * 1e3
    print(f"stdio bank server, get_balance: {ns.calls} calls x {ns.rounds} rounds (raw, toolbox, act node), "
          f"{ns.adapter_calls} calls (adapters); medians")
    print(f"  raw mcp.Client session                 : {ms['raw']:9.3f} ms/call")
    print(f"  envace Toolbox.call                    : {ms['toolbox']:9.3f} ms/call")
    print(f"  EnvACE act node (persistent toolbox)   : {ms['act node']:9.3f} ms/call")
    print(f"  langchain-mcp-adapters 0.3.2 default   : {ms['adapters']:9.3f} ms/call")
    print(f"  adapters / act node : {ms['adapters'] / ms['act node']:8.1f}x  (goal >= 100x)")
    print(f"  toolbox / raw       : {ms['toolbox'] / ms['raw']:8.3f}x")
    print(f"  act node / raw      : {ms['act node'] / ms['raw']:8.3f}x  (goal <= 1.3x)")


if __name__ == "__main__":
    main()

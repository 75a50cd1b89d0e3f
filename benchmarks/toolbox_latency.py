"""Per-call latency of the toolbox vs a raw `mcp.Client` session, same stdio server, same calls.

Both run in this process against their own subprocess of the bundled bank server; rounds
alternate between the two so drift on a noisy machine hits both alike. The toolbox adds argument
validation, result conversion and timeout scopes on top of the raw session; the ratio says what
that costs.

    python benchmarks/toolbox_latency.py [--calls 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from envace_mcp.eval import get_suite
from envace_mcp.toolbox import Toolbox


async def main(calls: int, rounds: int) -> None:
    suite = get_suite("bank")
    entry = suite.stdio_config()
    world = suite.build_server().episodes.state("default")
    account = next(iter(world["accounts"]))
    args = {"account_id": account}
    raw_times: list[float] = []
    box_times: list[float] = []
    with open("/dev/null", "w") as devnull:
        params = StdioServerParameters(command=entry["command"], args=entry["args"])
        async with Client(stdio_client(params, errlog=devnull)) as raw, Toolbox({"bank": entry}) as toolbox:
            for _ in range(20):  # warm both paths (imports, caches, first-call work)
                await raw.call_tool("get_balance", args)
                await toolbox.call("get_balance", args)
            for _ in range(rounds):
                start = time.perf_counter()
                for _ in range(calls):
                    await raw.call_tool("get_balance", args)
                raw_times.append((time.perf_counter() - start) / calls)
                start = time.perf_counter()
                for _ in range(calls):
                    result = await toolbox.call("get_balance", args)
                box_times.append((time.perf_counter() - start) / calls)
                assert not result.is_error, result.text
    raw_ms, box_ms = statistics.median(raw_times) * 1e3, statistics.median(box_times) * 1e3
    print(f"stdio bank server, get_balance, {calls} calls x {rounds} rounds (median of rounds)")
    print(f"  raw mcp.Client session : {raw_ms:7.3f} ms/call")
    print(f"  envace Toolbox         : {box_ms:7.3f} ms/call")
    print(f"  ratio toolbox / raw    : {box_ms / raw_ms:7.3f}x  (goal <= 1.3x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args()
    anyio.run(main, ns.calls, ns.rounds)
    sys.exit(0)

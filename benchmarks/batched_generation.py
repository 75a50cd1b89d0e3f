"""Generation throughput of N concurrent rehearse requests on the embedded model: batched vs one at a time.

Both modes run the same N requests (same prompts, same seeds) through the same loaded model in
one process; only `max_batch_size` differs (N vs 1). Reported: wall time, generated tokens/s and
the ratio.

    python benchmarks/batched_generation.py [--n 16] [--max-new-tokens 32] [--dtype float32]
"""

from __future__ import annotations

import argparse
import time

import anyio
from langchain_core.messages import HumanMessage

from envace_mcp.envs import get_suite
from envace_mcp.policy import RehearseRequest, SamplingParams, ToolCall, load_policy
from envace_mcp.engine.batcher import Batcher
from envace_mcp.toolbox import Toolbox


async def requests(n: int) -> list[RehearseRequest]:
    suite = get_suite("bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        catalog = list(toolbox.catalog)
    out = []
    for task in suite.split("test"):
        for action in task.actions:
            spec = next(s for s in catalog if s.name == action.tool)
            call = ToolCall(id=f"c{len(out)}", name=action.tool, arguments=action.arguments)
            out.append(RehearseRequest(call=call, tool=spec, allowed=catalog,
                                       history=[HumanMessage(content=task.instruction)]))
            if len(out) == n:
                return out
    return out


async def run(policy, batch: list[RehearseRequest], max_new: int) -> tuple[float, int, list, dict]:
    results = [None] * len(batch)
    policy.engine.prefix_cache.clear()  # both modes pay the same prefill
    before = dict(policy.engine.stats)

    async def one(i: int) -> None:
        results[i] = await policy.rehearse(batch[i], SamplingParams(max_new_tokens=max_new, seed=i))

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(len(batch)):
            tg.start_soon(one, i)
    elapsed = time.perf_counter() - start
    spent = {k: policy.engine.stats[k] - before[k] for k in before}
    return elapsed, sum(len(r.completion_ids) for r in results), results, spent


async def main(n: int, max_new: int, dtype: str) -> None:
    policy = load_policy(None, dtype=dtype, max_batch_size=n)
    batch = await requests(n)
    await run(policy, batch[:2], 4)  # warm-up
    batched_s, batched_tokens, batched, b_spent = await run(policy, batch, max_new)
    largest = max(policy.engine.batcher.batch_sizes)  # most rows decoded together (the warm-up's stream may run on)
    policy.engine.batcher = Batcher(policy.engine.stream, max_batch=1, window_s=0.0)
    single_s, single_tokens, single, s_spent = await run(policy, batch, max_new)
    same = sum(a.completion_ids == b.completion_ids for a, b in zip(batched, single))
    prompt = sum(len(r.prompt_ids) for r in batched) / n
    from envace_mcp.engine.model import machine

    print(machine())  # the figures depend on the CPU's bf16 support and torch's threads
    print(f"embedded SmolLM2-135M ({dtype}), {n} concurrent rehearse requests, ~{prompt:.0f} prompt tokens, "
          f"<= {max_new} new tokens each")
    print(f"  one at a time : {single_s:7.2f} s  {single_tokens / single_s:7.1f} generated tok/s")
    print(f"  batched       : {batched_s:7.2f} s  {batched_tokens / batched_s:7.1f} generated tok/s  (largest batch {largest})")
    print(f"  speed-up      : {single_s / batched_s:7.2f}x wall time  (identical completions: {same}/{n})")
    print(f"  decode only   : {s_spent['decode_s']:.2f} s vs {b_spent['decode_s']:.2f} s = "
          f"{s_spent['decode_s'] / b_spent['decode_s']:.2f}x; prefill {s_spent['prefill_s']:.2f} s vs "
          f"{b_spent['prefill_s']:.2f} s (prefix cache reused {b_spent['reused_tokens'] / b_spent['prompt_tokens']:.0%} "
          f"of prompt tokens)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32")
    ns = parser.parse_args()
    anyio.run(main, ns.n, ns.max_new_tokens, ns.dtype)

"""Rollout throughput: 16 concurrent EnvACE graph runs on the embedded model, batched vs one at a time.

What GRPO's rollout phase does (`envace_mcp.train.rollouts.rollout_group`): `--tasks` bank tasks ×
`--group` runs each, all concurrent, simulated mode (the rehearse role answers every call), sampled
at temperature 1. Both modes use the same loaded model in one process, a fresh prefix cache each,
and the same per-request seeds; only the policy's batch size differs (16 vs 1). Reported: wall time,
runs/s, generated tokens/s (act + rehearse), and the ratios.

    python benchmarks/rollout_throughput.py [--adapter DIR] [--dtype bfloat16] [--tasks 4 --group 4]
        [--vllm http://127.0.0.1:8000/v1]

`--vllm`: also the same runs, all concurrent, on a vLLM server serving the embedded model (the adapter
hot-loaded; docs/scaling.md), against our engine's batched mode. A CPU server takes no per-request
seeds, so its runs are not the same samples: tokens/s is the like-for-like figure.

Without an adapter the base model rarely emits a valid tool call, so runs are one act turn each; with
an SFT adapter (`envace train sft`) they call tools and rehearse, which is what GRPO sees.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import time

import anyio

from envace_mcp._progress import Progress
from envace_mcp.envs import get_suite
from envace_mcp.graph import GateConfig, RunLimits
from envace_mcp.policy import SamplingParams, load_policy
from envace_mcp.engine.batcher import Batcher
from envace_mcp.policy.prompts import render_act, render_critique, render_inline, render_rehearse
from envace_mcp.toolbox import Toolbox
from envace_mcp.train.rollouts import rollout_group


class Seeded:
    """Seeds every request from its prompt (and how many times that prompt came before in this mode),
    so both modes sample the same completions for the same prompts whatever order requests arrive in:
    the runs of the two modes are alike, and so is the work (up to the float noise of batched vs
    single-row arithmetic, which can flip a sampled token now and then)."""

    def __init__(self, policy, max_new: int, temperature: float) -> None:
        self.policy, self.max_new, self.temperature = policy, max_new, temperature
        self.occurrences = collections.Counter()

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def _params(self, role: str, chat, tools=None):
        text = self.policy.render(chat, tools)
        self.occurrences[text] += 1
        digest = hashlib.sha256(f"{role}|{self.occurrences[text]}|{text}".encode()).digest()
        return SamplingParams(temperature=self.temperature, seed=int.from_bytes(digest[:7], "big"),
                              max_new_tokens=self.max_new)

    async def act(self, request, sampling=None):
        return await self.policy.act(request, self._params("act", *render_act(request)))

    async def rehearse(self, request, sampling=None):
        rendered = render_inline(request) if self.policy.rehearse_format == "inline" else (render_rehearse(request),)
        return await self.policy.rehearse(request, self._params("rehearse", *rendered))

    async def critique(self, request, sampling=None):
        return await self.policy.critique(request, self._params("critique", render_critique(request)))


async def one_mode(policy, tasks, tools, group: int, batch: int, max_new: int, gate: tuple[GateConfig, RunLimits], temperature: float,
                   label: str = "warm-up"):
    policy.engine.prefix_cache.clear()
    policy.engine.batcher = Batcher(policy.engine.stream, max_batch=batch, window_s=0.01 if batch > 1 else 0.0)
    before = dict(policy.engine.stats)
    suite = get_suite("bank")
    seeded = Seeded(policy, max_new, temperature)
    start = time.perf_counter()

    async def one_group(task):
        runs = await rollout_group(suite, task, seeded, k=group, mode="simulated", tools=tools, gate=gate[0], limits=gate[1])
        progress.advance(len(runs))
        return runs

    with Progress(f"{label} runs", total=len(tasks) * group) as progress:
        groups = await asyncio.gather(*(one_group(task) for task in tasks))
    wall = time.perf_counter() - start
    traces = [t for g in groups for t in g]
    tokens, completions = collections.Counter(), collections.Counter()
    for trace in traces:
        for step in trace.steps:
            if step.completion_ids:
                tokens[step.role] += len(step.completion_ids)
                completions[(step.role, tuple(step.completion_ids))] += 1
    spent = {k: policy.engine.stats[k] - before[k] for k in before}
    return {"wall": wall, "runs": len(traces), "tokens": tokens, "completions": completions,
            "batches": list(policy.engine.batcher.batch_sizes),
            "spent": spent, "reward": sum(t.rewards[0].value for t in traces) / len(traces)}


async def on_server(url: str, adapter, tasks, tools, group: int, max_new: int, gate: tuple[GateConfig, RunLimits], temperature: float):
    from envace_mcp.policy.vllm import VLLMPolicy

    policy = VLLMPolicy.from_url(url, adapter=adapter)
    suite = get_suite("bank")
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new)
    start = time.perf_counter()

    async def one_group(task):
        runs = await rollout_group(suite, task, policy, k=group, mode="simulated", tools=tools, gate=gate[0], limits=gate[1],
                                   sampling={"act": params, "rehearse": params})
        progress.advance(len(runs))
        return runs

    with Progress("vLLM runs", total=len(tasks) * group) as progress:
        groups = await asyncio.gather(*(one_group(task) for task in tasks))
    wall = time.perf_counter() - start
    await policy.aclose()
    traces = [t for g in groups for t in g]
    tokens = collections.Counter()
    for trace in traces:
        for step in trace.steps:
            if step.completion_ids:
                tokens[step.role] += len(step.completion_ids)
    return {"wall": wall, "runs": len(traces), "tokens": tokens, "name": policy.name,
            "reward": sum(t.rewards[0].value for t in traces) / len(traces)}


async def main(ns) -> None:
    formats = {k: v for k, v in (("tool_format", ns.tool_format), ("rehearse_format", ns.rehearse_format)) if v}
    policy = load_policy(None, adapter=ns.adapter, dtype=ns.dtype, max_batch_size=16, **formats)
    suite = get_suite("bank")
    tasks = suite.split("train")[: ns.tasks]
    async with Toolbox({suite.name: suite.build_server()}) as toolbox:  # the schemas; simulated runs call nothing
        tools = list(toolbox.catalog)
    gate = (GateConfig(rehearse="all"), RunLimits(max_steps=ns.max_steps))
    await one_mode(policy, tasks[:1], tools, 2, 16, 4, gate, ns.temperature)  # warm-up
    results = {}
    for name, batch in (("batched", ns.tasks * ns.group), ("one at a time", 1)):
        if name not in ns.modes.split(","):
            continue
        results[name] = await one_mode(policy, tasks, tools, ns.group, batch, ns.max_new_tokens, gate, ns.temperature,
                                       label=name)
    if ns.vllm:
        await on_server(ns.vllm, ns.adapter, tasks[:1], tools, 2, 4, gate, ns.temperature)  # warm-up
        server = await on_server(ns.vllm, ns.adapter, tasks, tools, ns.group, ns.max_new_tokens, gate, ns.temperature)
    n = ns.tasks * ns.group
    from envace_mcp.engine.model import machine

    print(machine())  # the figures depend on the CPU's bf16 support and torch's threads
    dtype = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    print(f"embedded SmolLM2-135M ({dtype}{', adapter ' + ns.adapter if ns.adapter else ''}; tools {policy.tool_format}, "
          f"rehearse {policy.rehearse_format}): {n} concurrent "
          f"graph runs ({ns.tasks} bank tasks x {ns.group}), simulated mode, rehearse=all, max_steps {ns.max_steps}, "
          f"<= {ns.max_new_tokens} new tokens per turn, temperature {ns.temperature}")
    for name, r in results.items():
        total = sum(r["tokens"].values())
        sizes = collections.Counter(r["batches"])
        print(f"  {name:14s}: {r['wall']:7.1f} s  {r['runs'] / r['wall'] * 60:6.1f} runs/min  {total / r['wall']:6.1f} "
              f"generated tok/s  ({dict(r['tokens'])}; prefill {r['spent']['prefill_s']:.1f} s, decode "
              f"{r['spent']['decode_s']:.1f} s, {r['spent']['decode_rows'] / max(r['spent']['decode_steps'], 1):.1f} rows "
              f"per step; batches {len(r['batches'])}, largest {max(sizes)}; mean reward "
              f"{r['reward']:.2f})")
    if ns.vllm:
        total = sum(server["tokens"].values())
        print(f"  {'vLLM':14s}: {server['wall']:7.1f} s  {server['runs'] / server['wall'] * 60:6.1f} runs/min  "
              f"{total / server['wall']:6.1f} generated tok/s  ({dict(server['tokens'])}; {server['name']}; mean reward "
              f"{server['reward']:.2f})")
        if "batched" in results:
            ours = results["batched"]
            print(f"  vLLM vs ours   : {(total / server['wall']) / (sum(ours['tokens'].values()) / ours['wall']):.2f}x "
                  f"generated tokens/s, both batched")
    if len(results) < 2:
        return
    b, s = results["batched"], results["one at a time"]
    tok = (sum(b["tokens"].values()) / b["wall"]) / (sum(s["tokens"].values()) / s["wall"])
    same = sum((b["completions"] & s["completions"]).values())
    print(f"  speed-up      : {tok:.2f}x generated tokens/s, {s['wall'] / b['wall']:.2f}x wall time "
          f"({same} of {sum(b['completions'].values())} batched completions also sampled one at a time; "
          f"where runs differ, tokens/s is the like-for-like figure)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", default=None, help="LoRA adapter folder (e.g. from `envace train sft`)")
    parser.add_argument("--dtype", default="auto", help="auto: bfloat16 where the CPU does it natively, else float32")
    parser.add_argument("--tool-format", choices=["json", "compact"], default=None, help="default: the adapter's")
    parser.add_argument("--rehearse-format", choices=["simulator", "inline"], default=None, help="default: the adapter's")
    parser.add_argument("--modes", default="batched,one at a time", help="which of the two modes to run")
    parser.add_argument("--vllm", default=None, help="also roll out on this vLLM server (http://HOST:PORT/v1)")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0, help="EnvACE samples rollouts at 1.0")
    anyio.run(main, parser.parse_args())

"""Peak memory (RSS) of online GRPO on the embedded model, by phase: loading, rollouts, update.

What `envace train grpo --suite bank --k 4 --mode simulated` does for `--steps` steps (4 groups of 4 simulated runs per
step, fp32, LoRA, gradient checkpointing), with a sampler thread reading this process's RSS every
50 ms. The baseline is the model's own weights (what any trainer holds at least).

    python benchmarks/grpo_memory.py [--steps 2] [--max-new-tokens 96] [--prefix-cache-tokens N]
                                     [--share-prefix --micro-batch 4] [--adapter embedded|DIR] [--rollouts-only]

`--adapter embedded` starts from the shipped bank adapter, whose runs go on for several calls (contexts
of thousands of tokens), where the bare model's end after a call or two: the long-run case. `--rollouts-only` stops
before the first update (the long-run update takes most of an hour here).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import psutil


class Sampler:
    def __init__(self) -> None:
        self.process = psutil.Process()
        self.phase = "load"
        self.peaks: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            rss = self.process.memory_info().rss
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--prefix-cache-tokens", type=int, default=None,
                        help="the rollout prefix cache (default: GRPOConfig.performance.rollout_prefix_cache_tokens)")
    parser.add_argument("--share-prefix", action="store_true", help="GRPOConfig.performance.share_prefix (packed micro-batches)")
    parser.add_argument("--micro-batch", type=int, default=None, help="GRPOConfig.performance.micro_batch (default: its default)")
    parser.add_argument("--adapter", default=None, help="start from this LoRA adapter ('embedded': the shipped one)")
    parser.add_argument("--skip-zero-advantage", action="store_true",
                        help="GRPOConfig.performance.skip_zero_advantage (off here: every segment goes through the update)")
    parser.add_argument("--rollouts-only", action="store_true", help="stop before the first update")
    parser.add_argument("--mmap-threshold-mb", type=float, default=None,
                        help="GRPOConfig.performance.mmap_threshold_mb (default: its default; 0: glibc's own)")
    ns = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sampler = Sampler()

    import anyio

    from envace_mcp.envs import get_suite
    from envace_mcp.policy import SamplingParams
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.train.trainer import GRPOConfig, OnlineGRPO

    suite = get_suite("bank")

    async def catalog():
        async with Toolbox({suite.name: suite.build_server()}) as toolbox:
            return list(toolbox.catalog)

    params = SamplingParams(max_new_tokens=ns.max_new_tokens, temperature=1.0)
    with tempfile.TemporaryDirectory() as out:
        # every segment through the model, whatever the rewards: the update's worst case, not the luck of the draw
        fast = {"share_prefix": ns.share_prefix, "skip_zero_advantage": ns.skip_zero_advantage}
        fast |= {"micro_batch": ns.micro_batch} if ns.micro_batch else {}
        if ns.mmap_threshold_mb is not None:
            fast["mmap_threshold_mb"] = ns.mmap_threshold_mb or None
        extra: dict = {"performance": fast}
        if ns.adapter:
            from envace_mcp.policy.embedded import embedded_adapter

            extra["adapter"] = str(embedded_adapter()) if ns.adapter == "embedded" else ns.adapter
        trainer = OnlineGRPO(GRPOConfig(steps=ns.steps, groups_per_step=4, checkpoint_every=ns.steps, **extra), suite, out, k=4,
                             tools=anyio.run(catalog), sampling={"act": params, "rehearse": params})
        if ns.prefix_cache_tokens is not None:
            trainer.policy.engine.prefix_cache.max_tokens = ns.prefix_cache_tokens
        weights = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
        update = trainer.update

        update_seconds = []

        class RolloutsDone(Exception):
            pass

        def phased_update(groups, *args, **kwargs):
            if ns.rollouts_only:
                raise RolloutsDone
            sampler.phase = "update"
            began = time.perf_counter()
            try:
                return update(groups, *args, **kwargs)
            finally:
                update_seconds.append(time.perf_counter() - began)
                sampler.phase = "rollouts"

        trainer.update = phased_update
        sampler.phase = "rollouts"
        start = time.perf_counter()
        try:
            trainer.run(progress=True)  # a heartbeat line every 20 s: a step takes minutes
        except RolloutsDone:
            pass
        wall = time.perf_counter() - start
    sampler.stop.set()
    sampler.thread.join()
    gb = 1024**3
    from envace_mcp.engine.model import machine

    print(machine())  # the figures depend on the CPU's bf16 support and torch's threads
    print(f"online GRPO, embedded SmolLM2-135M fp32 + LoRA, {ns.steps} steps x 16 simulated runs, "
          f"<= {ns.max_new_tokens} new tokens per turn, prefix cache {trainer.policy.engine.prefix_cache.max_tokens} tokens, "
          f"KV budget {trainer.policy.engine.kv_budget_gb} GB, "
          f"{extra or 'default micro-batches'} ({wall:.0f} s, updates {', '.join(f'{t:.0f}' for t in update_seconds)} s)")
    stats = trainer.policy.engine.stats
    print(f"  rollouts: {stats['decode_rows'] / max(stats['decode_steps'], 1):.1f} rows per decode step, "
          f"{stats['grouped_rows']} rows in prefix groups, {stats['kv_waits']} waits for KV room, "
          f"largest decode batch {trainer.policy.engine.kv_peak_slots} KV slots, "
          f"prefill {stats['prefill_s']:.0f} s, decode {stats['decode_s']:.0f} s")
    print(f"  model weights (baseline): {weights / gb:.2f} GB")
    for phase in ("load", "rollouts", "update"):
        if phase in sampler.peaks:
            print(f"  peak RSS, {phase:9s}: {sampler.peaks[phase] / gb:.2f} GB  ({sampler.peaks[phase] / weights:.1f}x the weights)")
    print(f"  peak RSS overall  : {max(sampler.peaks.values()) / gb:.2f} GB (goal <= 4 GB)")


if __name__ == "__main__":
    main()

"""GRPO update throughput: our trainer vs TRL's `GRPOTrainer` on the same model, data, groups and lengths.

Both train the embedded SmolLM2-135M with the same LoRA (r 16 on q/k/v/o), β = 0, the DAPO loss,
learning rate 1e-5, gradient checkpointing, fp32, one optimizer step per `--prompts` groups of
`--group` completions. The completions are sampled once beforehand (our policy, `--max-new-tokens`)
and handed to TRL through its generation hook, so both train on identical token ids and rewards and
the timing covers the update only: TRL's batch preparation + forward/backward + optimizer step vs
ours (`OfflineGRPO.update`). Prompts are the bank suite's act prompts (system + tools + task,
~1,700 tokens) — the shape our users train on. Reported: seconds per step (median after a warm-up
step), tokens per second (prompt + completion tokens of the step / step time), and the ratio — for
our default (one segment per forward pass) and for `share_prefix` with one group per forward pass
(its completions packed behind their prompt, which then runs once instead of once per completion).

Needs `pip install trl` (1.16 measured).

    python benchmarks/grpo_vs_trl.py [--prompts 2] [--group 4] [--steps 4] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

import anyio
import torch


def sample_data(n_prompts: int, group: int, max_new: int):
    """`n_prompts` bank act prompts, `group` sampled completions each, a seeded random reward each."""
    from envace_mcp.envs import get_suite
    from envace_mcp.policy import ActRequest, SamplingParams, load_policy
    from envace_mcp.policy.prompts import render_act
    from envace_mcp.toolbox import Toolbox

    suite = get_suite("bank")

    async def catalog():
        async with Toolbox({suite.name: suite.build_server()}) as toolbox:
            return list(toolbox.catalog)

    tools = anyio.run(catalog)
    policy = load_policy(None, max_batch_size=n_prompts * group)
    rng = random.Random(0)
    data = []
    for task in suite.split("train")[:n_prompts]:
        chat, schemas = render_act(ActRequest(task=task.instruction, tools=tools, instructions=suite.instructions))
        text = policy.render(chat, schemas)
        prompt_ids = policy.encode(text)
        from envace_mcp.engine import Job

        jobs = [Job(prompt_ids, SamplingParams(max_new_tokens=max_new, temperature=1.0), seed=rng.randrange(2**31))
                for _ in range(group)]
        outs = policy.engine.generate(jobs)
        data.append({"prompt": text, "prompt_ids": prompt_ids,
                     "completions": [o.completion_ids for o in outs], "logprobs": [o.logprobs for o in outs],
                     "rewards": [rng.random() for _ in outs]})
    return data


def run_trl(data, group: int, steps: int, max_new: int, out: str) -> tuple[list[float], int]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envace_mcp.policy.embedded import embedded_model_dir

    by_prompt = {tuple(d["prompt_ids"]): d for d in data}
    reward_of = {}
    for d in data:
        for c, r in zip(d["completions"], d["rewards"]):
            reward_of[tuple(c)] = r
    tokens_seen: list[int] = []

    class Fixed(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            completions, counters = [], {}
            for ids in prompt_ids:
                d = by_prompt[tuple(ids)]
                i = counters.get(id(d), 0)
                counters[id(d)] = i + 1
                completions.append(list(d["completions"][i % group]))
                tokens_seen.append(len(ids) + len(completions[-1]))
            return completions, None

    def reward(completion_ids, **kwargs):
        return [reward_of[tuple(c)] for c in completion_ids]

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    name = str(embedded_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    dataset = Dataset.from_list([{"prompt": d["prompt"]} for d in data] * (steps + 1))
    config = GRPOConfig(output_dir=out, per_device_train_batch_size=group, gradient_accumulation_steps=len(data),
                        num_generations=group, max_completion_length=max_new, beta=0.0, loss_type="dapo",
                        learning_rate=1e-5, gradient_checkpointing=True, use_cpu=True, bf16=False,
                        max_steps=steps, save_strategy="no", report_to=[], logging_steps=1,
                        num_iterations=1, scale_rewards="none", shuffle_dataset=False, disable_tqdm=True,
                        seed=0)
    trainer = Fixed(model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer,
                    peft_config=LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                           task_type="CAUSAL_LM"),
                    callbacks=[Clock()])
    trainer.train()
    per_step = sum(tokens_seen) // max(1, steps)
    return times, per_step


def run_ours(data, group: int, steps: int, out: str, share: bool = False) -> tuple[list[float], int]:
    from envace_mcp.train.rows import Segment
    from envace_mcp.train.trainer import GRPOConfig, OfflineGRPO

    config = GRPOConfig(loss_type="dapo", beta=0.0, lr=1e-5, lora=True, lora_r=16, lora_alpha=32,
                        groups_per_step=len(data), steps=steps,
                        performance={"gradient_checkpointing": True, "micro_batch": group if share else 1,
                                     "share_prefix": share})
    trainer = OfflineGRPO(config, None, out)
    groups = [[Segment(run_id=f"{i}-{j}", task_id=str(i), group_id=str(i), role="act", prompt_ids=d["prompt_ids"],
                       completion_ids=list(c), old_logprobs=list(lp), reward=r)
               for j, (c, lp, r) in enumerate(zip(d["completions"], d["logprobs"], d["rewards"]))]
              for i, d in enumerate(data)]
    from envace_mcp._progress import Progress

    times = []
    with Progress(f"our GRPO update{' (share_prefix)' if share else ''}", total=steps) as progress:
        for _ in range(steps):
            start = time.perf_counter()
            trainer.update(groups)
            times.append(time.perf_counter() - start)
            progress.advance(**{"s/step": round(times[-1], 1)})
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for g in groups for s in g)
    return times, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    ns = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = sample_data(ns.prompts, ns.group, ns.max_new_tokens)
    prompt = statistics.mean(len(d["prompt_ids"]) for d in data)
    completion = statistics.mean(len(c) for d in data for c in d["completions"])
    with tempfile.TemporaryDirectory() as tmp:
        ours, ours_tokens = run_ours(data, ns.group, ns.steps, os.path.join(tmp, "ours"))
        packed, _ = run_ours(data, ns.group, ns.steps, os.path.join(tmp, "packed"), share=True)
        trl, trl_tokens = run_trl(data, ns.group, ns.steps, ns.max_new_tokens, os.path.join(tmp, "trl"))
    ours_s, trl_s, packed_s = statistics.median(ours[1:]), statistics.median(trl[1:]), statistics.median(packed[1:])
    from envace_mcp.engine.model import machine

    print(machine())  # the figures depend on the CPU's bf16 support and torch's threads
    print(f"embedded SmolLM2-135M fp32, LoRA r16, {ns.prompts} groups x {ns.group} per step, prompts ~{prompt:.0f} "
          f"tokens, completions ~{completion:.0f} tokens (max {ns.max_new_tokens}), beta 0, DAPO loss, "
          f"gradient checkpointing; median of steps 2..{ns.steps}")
    print(f"  TRL GRPOTrainer : {trl_s:7.2f} s/step  {trl_tokens / trl_s:8.1f} tok/s  (steps: {[round(t, 2) for t in trl]})")
    print(f"  envace-mcp      : {ours_s:7.2f} s/step  {ours_tokens / ours_s:8.1f} tok/s  (steps: {[round(t, 2) for t in ours]})")
    print(f"  envace-mcp, share_prefix: {packed_s:7.2f} s/step  {ours_tokens / packed_s:8.1f} tok/s  "
          f"(steps: {[round(t, 2) for t in packed]})")
    print(f"  ratio           : {trl_s / ours_s:7.2f}x (our update vs TRL's, same tokens); "
          f"share_prefix {trl_s / packed_s:.2f}x")


if __name__ == "__main__":
    main()

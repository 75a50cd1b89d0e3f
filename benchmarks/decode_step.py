"""One decode step of the embedded model under a LoRA adapter: what each generation setting costs.

16 rows (and 1 row) sharing a ~1,500-token prompt prefix, each with its own 40 tokens, decode 40
tokens; the mean step time of steps 5-30 is reported for four settings of `TransformersPolicy`, all in
one process on one loaded model:
- baseline: every row holds its own copy of the prefix, peft's separate adapter path;
- `share_prefix`: the decode batch holds the shared prefix once;
- `merge_lora`: generation on merged copies of the adapted weights;
- both (the default).

    python benchmarks/decode_step.py [--adapter DIR] [--dtype bfloat16]

Without `--adapter` a random LoRA adapter (r 16 on q/k/v/o, like `envace train`) is made first.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def random_adapter(folder: str) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from envace_mcp.policy.embedded import embedded_model_dir

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()))
    config = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        init_lora_weights=False, task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def main(ns: argparse.Namespace) -> None:
    from envace_mcp.policy import SamplingParams, load_policy
    from envace_mcp.engine import Job
    from envace_mcp.engine.batch import DecodeBatch

    with tempfile.TemporaryDirectory() as tmp:
        adapter = ns.adapter or random_adapter(tmp)
        policy = load_policy(None, adapter=adapter, dtype=ns.dtype, max_batch_size=16)
    steps: list[float] = []
    original = DecodeBatch.step

    def timed(batch, tokens, positions):
        started = time.perf_counter()
        out = original(batch, tokens, positions)
        steps.append(time.perf_counter() - started)
        return out

    DecodeBatch.step = timed
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(100, 40000, (ns.prefix,), generator=generator).tolist()
    jobs = [Job(prefix + torch.randint(100, 40000, (40,), generator=generator).tolist(),
                 SamplingParams(max_new_tokens=40, temperature=1.0), seed=i) for i in range(16)]
    policy.engine.generate(jobs[:2])  # warm-up
    settings = [("baseline (own prefix copies, peft path)", False, False), ("share_prefix", True, False),
                ("merge_lora", False, True), ("both (default)", True, True)]
    results = {}
    for name, share, merge in settings:
        policy.engine.share_prefix, policy.engine.merge_lora = share, merge
        for rows in (16, 1):
            steps.clear()
            policy.engine.generate(jobs[:rows])
            results[(name, rows)] = sum(steps[5:30]) / len(steps[5:30]) * 1000
    from envace_mcp.engine.model import machine

    print(machine())  # the figures depend on the CPU's bf16 support and torch's threads
    dtype = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    print(f"embedded SmolLM2-135M ({dtype}) + LoRA {'(' + ns.adapter + ')' if ns.adapter else '(random, r 16, q/k/v/o)'}: "
          f"rows share a {ns.prefix}-token prefix + 40 own tokens; mean ms per decode step (steps 5-30)")
    base16, base1 = results[(settings[0][0], 16)], results[(settings[0][0], 1)]
    for name, _, _ in settings:
        r16, r1 = results[(name, 16)], results[(name, 1)]
        print(f"  {name:40s}: 16 rows {r16:6.1f} ms ({base16 / r16:4.2f}x)   1 row {r1:6.1f} ms ({base1 / r1:4.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", default=None, help="LoRA adapter folder (default: a random one)")
    parser.add_argument("--dtype", default="auto", help="auto: bfloat16 where the CPU does it natively, else float32")
    parser.add_argument("--prefix", type=int, default=1500, help="shared prompt prefix length in tokens")
    main(parser.parse_args())

"""SFT step time and peak memory on the embedded SmolLM2 with LoRA: a step of 16 rows packed as a prefix
tree and attended part by part, with checkpointing recomputing the attention kernel (before issue 53)
or keeping its outputs (today); the older variants (one row at a time, a block mask) on request.

    python benchmarks/sft_throughput.py [--traces DIR] [--rows 16] [--batch-size 16] [--steps 2]
                                        [--variants NAME ...]

Rows are SFT rows (act + rehearse turns) from reference traces (`envace lab reference DIR
--no-logprobs`; recorded here on the first bank train tasks when no folder is given). Every variant
runs forward + backward on the same rows, same weights, each in a fresh process (so peak RSS is its
own), `--steps` times; seconds are the mean of the steps after the first. Earlier runs of this script:
fp32 without checkpointing was 2.19x slower than one row at a time; padded multi-row batches ran out
of 24 GB. Prints tokens/s (tokens of the rows as they would run alone), ratio to the first variant,
peak RSS, and the mean per-token loss over all rows, which every variant must reproduce.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch


VARIANTS = {  # name: (rows per batch (0 = --batch-size), share_prefix, part-by-part, attention kept)
    "one row at a time": (1, False, True, True),
    "packed, shared prefix, block mask": (0, True, False, True),
    "prefix tree, attention recomputed (before)": (0, True, True, False),
    "prefix tree (today)": (0, True, True, True),
}
DEFAULT = ("prefix tree, attention recomputed (before)", "prefix tree (today)")
"""Run unless `--variants` names others; the first is the baseline of the ratios."""


def run_variant(folder: str, rows_wanted: int, batch_size: int, name: str, steps: int) -> dict:
    from _variants import recompute_attention
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.policy.embedded import embedded_model_dir
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.rows import collate, prefix_order, prepare_for_training
    from envace_mcp.train.sft import sft_loss, sft_rows, target_encoding

    per_batch, share, parts, keep = VARIANTS[name]
    if not keep:
        recompute_attention()
    args_batch, batch_size = batch_size, per_batch or batch_size
    model_dir = str(embedded_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = sft_rows(TraceStore(folder).read(), *target_encoding(tokenizer))
    # batches as `train_sft` cuts them with share_prefix (prompt order), a seeded pick of them
    order = prefix_order(rows)
    cut = [order[s: s + args_batch] for s in range(0, len(order), args_batch)]
    random.Random(0).shuffle(cut)
    picked = [i for chunk in cut for i in chunk][:rows_wanted]
    rows = [rows[i] for i in picked]
    chunks = [rows[s: s + batch_size] for s in range(0, len(rows), batch_size)]
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                      task_type="CAUSAL_LM"))
    prepare_for_training(model, True)
    if not parts:  # back to transformers' own sdpa: packed rows then need the N x N block mask
        model.get_base_model().set_attn_implementation("sdpa")
    model.train()
    times = []
    for _ in range(steps):  # the same rows again: what the first step allocates, later steps may reuse
        start, loss_sum = time.perf_counter(), 0.0
        for chunk in chunks:
            loss = sft_loss(model, chunk, 0, share_prefix=share, bf16=True)
            loss.backward()
            model.zero_grad()
            loss_sum += float(loss) * sum(len(r.completion_ids) for r in chunk)
        times.append(time.perf_counter() - start)
    packed = sum(collate(chunk, share_prefix=share).input_ids.shape[1] for chunk in chunks)
    steady = times[1:] or times
    return {"seconds": sum(steady) / len(steady), "first": times[0],
            "loss": loss_sum / sum(len(r.completion_ids) for r in rows),
            "packed_tokens": packed,
            "tokens": sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows),
            "targets": sum(len(r.completion_ids) for r in rows), "rows": len(rows),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--traces", default=None)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2,
                        help="steps per variant on the same rows; seconds are the mean of those after the first")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(DEFAULT), metavar="NAME",
                        help=f"variants to run, the first the baseline (default: {', '.join(DEFAULT)})")
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.traces, args.rows, args.batch_size, args.variant, args.steps)))
        return

    from _variants import print_each, reference_traces, run_each

    from envace_mcp.engine.model import machine

    folder = reference_traces(args.traces, args.rows)
    print(f"{machine()}; bf16 autocast, LoRA r 16, checkpointing")
    argv = ["--traces", folder, "--rows", str(args.rows), "--batch-size", str(args.batch_size), "--steps", str(args.steps)]
    results = run_each(__file__, argv, args.variants, "SFT variants")
    first = next((r for r in results.values() if isinstance(r, dict)), None)
    if first is not None:
        print(f"{first['rows']} rows ({first['tokens']} tokens, {first['targets']} trained), batches of {args.batch_size}")
    print_each(results, 44, lambda r, ratio: (
        f"{r['seconds']:7.1f} s/step (first {r['first']:5.1f}) {r['tokens'] / r['seconds']:7.1f} tok/s "
        f"{ratio:>6s}  {r['packed_tokens']:6d} tokens run  peak {r['peak_mb']:6.0f} MB  loss {r['loss']:.5f}"))

if __name__ == "__main__":
    main()

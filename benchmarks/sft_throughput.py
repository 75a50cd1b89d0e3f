"""SFT step throughput and peak memory on the embedded SmolLM2 with LoRA: packed rows without and
with the shared prompt prefix, gradient checkpointing, fp32 vs bf16.

    python benchmarks/sft_throughput.py [--traces DIR] [--rows 8] [--batch-size 4]

Rows are SFT rows (act + rehearse turns) from reference traces (`envace traces reference DIR
--no-logprobs`; recorded here on the first bank train tasks when no folder is given). Every variant
runs forward + backward on the same rows, same batches, same weights, each in a fresh process (so
peak RSS is its own). Baseline: one row at a time with its whole prompt (plain causal attention), fp32, no checkpointing
(padded multi-row batches of these ~2k-token prompts ran out of 24 GB).
Prints tokens/s, ratio to the baseline, peak RSS, and the gap of each variant's mean loss to the baseline's (batches differ in size, so per-batch
losses are not comparable).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch


VARIANTS = {  # name: (rows per batch (0 = --batch-size), share_prefix, gradient_checkpointing, bf16)
    "one row at a time, fp32 (baseline)": (1, False, False, False),
    "one row at a time, checkpointing, bf16": (1, False, True, True),
    "packed, shared prefix, checkpointing, fp32": (0, True, True, False),
    "packed, shared prefix, checkpointing, bf16": (0, True, True, True),
}


def run_variant(folder: str, rows_wanted: int, batch_size: int, name: str) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.policy.embedded import embedded_model_dir
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.rows import prefix_order, prepare_for_training
    from envace_mcp.train.sft import sft_loss, sft_rows, target_encoding

    per_batch, share, checkpointing, bf16 = VARIANTS[name]
    batch_size = per_batch or batch_size
    model_dir = str(embedded_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = sft_rows(TraceStore(folder).read(), *target_encoding(tokenizer))
    rows = [rows[i] for i in sorted(random.Random(0).sample(range(len(rows)), min(rows_wanted, len(rows))))]
    order = prefix_order(rows)
    chunks = [[rows[i] for i in order[s: s + batch_size]] for s in range(0, len(order), batch_size)]
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                      task_type="CAUSAL_LM"))
    prepare_for_training(model, checkpointing)
    model.train()
    start, losses = time.perf_counter(), []
    for chunk in chunks:
        loss = sft_loss(model, chunk, 0, share_prefix=share, bf16=bf16)
        loss.backward()
        model.zero_grad()
        losses.append(float(loss))
    return {"seconds": time.perf_counter() - start, "losses": losses,
            "tokens": sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows),
            "targets": sum(len(r.completion_ids) for r in rows), "rows": len(rows),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--traces", default=None)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.traces, args.rows, args.batch_size, args.variant)))
        return

    folder = args.traces
    if folder is None:
        from envace_mcp.policy import load_policy
        from envace_mcp.train.reference import record_reference_traces

        folder = tempfile.mkdtemp()
        anyio.run(lambda: record_reference_traces(load_policy(None), "bank", folder, limit=8, score=False))
    results = {}
    for name in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--traces", folder, "--rows", str(args.rows), "--batch-size",
                              str(args.batch_size), "--variant", name], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{name:40s} failed (rc {out.returncode}; -9 = killed, e.g. out of memory)")
            continue
        results[name] = r = json.loads(out.stdout.strip().splitlines()[-1])
        if len(results) == 1:
            print(f"{r['rows']} rows ({r['tokens']} tokens, {r['targets']} trained), batches of {args.batch_size}")
        base = results.get(next(iter(VARIANTS)))
        ratio = f"x{base['seconds'] / r['seconds']:.2f}" if base else "-"
        gap = abs(sum(base["losses"]) / len(base["losses"]) - sum(r["losses"]) / len(r["losses"])) if base else float("nan")
        print(f"{name:40s} {r['seconds']:7.1f} s {r['tokens'] / r['seconds']:8.1f} tok/s {ratio:>6s}  "
              f"peak {r['peak_mb']:7.0f} MB  loss gap {gap:.1e}")


if __name__ == "__main__":
    main()

"""SFT step throughput and peak memory on the embedded SmolLM2 with LoRA: one row at a time vs rows
packed with their shared prompt prefix, through a block mask or attended part by part.

    python benchmarks/sft_throughput.py [--traces DIR] [--rows 16] [--batch-size 16]

Rows are SFT rows (act + rehearse turns) from reference traces (`envace lab reference DIR
--no-logprobs`; recorded here on the first bank train tasks when no folder is given). Every variant
runs forward + backward on the same rows, same weights, each in a fresh process (so peak RSS is its
own). Baseline: one row at a time with its whole prompt (plain causal attention), bf16, checkpointing
(the SFT default until packing was attended part by part). Earlier runs of this script: fp32 without
checkpointing was 2.19x slower than the baseline; padded multi-row batches ran out of 24 GB.
Prints tokens/s (tokens of the rows as they would run alone), ratio to the baseline, peak RSS, and the
mean per-token loss over all rows, which every variant must reproduce.
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


VARIANTS = {  # name: (rows per batch (0 = --batch-size), share_prefix, part-by-part attention); all bf16 + checkpointing
    "one row at a time (baseline)": (1, False, True),
    "packed, shared prefix, block mask": (0, True, False),
    "packed, shared prefix, part by part": (0, True, True),
}


def run_variant(folder: str, rows_wanted: int, batch_size: int, name: str) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.policy.embedded import embedded_model_dir
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.rows import collate, prefix_order, prepare_for_training
    from envace_mcp.train.sft import sft_loss, sft_rows, target_encoding

    per_batch, share, parts = VARIANTS[name]
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
    start, loss_sum, packed = time.perf_counter(), 0.0, 0
    for chunk in chunks:
        loss = sft_loss(model, chunk, 0, share_prefix=share, bf16=True)
        loss.backward()
        model.zero_grad()
        loss_sum += float(loss) * sum(len(r.completion_ids) for r in chunk)
        packed += collate(chunk, share_prefix=share).input_ids.shape[1]
    return {"seconds": time.perf_counter() - start, "loss": loss_sum / sum(len(r.completion_ids) for r in rows),
            "packed_tokens": packed,
            "tokens": sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows),
            "targets": sum(len(r.completion_ids) for r in rows), "rows": len(rows),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--traces", default=None)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.traces, args.rows, args.batch_size, args.variant)))
        return

    folder = args.traces
    if folder is None:
        from envace_mcp.policy import load_policy
        from envace_mcp.lab.reference import record_reference_traces

        folder = tempfile.mkdtemp()
        anyio.run(lambda: record_reference_traces(load_policy(None), "bank", folder, limit=args.rows, score=False))
    from envace_mcp._progress import Progress

    results = {}
    with Progress("SFT variants (each in its own process)", total=len(VARIANTS)) as progress:
        outputs = {}
        for name in VARIANTS:
            outputs[name] = subprocess.run([sys.executable, __file__, "--traces", folder, "--rows", str(args.rows),
                                            "--batch-size", str(args.batch_size), "--variant", name],
                                           capture_output=True, text=True)
            progress.advance(last=name)
    for name in VARIANTS:
        out = outputs[name]
        if out.returncode != 0:
            print(f"{name:40s} failed (rc {out.returncode}; -9 = killed, e.g. out of memory)")
            continue
        results[name] = r = json.loads(out.stdout.strip().splitlines()[-1])
        if len(results) == 1:
            print(f"{r['rows']} rows ({r['tokens']} tokens, {r['targets']} trained), batches of {args.batch_size}")
        base = results.get(next(iter(VARIANTS)))
        ratio = f"x{base['seconds'] / r['seconds']:.2f}" if base else "-"
        print(f"{name:36s} {r['seconds']:7.1f} s {r['tokens'] / r['seconds']:8.1f} tok/s {ratio:>6s}  "
              f"{r['packed_tokens']:7d} tokens run  peak {r['peak_mb']:6.0f} MB  loss {r['loss']:.5f}")


if __name__ == "__main__":
    main()

"""SFT warm start from recorded runs (behaviour cloning), LoRA or full fine-tune.

Rows (`sft_rows`):
- act turns of successful runs (task reward ≥ `min_reward`), the tokens the model produced;
- rehearse turns of any run whose call really ran, with the target replaced by the **real** result
  (the world model learns the environment from what actually happened, not from what it guessed):
  `<execution_result>…</execution_result>` for simulator prompts, and for inline ones the real reply
  as the tool turn shows it, closed as the template closes it — the very tokens the next act turn's
  prompt holds, so the row nests in the trajectory. Rehearsals of calls that never ran are skipped.
Loss: cross-entropy on target tokens only (prompt tokens are masked), mean over target tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from envace_mcp.engine.model import autocast_bf16, quiet_loading
from envace_mcp.policy.prompts import clip_output
from envace_mcp.toolbox import ToolResult
from envace_mcp.traces.schema import Trace
from envace_mcp.train.config import SFTConfig
from envace_mcp.train.heap import after_backward, cap_heap_blocks
from envace_mcp.train.rows import (
    Segment,
    collate,
    forward_logits,
    micro_batches,
    prefix_order,
    prepare_for_training,
    run_stretches,
)


def real_result_text(result: dict[str, Any]) -> str:
    """A real tool result as the rehearse role should have written it."""
    if result.get("is_error"):
        message = "".join(b.get("text", "") for b in result.get("content", []) if b.get("type") == "text")
        payload: Any = {"error_tool_call": {"code": "EXECUTION_ERROR", "message": message}}
    elif result.get("structured_content") is not None:
        payload = result["structured_content"]
    else:
        text = "".join(b.get("text", "") for b in result.get("content", []) if b.get("type") == "text")
        try:
            payload = json.loads(text)
        except ValueError:
            payload = {"result": text}
    return f"<execution_result>{json.dumps(payload, ensure_ascii=False)}</execution_result>"


def rehearse_target(result: dict[str, Any], step: Any) -> str:
    """What a rehearse step should have written, given the call's real result (`ToolResult` JSON)."""
    return reply_target(result, getattr(step, "format", None), getattr(step, "close", None))


def reply_target(result: dict[str, Any], fmt: str | None, close: str | None = None) -> str:
    """The real result as a rehearsal in prompt format `fmt` writes it: `<execution_result>` JSON for the
    simulator prompt; for an inline one the reply as the tool turn shows it, closed by `close`."""
    if fmt != "inline":
        return real_result_text(result)
    return clip_output(ToolResult.text_of(result)) + (close or "")  # as the next act prompt shows it


def target_encoding(tokenizer: Any) -> tuple[Callable[[str], list[int]], int]:
    """How `sft_rows` turns real results into target tokens for `tokenizer`: an encoder without
    special tokens, and the end-of-turn id (`<|im_end|>` for ChatML templates, else EOS)."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(end, int) or end == tokenizer.unk_token_id:
        end = tokenizer.eos_token_id
    return (lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]), end


def sft_rows(traces: Iterable[Trace], encode: Callable[[str], list[int]], end_id: int, *, reward: str = "task",
             min_reward: float = 1.0, roles: tuple[str, ...] = ("act", "rehearse")) -> list[Segment]:
    rows: list[Segment] = []
    for trace in traces:
        found = trace.reward(reward)
        success = found is not None and found.value is not None and found.value >= min_reward
        real = {s.call_id: s.result for s in trace.steps if s.ran and s.result is not None}
        for step in trace.steps:
            if step.prompt_ids is None or step.role not in roles:
                continue
            if step.role == "act" and success and step.completion_ids:
                target = list(step.completion_ids)
            elif step.role == "rehearse" and step.call_id in real:
                target = encode(rehearse_target(real[step.call_id], step)) + [end_id]
            else:
                continue
            rows.append(Segment(run_id=trace.run_id, task_id=trace.task_id, group_id=trace.group_id, role=step.role,
                                prompt_ids=list(step.prompt_ids), completion_ids=target, old_logprobs=None,
                                reward=found.value if found else None))
    return rows


def batches(rows: list[Segment], batch_size: int, rng: random.Random, share_prefix: bool) -> list[list[int]]:
    """One epoch's batches of row indices. With `share_prefix`, rows are taken in prompt order (so each
    batch shares a long prefix) as whole runs — a batch closes before a run that would take it past
    `batch_size` rows, and a run longer than that is cut — and the batches are shuffled: a run cut
    between two batches would pay for its longest sequence in both (on the 504 bundled reference runs,
    batches of 16 rows cut anywhere packed 1.15M tokens an epoch in passes of 8,192, whole runs 1.08M;
    1.42M and 1.34M in passes of 4,096). Otherwise rows are shuffled."""
    if share_prefix:
        chunks: list[list[int]] = []
        for run in run_stretches(rows, prefix_order(rows)):
            if chunks and len(chunks[-1]) + len(run) <= batch_size:
                chunks[-1] += run
            else:
                chunks += [run[i: i + batch_size] for i in range(0, len(run), batch_size)]
        rng.shuffle(chunks)
        return chunks
    order = list(range(len(rows)))
    rng.shuffle(order)
    return [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


def steps_per_epoch(rows: list[Segment], config: SFTConfig) -> int:
    """Optimizer steps one epoch of `train_sft` takes (batches of whole runs can hold fewer rows than
    `batch_size`)."""
    return len(batches(rows, config.batch_size, random.Random(0), config.performance.share_prefix))


def sft_loss(model: torch.nn.Module, rows: list[Segment], pad_id: int, *, share_prefix: bool = False,
             bf16: bool | str = False) -> torch.Tensor:
    batch = collate(rows, pad_id, share_prefix=share_prefix).to(next(model.parameters()).device)
    device = "cuda" if batch.input_ids.is_cuda else "cpu"
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast_bf16(bf16, device)):
        logits = forward_logits(model, batch)  # [K, V]: the real completion tokens only
    targets = batch.targets[batch.completion_mask.bool()]  # [K]
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum") / max(targets.numel(), 1)


def train_sft(model: Any, rows: list[Segment], pad_id: int, config: SFTConfig, *, out: Path | None = None,
              on_step: Callable[[dict[str, float]], None] | None = None) -> Any:
    """Fine-tune `model` on `rows`; returns the trained (peft-wrapped when LoRA) model. A peft model
    (loaded with a trainable adapter) goes on training that adapter."""
    torch.manual_seed(config.seed)
    if config.lora and not hasattr(model, "peft_config"):  # a model loaded with a trainable adapter continues it
        from peft import LoraConfig, get_peft_model

        with quiet_loading():
            model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                                                     target_modules=config.lora_targets, task_type="CAUSAL_LM"))
    fast = config.performance
    prepare_for_training(model, fast.gradient_checkpointing)
    cap_heap_blocks(fast.mmap_threshold_mb)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr)
    rng = random.Random(config.seed)
    step = 0
    for epoch in range(config.epochs):
        for indices in batches(rows, config.batch_size, rng, fast.share_prefix):
            chunk = [rows[i] for i in indices]
            optimizer.zero_grad()
            targets = sum(len(r.completion_ids) for r in chunk)
            loss = torch.zeros(())
            passes = micro_batches(chunk, fast.micro_batch, fast.micro_tokens if fast.share_prefix else None)
            for indices_of_pass in passes:  # mean over the batch's target tokens
                part = [chunk[i] for i in indices_of_pass]
                weight = sum(len(r.completion_ids) for r in part) / targets
                piece = sft_loss(model, part, pad_id, share_prefix=fast.share_prefix, bf16=fast.bf16) * weight
                piece.backward()
                loss = loss + piece.detach().float()
                after_backward(len(part), fast.share_prefix)
            norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            optimizer.step()
            step += 1
            if on_step is not None:
                on_step({"step": step, "epoch": epoch, "loss": float(loss), "grad_norm": float(norm),
                         "tokens": float(sum(len(r.completion_ids) for r in chunk))})
    model.eval()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
    return model

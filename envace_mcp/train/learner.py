"""The GRPO learner: the model being trained, its reference, its optimizer, and one update per step.

It takes groups of segments (one task's K runs) from any source — recorded traces or fresh rollouts
(`envace_mcp.train.sources`) — and makes one optimizer step over all their segments, micro-batched.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from envace_mcp.engine.model import autocast_bf16, load_model, quiet_loading
from envace_mcp.policy.embedded import embedded_model_dir
from envace_mcp.train import distributed
from envace_mcp.train.advantages import group_key, step_advantages
from envace_mcp.train.config import GRPOConfig
from envace_mcp.train.grpo import grpo_loss
from envace_mcp.train.heap import after_backward, cap_heap_blocks
from envace_mcp.train.rows import (
    Segment,
    batch_logprobs,
    collate,
    micro_batches,
    prefix_order,
    prepare_for_training,
)
from envace_mcp.train.sft import sft_loss


@dataclass(frozen=True)
class _GRPOChunk:
    """Segments scored by the GRPO loss, with their advantages."""

    rows: list[Segment]
    advantages: torch.Tensor  # [B]


@dataclass(frozen=True)
class _CEChunk:
    """Rehearse prompts with their recorded real results as targets (`real_output_ce`)."""

    rows: list[Segment]


@dataclass(frozen=True)
class _NoWork:
    """A rank with nothing this step: it still joins DDP's all-reduce, with zero gradients."""


_Chunk = _GRPOChunk | _CEChunk | _NoWork


class GRPOLearner:
    """The trainable side of GRPO. `model` and `tokenizer` default to `config.model` (the embedded model)."""

    def __init__(self, config: GRPOConfig, *, model: Any = None, tokenizer: Any = None) -> None:
        self.config = config
        self.rank, self.world_size = distributed.setup()
        if model is None:
            model, tokenizer = load_model(config.model or embedded_model_dir(), adapter=config.adapter, dtype="checkpoint",
                                          trainable=True)
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
        if config.adapter:
            if not hasattr(model, "peft_config"):  # (`load_model` above loads it)
                from peft import PeftModel

                with quiet_loading():
                    model = PeftModel.from_pretrained(model, config.adapter, is_trainable=True)
        elif config.lora:
            from peft import LoraConfig, get_peft_model

            torch.manual_seed(config.seed)
            with quiet_loading():
                model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                                                         task_type="CAUSAL_LM",
                                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        self.model = model.to(distributed.device())
        prepare_for_training(model, config.performance.gradient_checkpointing)
        self.reference: Any = None
        """A frozen copy of the starting weights, for β > 0 without LoRA (with LoRA the reference is the
        model with its adapter disabled). Copied once the model is prepared, so it attends packed rows the
        same way."""
        if config.beta and not hasattr(model, "disable_adapter"):
            import copy

            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        cap_heap_blocks(config.performance.mmap_threshold_mb)
        self.engine = distributed.wrap(self.model)
        """What forward/backward go through: DDP around the model under torchrun, the model itself otherwise."""
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr)
        self.ce_rows: dict[str, list[Segment]] = defaultdict(list)
        """Real-output CE rows by group (`real_output_ce`), from the sources' traces."""

    def reference_logprobs(self, batch: Any) -> torch.Tensor:  # [B, T]
        """The reference policy's log-probs of a batch's completion tokens (for the β·KL term), no grad."""
        with torch.no_grad():
            if self.reference is not None:
                return batch_logprobs(self.reference, batch)
            with self.model.disable_adapter():
                return batch_logprobs(self.model, batch)

    def update(self, groups: list[list[Segment]]) -> dict[str, float]:
        """One optimizer step over the segments of `groups` (this rank's share of the step's groups
        under torchrun; all of them otherwise), with role-wise or trajectory advantages. Returns the
        step's metrics (without its step number)."""
        config, fast = self.config, self.config.performance
        rows = [r for g in groups for r in g]
        advantages = step_advantages(groups, config)  # [S]
        if fast.share_prefix and rows:  # the step's loss is a sum over all its segments, so order is free
            order = prefix_order(rows)
            rows, advantages = [rows[i] for i in order], advantages[order]
        # normalisers over the whole step, on every rank
        total_tokens = distributed.reduce(float(sum(len(r.completion_ids) for r in rows)))
        total_rows = distributed.reduce(float(len(rows)))
        longest = distributed.reduce(float(max((len(r.completion_ids) for r in rows), default=0)), "max")
        if total_rows == 0:  # nothing generated with tokens (e.g. a chat-model policy): log and move on
            return {"loss": 0.0, "segments": 0, "tokens": 0.0}
        if config.beta == 0 and fast.skip_zero_advantage:  # without KL: exactly 0 loss and gradient
            keep = advantages != 0  # [S]
            rows, advantages = [r for r, k in zip(rows, keep.tolist()) if k], advantages[keep]
        ce_weight = config.experimental.real_output_ce
        ce_rows = [r for g in groups for r in self.ce_rows.get(group_key(g[0]), [])] if ce_weight else []
        ce_tokens = distributed.reduce(float(sum(len(r.completion_ids) for r in ce_rows))) if ce_weight else 0.0
        tokens = fast.micro_tokens if fast.share_prefix else None
        chunks: list[_Chunk] = [_CEChunk([ce_rows[i] for i in part]) for part in
                                micro_batches(ce_rows, fast.micro_batch, tokens)]
        chunks += [_GRPOChunk([rows[i] for i in part], advantages[part])
                   for part in micro_batches(rows, fast.micro_batch, tokens)]
        self.engine.train()
        self.optimizer.zero_grad()
        # the same keys on every rank (their sums are all-reduced together), even on a rank with no rows
        sums = dict.fromkeys(("loss", "ce", "scored", *_scored_keys(config)), 0.0)
        for index, chunk in enumerate(chunks or [_NoWork()]):
            sync = self.world_size == 1 or index == max(len(chunks), 1) - 1  # DDP all-reduces on the last backward only
            with contextlib.nullcontext() if sync else self.engine.no_sync():
                if isinstance(chunk, _GRPOChunk):
                    self._grpo_backward(chunk, sums, total_tokens=total_tokens, total_rows=total_rows, longest=longest)
                elif isinstance(chunk, _CEChunk):
                    self._ce_backward(chunk, sums, ce_tokens)
                else:
                    dummy = torch.tensor([[self.pad_id, self.pad_id]], device=distributed.device())
                    (self.engine(input_ids=dummy, logits_to_keep=1).logits.sum() * 0.0).backward()
                after_backward(len(getattr(chunk, "rows", ())), fast.share_prefix)
        norm = torch.nn.utils.clip_grad_norm_(self.params, config.max_grad_norm)
        self.optimizer.step()
        all_rows = [r for g in groups for r in g]
        rewards = {r.run_id: r.reward for r in all_rows}
        checked = [r.fidelity for r in all_rows if r.role == "rehearse" and r.fidelity is not None]
        f1 = {r.run_id: r.call_f1 for r in all_rows if r.call_f1 is not None}
        sums |= {"reward": sum(rewards.values()), "success": sum(v >= 1.0 for v in rewards.values()),
                 "runs": len(rewards), "fidelity": sum(checked), "checked": len(checked),
                 "call_f1": sum(f1.values()), "f1_runs": len(f1)}
        sums = distributed.reduce_all(sums)  # the whole step's sums, one all-reduce
        record = {"loss": sums["loss"], "grad_norm": float(norm), "reward": sums["reward"] / sums["runs"],
                  "success": sums["success"] / sums["runs"], "segments": total_rows, "tokens": total_tokens,
                  "scored_tokens": sums["scored"]}
        if sums["scored"]:  # over the tokens that went through the model (none: every advantage was 0)
            record |= {k: sums[k] / sums["scored"] for k in _scored_keys(config)}
        if sums["checked"]:  # rehearsals checked against real results (mixed / real mode)
            record["fidelity"] = sums["fidelity"] / sums["checked"]
        if sums["f1_runs"]:  # runs of tasks with reference calls
            record["call_f1"] = sums["call_f1"] / sums["f1_runs"]
        if ce_weight:
            record["ce"] = sums["ce"]
        return record

    def _grpo_backward(self, chunk: _GRPOChunk, sums: dict[str, float], *, total_tokens: float, total_rows: float,
                       longest: float) -> None:
        config = self.config
        batch = collate(chunk.rows, self.pad_id, share_prefix=config.performance.share_prefix).to(distributed.device())
        device = batch.input_ids.device.type
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast_bf16(config.performance.bf16, device)):
            logp = batch_logprobs(self.engine, batch)  # [B, T]
            ref_logp = self.reference_logprobs(batch) if config.beta else None  # [B, T]
        loss, metrics = grpo_loss(logp, batch.old_logprobs, chunk.advantages.to(logp.device), batch.completion_mask,
                                  epsilon=config.epsilon, epsilon_high=config.epsilon_high, beta=config.beta,
                                  ref_logp=ref_logp, loss_type="dapo" if config.loss_type == "token_mean" else config.loss_type,
                                  num_items_in_batch=total_tokens, max_completion_length=int(longest),
                                  tis_cap=config.tis_cap if config.rollout_server else None)
        # token_mean over the whole step = sum over micro-batches of (sum / all tokens of the step)
        scale = 1.0 if config.loss_type in ("token_mean", "dapo") else len(chunk.rows) / total_rows
        (loss * scale * self.world_size).backward()  # DDP averages over ranks; we want the sum
        for key in _scored_keys(config):
            sums[key] += metrics[key] * metrics["tokens"]
        sums["scored"] += metrics["tokens"]
        sums["loss"] += float(loss.detach()) * scale

    def _ce_backward(self, chunk: _CEChunk, sums: dict[str, float], ce_tokens: float) -> None:
        config = self.config
        share = sum(len(r.completion_ids) for r in chunk.rows) / ce_tokens
        ce = sft_loss(self.engine, chunk.rows, self.pad_id, share_prefix=config.performance.share_prefix,
                      bf16=config.performance.bf16)
        (ce * share * config.experimental.real_output_ce * self.world_size).backward()
        sums["ce"] += float(ce.detach()) * share


def _scored_keys(config: Any) -> tuple[str, ...]:
    """Per-token metrics averaged over the step's scored tokens (the mismatch ones with rollouts on a server)."""
    keys = ("ratio_mean", "clip_low", "clip_high", "kl")
    return (*keys, "mismatch_abs", "mismatch_kl", "tis_truncated") if config.rollout_server else keys

"""Offline EnvACE GRPO: updates from recorded runs on disk, with checkpoints that resume bit-for-bit.

Groups are the traces' `group_id` (one task's K runs); the recorded sampling logprobs are the old
logprobs; each step takes `groups_per_step` groups in a seeded order, computes role-wise advantages
(or standard trajectory-level ones), and makes one optimizer step over all their segments
(micro-batched). Metrics go to `metrics.jsonl` per step, a PNG plot sits next to the checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from envace_mcp.errors import UserError
from envace_mcp.traces import TraceStore
from envace_mcp.train import distributed
from envace_mcp.train.grpo import _std, grpo_loss, role_advantages, trajectory_advantages
from envace_mcp.train.sft import sft_loss
from envace_mcp.train.rows import (
    ROLE_INDEX,
    Segment,
    after_backward,
    batch_logprobs,
    cap_heap_blocks,
    collate,
    prefix_order,
    prepare_for_training,
    segments,
)


class GRPOConfig(BaseModel):
    """One config file for GRPO (JSON). Every default says why."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    """Hugging Face id or folder; None = the embedded SmolLM2 (what the traces were recorded with)."""
    adapter: str | None = None
    """Start from this LoRA adapter (e.g. the SFT warm start)."""
    lora: bool = True
    """Train a LoRA adapter: small to ship, and the base stays a shared reference."""
    lora_r: int = 16
    lora_alpha: int = 32
    lr: float = 1e-5
    """EnvACE used 1e-6 for full fine-tuning of 8B; LoRA on small models needs more."""
    epsilon: float = 0.2
    """EnvACE's clip range."""
    epsilon_high: float | None = None
    """DAPO's asymmetric upper clip; None = symmetric."""
    beta: float = 0.0
    """KL off, as EnvACE (1e-4 when on); β = 0 needs no reference forward pass. With β > 0 each micro-batch
    also runs the reference: the base model with the adapter disabled (LoRA, as TRL with peft: no second
    copy), or a frozen copy of the starting weights (full fine-tune)."""
    skip_zero_advantage: bool = True
    """With β = 0, segments whose advantage is exactly 0 (a group whose runs all scored alike) add exactly
    0 to the loss and the gradient: the step leaves them out of the forward/backward passes (same update,
    same loss; ratio/clip metrics then cover the scored tokens). After SFT on the bank suite most groups are
    like that: 7 of 8 in a 2-step act-only online run, whose second update spent 13 min on a zero gradient."""
    loss_type: Literal["token_mean", "sequence_mean", "dr_grpo", "dapo"] = "token_mean"
    """EnvACE aggregates by token mean. Two deliberate differences from TRL's same-named losses:
    `token_mean` divides by every completion token of the *step* (all micro-batches and ranks: one step's
    loss does not depend on how it is cut), where TRL's `bnpo` divides per micro-batch (equal with one
    micro-batch per step); `dr_grpo` divides by B x the step's *longest* completion, where TRL divides by
    its configured `max_completion_length` (equal when a completion reaches that limit)."""
    scale_rewards: Literal["none", "group", "batch"] = "none"
    """EnvACE divides by no std."""
    advantage: Literal["role", "trajectory"] = "role"
    """"role": EnvACE's per-(task, role) baselines over segments (a longer run weighs more);
    "trajectory": standard GRPO, the baseline is the mean over the group's runs, each counted once."""
    roles: list[str] = Field(default_factory=lambda: ["act", "rehearse"])
    """Which roles carry loss; ["act"] is the act-only GRPO ablation."""
    reward: str = "task"
    """The reward name read from the traces."""
    steps: int = 10
    groups_per_step: int = 4
    """EnvACE: 16 tasks x 4 rollouts per step on 16 GPUs; 4 groups fit a CPU."""
    micro_batch: int = 4
    """Segments per forward pass (gradient accumulation inside one step); with `share_prefix` a
    group's runs, in prompt order, share their system prompt, tools, task and early turns."""
    max_grad_norm: float = 1.0
    """EnvACE's grad clip."""
    seed: int = 0
    checkpoint_every: int = 5
    fidelity_weight: float = 0.0
    """Beyond EnvACE (off): a rehearsal whose call really ran (mixed / real mode) is rewarded
    task reward + w x its match score against the real result, so the world model is pushed
    towards what happened; rehearsals without a real result keep the task reward."""
    real_output_ce: float = 0.0
    """Beyond EnvACE (off): weight of a cross-entropy term teaching the rehearse role the recorded
    real tool outputs (as SFT does), added to the GRPO loss (mean over those target tokens)."""
    share_prefix: bool = True
    """Micro-batches packed into one sequence with their common prompt prefix once (exact: the same
    gradients for fewer tokens); CPU models attend the parts separately (no N×N mask). Online GRPO
    step on the embedded model (`benchmarks/grpo_memory.py --steps 1`): update 69 s and 2.96 GB peak
    vs 174 s and 3.10 GB one segment at a time; TRL-shaped groups (`benchmarks/grpo_vs_trl.py`):
    5.90x TRL's update vs 1.86x unpacked."""
    gradient_checkpointing: bool = True
    """Tool-schema prompts are ~2k tokens: without it SmolLM2 holds ~2 MB of activations per token."""
    bf16: bool = False
    """bf16 autocast for the update's forward pass (faster on AMX CPUs / GPUs; ratios then carry bf16 noise)."""
    mmap_threshold_mb: float | None = 1.0
    """Allocations of this size or more get their own mmap, handed back when freed (`rows.cap_heap_blocks`;
    glibc only, process-wide). Online GRPO from the shipped bank adapter (runs of up to 12 calls) peaked
    at 7.0 GB in rollouts and 6.6 GB in the update with glibc's default; the packed passes' freed heap
    blocks were most of it. None: glibc's default (faster passes, more memory)."""
    rollout_prefix_cache_tokens: int = 16384
    """Online GRPO: the rollout policy's prefix cache (prompt keys/values kept for reuse; 46 KB a token for
    the embedded model in fp32: 0.75 GB). Inference keeps 32,768; in training it sits next to the decode
    batch and the weights, and each step starts it empty anyway."""
    rollout_kv_gb: float | Literal["auto"] | None = "auto"
    """Online GRPO: the rollout policy's `kv_budget_gb` (decode-batch keys/values); "auto": 1 GB on CPU, no
    limit on accelerators. Long runs in fp32 are 46 KB a token for the embedded model: 16 rows of ~3.6k
    columns would be 2.6 GB."""


def _rollout_kv_gb(setting: float | str | None, model: Any) -> float | None:
    if setting == "auto":
        return 1.0 if next(model.parameters()).device.type == "cpu" else None
    return setting  # type: ignore[return-value]


def _group_key(row: Segment) -> str:
    return row.group_id or row.task_id or row.run_id


def _groups(rows: list[Segment]) -> list[list[Segment]]:
    grouped: dict[str, list[Segment]] = defaultdict(list)
    for row in rows:
        grouped[_group_key(row)].append(row)
    return [grouped[k] for k in sorted(grouped)]


def step_advantages(groups: list[list[Segment]], config: GRPOConfig) -> torch.Tensor:  # [S]
    """Advantages of every segment of a step's groups (in order): role-wise or trajectory baselines
    inside each group; "batch" std scaling over every segment of the step on every rank."""
    rows = [r for g in groups for r in g]
    if not rows:
        return torch.zeros(0)
    rewards = torch.tensor([float(r.reward) + (config.fidelity_weight * r.fidelity
                                               if r.role == "rehearse" and r.fidelity is not None else 0.0)
                            for r in rows])  # [S]
    group_index = torch.tensor([i for i, g in enumerate(groups) for _ in g])  # [S]
    scale = config.scale_rewards
    if config.advantage == "role":
        roles = torch.tensor([ROLE_INDEX[r.role] for r in rows])  # [S]
        advantages = role_advantages(rewards, group_index, roles, scale="none" if scale == "batch" else scale)
    else:
        run_ids = {run: i for i, run in enumerate(dict.fromkeys(r.run_id for r in rows))}
        runs = torch.tensor([run_ids[r.run_id] for r in rows])  # [S]
        advantages = trajectory_advantages(rewards, group_index, runs, scale="none" if scale == "batch" else scale)
    if scale == "batch":
        everything = torch.tensor(distributed.gather(rewards.tolist()))  # the global step's segments
        advantages = advantages / (_std(everything) + 1e-4)
    return advantages


class OfflineGRPO:
    """GRPO from recorded traces. `run()` trains to `config.steps`, resuming from `out` if it holds a checkpoint."""

    def __init__(self, config: GRPOConfig, traces: str | Path | None, out: str | Path, *, model: Any = None,
                 tokenizer: Any = None) -> None:
        self.config = config
        self.rank, self.world_size = distributed.setup()
        self.ce_rows: dict[str, list[Segment]] = defaultdict(list)
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        if model is None:
            from envace_mcp.engine.model import load_model

            model, tokenizer = load_model(config.model, adapter=config.adapter, dtype="auto", trainable=True)
        self.tokenizer = tokenizer
        self.groups = self.trainable_groups(TraceStore(traces).read()) if traces is not None else []
        if traces is not None and not self.groups:
            raise UserError(f"no trainable groups in {traces}: need runs with tokens, logprobs and a "
                            f"'{config.reward}' reward")
        self.pad_id = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
        if config.adapter:
            if not _is_peft(model):  # (`load_model` above loads it)
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, config.adapter, is_trainable=True)
        elif config.lora:
            from peft import LoraConfig, get_peft_model

            torch.manual_seed(config.seed)
            model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, task_type="CAUSAL_LM",
                                                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        self.model = model.to(distributed.device())
        prepare_for_training(model, config.gradient_checkpointing)
        self.reference: Any = None
        """A frozen copy of the starting weights, for β > 0 without LoRA (with LoRA the reference is the
        model with its adapter disabled). Copied once the model is prepared, so it attends packed rows the
        same way."""
        if config.beta and not hasattr(model, "disable_adapter"):
            import copy

            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        cap_heap_blocks(config.mmap_threshold_mb)
        self.engine = distributed.wrap(self.model)
        """What forward/backward go through: DDP around the model under torchrun, the model itself otherwise."""
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr)
        self.step = 0
        self.rng = random.Random(config.seed)
        self.order: list[int] = []

    def trainable_groups(self, traces: Any) -> list[list[Segment]]:
        traces = list(traces)
        rows = [r for r in segments(traces, reward=self.config.reward) if r.role in self.config.roles]
        if self.config.real_output_ce > 0:
            self._add_ce_rows(traces)
        return _groups([r for r in rows if r.old_logprobs is not None])

    def _add_ce_rows(self, traces: list[Any]) -> None:
        """Rehearse prompts with the recorded real results as targets, by group (for `real_output_ce`)."""
        from envace_mcp.train.sft import sft_rows, target_encoding

        encode, end = target_encoding(self.tokenizer)
        for row in sft_rows(traces, encode, end, roles=("rehearse",), reward=self.config.reward):
            self.ce_rows[_group_key(row)].append(row)

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_dir(self) -> Path:
        return self.out / "checkpoint"

    def save(self) -> None:
        if self.rank != 0:
            return
        folder = self._checkpoint_dir()
        folder.mkdir(parents=True, exist_ok=True)
        trainable = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        torch.save({"step": self.step, "params": trainable, "optimizer": self.optimizer.state_dict(),
                    "rng": self.rng.getstate(), "torch_rng": torch.get_rng_state(), "order": self.order,
                    "config": self.config.model_dump()}, folder / "state.pt.tmp")
        (folder / "state.pt.tmp").replace(folder / "state.pt")
        self.model.save_pretrained(folder / "model")

    def load(self) -> bool:
        path = self._checkpoint_dir() / "state.pt"
        if not path.exists():
            return False
        state = torch.load(path, weights_only=False, map_location="cpu")
        named = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state["params"].items():
                named[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        self.step, self.order = state["step"], state["order"]
        self._trim_metrics()
        return True

    def _trim_metrics(self) -> None:
        """Forget metrics of steps after the checkpoint (a killed run logged them; they are redone) and a
        line torn by the kill, so a resumed run's metrics.jsonl has each step once."""
        path = self.out / "metrics.jsonl"
        if self.rank != 0 or not path.exists():
            return
        kept = []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("step", 0) <= self.step:
                kept.append(line)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)

    # ------------------------------------------------------------------ training

    def _next_indices(self, available: int) -> list[int]:
        """The next `groups_per_step` indices of a seeded shuffle that is redrawn when used up
        (the order and RNG are checkpointed, so a resumed run sees the same data)."""
        picked = []
        for _ in range(min(self.config.groups_per_step, available)):
            if not self.order:
                self.order = list(range(available))
                self.rng.shuffle(self.order)
            picked.append(self.order.pop())
        return picked

    def _next_groups(self) -> list[list[Segment]]:
        return [self.groups[i] for i in self._next_indices(len(self.groups))]

    def train_step(self) -> dict[str, float]:
        return self.update(self._next_groups()[self.rank::self.world_size])

    def _log(self, record: dict[str, float]) -> None:
        if self.rank == 0:
            with open(self.out / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")

    def reference_logprobs(self, batch: Any) -> torch.Tensor:  # [B, T]
        """The reference policy's log-probs of a batch's completion tokens (for the β·KL term), no grad."""
        with torch.no_grad():
            if self.reference is not None:
                return batch_logprobs(self.reference, batch)
            with self.model.disable_adapter():
                return batch_logprobs(self.model, batch)

    def update(self, groups: list[list[Segment]]) -> dict[str, float]:
        """One optimizer step over the segments of `groups` (this rank's share of the step's groups
        under torchrun; all of them otherwise), with role-wise or trajectory advantages."""
        config = self.config
        rows = [r for g in groups for r in g]
        advantages = step_advantages(groups, config)  # [S]
        if config.share_prefix and rows:  # the step's loss is a sum over all its segments, so order is free
            order = prefix_order(rows)
            rows, advantages = [rows[i] for i in order], advantages[order]
        # normalisers over the whole step, on every rank
        total_tokens = distributed.reduce(float(sum(len(r.completion_ids) for r in rows)))
        total_rows = distributed.reduce(float(len(rows)))
        longest = distributed.reduce(float(max((len(r.completion_ids) for r in rows), default=0)), "max")
        if total_rows == 0:  # nothing generated with tokens (e.g. a chat-model policy): log and move on
            self.step += 1
            record = {"step": self.step, "loss": 0.0, "segments": 0, "tokens": 0.0}
            self._log(record)
            return record
        scored, scored_adv = rows, advantages
        if config.beta == 0 and config.skip_zero_advantage:  # without KL: exactly 0 loss and gradient
            keep = advantages != 0  # [S]
            scored, scored_adv = [r for r, k in zip(rows, keep.tolist()) if k], advantages[keep]
        self.engine.train()
        self.optimizer.zero_grad()
        # the same keys on every rank (their sums are all-reduced together), even on a rank with no rows
        sums = dict.fromkeys(("loss", "ce", "ratio_mean", "clip_low", "clip_high", "kl", "scored"), 0.0)
        ce_rows = [r for g in groups for r in self.ce_rows.get(_group_key(g[0]), [])] if config.real_output_ce else []
        ce_tokens = distributed.reduce(float(sum(len(r.completion_ids) for r in ce_rows))) if config.real_output_ce else 0.0
        jobs: list[tuple[str, int]] = [("ce", s) for s in range(0, len(ce_rows), config.micro_batch)]
        jobs += [("grpo", s) for s in range(0, len(scored), config.micro_batch)]
        for index, (kind, start) in enumerate(jobs or [("none", 0)]):
            sync = self.world_size == 1 or index == max(len(jobs), 1) - 1  # DDP all-reduces on the last backward only
            with contextlib.nullcontext() if sync else self.engine.no_sync():
                if kind == "none":  # a rank with nothing this step still joins the all-reduce, with zero gradients
                    dummy = torch.tensor([[self.pad_id, self.pad_id]], device=distributed.device())
                    (self.engine(input_ids=dummy, logits_to_keep=1).logits.sum() * 0.0).backward()
                elif kind == "ce":
                    chunk = ce_rows[start:start + config.micro_batch]
                    share = sum(len(r.completion_ids) for r in chunk) / ce_tokens
                    ce = sft_loss(self.engine, chunk, self.pad_id, share_prefix=config.share_prefix, bf16=config.bf16)
                    (ce * share * config.real_output_ce * self.world_size).backward()
                    sums["ce"] += float(ce.detach()) * share
                else:
                    chunk, adv = scored[start:start + config.micro_batch], scored_adv[start:start + config.micro_batch]
                    batch = collate(chunk, self.pad_id, share_prefix=config.share_prefix).to(distributed.device())
                    with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=config.bf16):
                        logp = batch_logprobs(self.engine, batch)
                        ref_logp = self.reference_logprobs(batch) if config.beta else None
                    loss, metrics = grpo_loss(logp, batch.old_logprobs, adv.to(logp.device), batch.completion_mask,
                                              epsilon=config.epsilon, epsilon_high=config.epsilon_high,
                                              beta=config.beta, ref_logp=ref_logp,
                                              loss_type="dapo" if config.loss_type == "token_mean" else config.loss_type,
                                              num_items_in_batch=total_tokens, max_completion_length=int(longest))
                    # token_mean over the whole step = sum over micro-batches of (sum / all tokens of the step)
                    scale = 1.0 if config.loss_type in ("token_mean", "dapo") else len(chunk) / total_rows
                    (loss * scale * self.world_size).backward()  # DDP averages over ranks; we want the sum
                    for key in ("ratio_mean", "clip_low", "clip_high", "kl"):
                        sums[key] += metrics[key] * metrics["tokens"]
                    sums["scored"] += metrics["tokens"]
                    sums["loss"] += float(loss.detach()) * scale
                after_backward(config.micro_batch, config.share_prefix)
        norm = torch.nn.utils.clip_grad_norm_(self.params, config.max_grad_norm)
        self.optimizer.step()
        self.step += 1
        rewards = {r.run_id: r.reward for r in rows}
        checked = [r.fidelity for r in rows if r.role == "rehearse" and r.fidelity is not None]
        sums |= {"reward": sum(rewards.values()), "success": sum(v >= 1.0 for v in rewards.values()),
                 "runs": len(rewards), "fidelity": sum(checked), "checked": len(checked)}
        sums = distributed.reduce_all(sums)  # the whole step's sums, one all-reduce
        record = {"step": self.step, "loss": sums["loss"], "grad_norm": float(norm),
                  "reward": sums["reward"] / sums["runs"], "success": sums["success"] / sums["runs"],
                  "segments": total_rows, "tokens": total_tokens, "scored_tokens": sums["scored"]}
        if sums["scored"]:  # over the tokens that went through the model (none: every advantage was 0)
            record |= {k: sums[k] / sums["scored"] for k in ("ratio_mean", "clip_low", "clip_high", "kl")}
        if sums["checked"]:  # rehearsals checked against real results (mixed / real mode)
            record["fidelity"] = sums["fidelity"] / sums["checked"]
        if config.real_output_ce:
            record["ce"] = sums["ce"]
        self._log(record)
        return record

    def run(self, progress: bool = False) -> list[dict[str, float]]:
        self.out.mkdir(parents=True, exist_ok=True)
        self.load()
        records = []
        from envace_mcp._progress import Progress

        with contextlib.ExitStack() as stack:
            bar = (stack.enter_context(Progress("GRPO", total=self.config.steps, completed=self.step))
                   if progress and self.rank == 0 else None)
            while self.step < self.config.steps:
                records.append(self.train_step())
                if bar is not None:
                    bar.update(completed=self.step, loss=round(records[-1]["loss"], 4),
                               reward=round(records[-1]["reward"], 3))
                if self.step % self.config.checkpoint_every == 0 or self.step == self.config.steps:
                    self.save()
        if self.rank == 0:
            plot_metrics(self.out / "metrics.jsonl", self.out / "metrics.png")
        distributed.barrier()
        return records


def plot_metrics(metrics: Path, png: Path) -> Path | None:
    """Reward, loss, KL, clip fraction and success over steps (needs matplotlib; skipped without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if not rows:
        return None
    keys = [("reward", "mean task reward"), ("success", "success rate"), ("loss", "loss"), ("kl", "KL (k3)"),
            ("fidelity", "rehearsal fidelity (real calls)"), ("clip_high", "clipped fraction (high)"),
            ("grad_norm", "grad norm"), ("ce", "real-output CE")]
    fig, axes = plt.subplots(2, 4, figsize=(15, 6))
    for ax, (key, title) in zip(axes.flat, keys):
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points), marker=".")
        else:
            ax.text(0.5, 0.5, "not measured\n(simulated mode / off)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return png


class OnlineGRPO(OfflineGRPO):
    """GRPO on fresh rollouts: each step runs K graph runs for each of `groups_per_step` tasks with
    the weights being trained (batched through one `TransformersPolicy`), records and scores them,
    then updates. Traces of every step are kept under `out/traces`."""

    def __init__(self, config: GRPOConfig, suite: Any, out: str | Path, *, k: int = 4, mode: str = "simulated",
                 tools: list[Any] | None = None, gate: Any = None, sampling: dict[str, Any] | None = None,
                 split: str = "train", **kwargs: Any) -> None:
        super().__init__(config, None, out, **kwargs)
        from envace_mcp.policy.transformers import TransformersPolicy

        self.suite, self.k, self.mode, self.tools, self.gate = suite, k, mode, tools, gate
        self.sampling = sampling or {}
        self.tasks = suite.split(split)
        self.policy = TransformersPolicy(self.model, self.tokenizer, name=f"{config.model or 'embedded'} (training)",
                                         max_batch_size=max(16, k),
                                         kv_budget_gb=_rollout_kv_gb(config.rollout_kv_gb, self.model),
                                         prefix_cache_tokens=config.rollout_prefix_cache_tokens)

    def train_step(self) -> dict[str, float]:
        import anyio

        from envace_mcp.train.rollouts import rollout_group

        picked = [self.tasks[i] for i in self._next_indices(len(self.tasks))][self.rank::self.world_size]
        self.model.eval()

        async def collect() -> list[Any]:
            async with contextlib.AsyncExitStack() as stack:
                toolbox = None
                if self.mode != "simulated":  # real / mixed: the suite's server, in process, one episode per run
                    from envace_mcp.toolbox import Toolbox

                    toolbox = await stack.enter_async_context(Toolbox({self.suite.name: self.suite.build_server()}))
                runs = await asyncio.gather(*(rollout_group(self.suite, task, self.policy, k=self.k, mode=self.mode,
                                                            toolbox=toolbox, tools=self.tools, gate=self.gate,
                                                            sampling=self.sampling,
                                                            group_id=f"step{self.step + 1}:{task.id}") for task in picked))
            return [t for group in runs for t in group]

        traces = anyio.run(collect)  # train_step is synchronous; rollouts run on their own event loop
        backend = getattr(self.policy, "base", self.policy)  # a wrapper (e.g. ForcedPolicy) or the policy itself
        # the update changes the weights: the engine's cached keys/values are freed now, so the update's
        # activations never sit next to them (peak memory)
        backend.engine.weights_changed()
        self.ce_rows.clear()  # real-output CE rows of this step's groups only
        store = TraceStore(self.out / "traces")
        for trace in traces:
            store.append(trace)
        return self.update(self.trainable_groups(traces))


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config")

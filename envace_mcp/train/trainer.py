"""EnvACE GRPO trainers: one learner fed by recorded runs (offline) or fresh rollouts (online).

Groups are one task's K runs; the recorded sampling logprobs are the old logprobs. Each step takes
`groups_per_step` groups (or tasks) in a seeded order, computes role-wise advantages (or standard
trajectory-level ones) and makes one optimizer step over all their segments, micro-batched
(`envace_mcp.train.learner`). Metrics go to `metrics.jsonl` per step and a PNG plot next to the
checkpoints, which resume bit-for-bit.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace_mcp._progress import Progress
from envace_mcp.train import distributed
from envace_mcp.train.advantages import step_advantages
from envace_mcp.train.checkpoints import Checkpoints
from envace_mcp.train.config import GRPOConfig
from envace_mcp.train.learner import GRPOLearner
from envace_mcp.train.metrics import MetricsLog, plot_metrics
from envace_mcp.train.rows import Segment
from envace_mcp.train.sources import RolloutGroups, SeededOrder, TraceGroups

if TYPE_CHECKING:
    from envace_mcp.graph.gate import GateConfig, RunLimits
    from envace_mcp.policy.base import Policy

__all__ = ["GRPOConfig", "GRPOTrainer", "OfflineGRPO", "OnlineGRPO", "step_advantages", "plot_metrics"]


class GRPOTrainer:
    """Steps a `GRPOLearner` on the groups a source hands it. `run()` trains to `config.steps`, resuming
    from `out` if it holds a checkpoint."""

    def __init__(self, config: GRPOConfig, learner: GRPOLearner, source: Any, out: str | Path) -> None:
        self.config, self.learner, self.source = config, learner, source
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.order = SeededOrder(config.seed)
        self.metrics = MetricsLog(self.out / "metrics.jsonl", learner.rank)
        self.checkpoints = Checkpoints(self.out / "checkpoint", learner.rank)

    # the learner's parts, as a trainer's user reaches for them
    @property
    def model(self) -> Any:
        return self.learner.model

    @property
    def reference(self) -> Any:
        return self.learner.reference

    @property
    def pad_id(self) -> int:
        return self.learner.pad_id

    def update(self, groups: list[list[Segment]], extra: dict[str, float] | None = None) -> dict[str, float]:
        """One optimizer step over `groups`, logged as the next step (with the source's `extra` figures
        and `update_s`, its seconds)."""
        started = time.perf_counter()
        record = self.learner.update(groups)
        self.step += 1
        record = {"step": self.step, **record, **(extra or {}), "update_s": time.perf_counter() - started}
        self.metrics.append(record)
        return record

    def train_step(self) -> dict[str, float]:
        """One step; its record adds `rollout_s` (getting the groups: rollouts online, reading traces
        offline) and `update_s` (scoring and the optimizer step), the cost a step's budget goes to."""
        started = time.perf_counter()
        groups = self.source.next(self.order, self.config, self.step)
        stats = getattr(self.source, "stats", None) or {}
        return self.update(groups, {**stats, "rollout_s": time.perf_counter() - started})

    def save(self) -> None:
        self.checkpoints.save(**self._checkpoint())

    def _checkpoint(self) -> dict[str, Any]:
        """What a checkpoint holds, as `Checkpoints.save` and `Checkpoints.snapshot` take it."""
        return {"step": self.step, "model": self.model, "optimizer": self.learner.optimizer,
                "order": self.order.state(), "config": self.config.model_dump()}

    def load(self) -> bool:
        state = self.checkpoints.load(model=self.model, optimizer=self.learner.optimizer)
        if state is None:
            return False
        self.step = state["step"]
        self.order.restore(state["order"])
        self.metrics.trim(self.step)
        return True

    def run(self, progress: bool = False) -> list[dict[str, float]]:
        """Train to `config.steps`. Interrupted (Ctrl-C, or SIGTERM under `envace train`) between
        checkpoints, a single-process LoRA run first writes the last *completed* step as its checkpoint
        (the state it had right after that step, so resuming stays bit-for-bit), then stops."""
        self.load()
        records = []
        snapshot = None
        with contextlib.ExitStack() as stack:
            bar = (stack.enter_context(Progress("GRPO", total=self.config.steps, completed=self.step))
                   if progress and self.learner.rank == 0 else None)
            try:
                while self.step < self.config.steps:
                    records.append(self.train_step())
                    if bar is not None:
                        shown = {"loss": 4, "reward": 3}
                        bar.update(completed=self.step, **{k: round(records[-1][k], n) for k, n in shown.items()
                                                           if k in records[-1]})
                    if self.step % self.config.checkpoint_every == 0 or self.step == self.config.steps:
                        self.save()
                        snapshot = None
                    elif self.config.lora and self.learner.world_size == 1:
                        snapshot = self.checkpoints.snapshot(**self._checkpoint())  # LoRA: a few MB
            except (KeyboardInterrupt, SystemExit):
                if snapshot is not None:
                    self.checkpoints.save_snapshot(snapshot, model=self.model, optimizer=self.learner.optimizer)
                raise
        if self.learner.rank == 0:
            plot_metrics(self.out / "metrics.jsonl", self.out / "metrics.png")
        distributed.barrier()
        return records

class OfflineGRPO(GRPOTrainer):
    """GRPO from recorded traces (a folder or file the `TraceStore` reads)."""

    def __init__(self, config: GRPOConfig, traces: str | Path, out: str | Path, *, model: Any = None,
                 tokenizer: Any = None, runs: list[Any] | None = None) -> None:
        learner = GRPOLearner(config, model=model, tokenizer=tokenizer)
        super().__init__(config, learner, TraceGroups(traces, learner, runs=runs), out)

    @property
    def groups(self) -> list[list[Segment]]:
        return self.source.groups

    def _next_groups(self) -> list[list[Segment]]:
        return self.source.pick(self.order, self.config)


class OnlineGRPO(GRPOTrainer):
    """GRPO on fresh rollouts: each step runs K graph runs for each of `groups_per_step` tasks of
    `config.split` with the weights being trained (under `gate` and run `limits`; None: their defaults),
    records and scores them, then updates. Traces of every step are kept under `out/traces`."""

    def __init__(self, config: GRPOConfig, suite: Any, out: str | Path, *, k: int = 4, mode: str = "real",
                 tools: list[Any] | None = None, gate: GateConfig | None = None,
                 limits: RunLimits | None = None,
                 sampling: dict[str, Any] | None = None, model: Any = None, tokenizer: Any = None) -> None:
        learner = GRPOLearner(config, model=model, tokenizer=tokenizer)
        super().__init__(config, learner, RolloutGroups(learner, suite, Path(out), k=k, mode=mode, tools=tools, gate=gate,
                                                        limits=limits, sampling=sampling), out)

    @property
    def policy(self) -> Any:
        """The rollout policy (replaceable, e.g. by a `ForcedPolicy` around it)."""
        return self.source.policy

    @policy.setter
    def policy(self, value: Policy) -> None:
        self.source.policy = value

"""Where a GRPO step's groups come from: recorded traces (offline) or fresh rollouts (online).

Both pick tasks or groups in a seeded order that is checkpointed with the trainer (`SeededOrder`), so a
resumed run sees the same data.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace_mcp.envs.suites import tasks_of_kinds
from envace_mcp.errors import UserError
from envace_mcp.policy import SamplingParams
from envace_mcp.policy.tool_text import adapter_formats
from envace_mcp.policy.transformers import TransformersPolicy
from envace_mcp.policy.types import role_sampling
from envace_mcp.policy.vllm import PREFIX, VLLMPolicy
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import Trace, TraceStore
from envace_mcp.train.advantages import group_key, groups_of, step_advantages
from envace_mcp.train.config import (
    GRPOConfig,
    check_rollout_mode,
    refuse_unshaped,
    refuse_untrainable_act,
    rollout_kv_gb,
)
from envace_mcp.train.learner import GRPOLearner
from envace_mcp.train.rows import Segment, segments
from envace_mcp.train.sft import sft_rows, target_encoding

if TYPE_CHECKING:
    from envace_mcp.graph.gate import GateConfig, RunLimits


class SeededOrder:
    """The next `n` indices of a seeded shuffle that is redrawn when used up."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def take(self, n: int, available: int) -> list[int]:
        picked = []
        for _ in range(min(n, available)):
            if not self.order:
                self.order = list(range(available))
                self.rng.shuffle(self.order)
            picked.append(self.order.pop())
        return picked

    def state(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "order": self.order}

    def restore(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.order = state["order"]


def trainable_groups(traces: Iterable[Trace], learner: GRPOLearner) -> list[list[Segment]]:
    """The traces' segments of the trained roles that carry sampling logprobs, by group; with
    `real_output_ce`, the rehearse prompts' real-result targets go to the learner too."""
    config = learner.config
    traces = list(traces)
    refuse_unshaped(traces, config)
    rows = [r for r in segments(traces, reward=config.reward) if r.role in config.roles]
    if config.experimental.real_output_ce > 0:
        encode, end = target_encoding(learner.tokenizer)
        for row in sft_rows(traces, encode, end, roles=("rehearse",), reward=config.reward):
            learner.ce_rows[group_key(row)].append(row)
    return groups_of([r for r in rows if r.old_logprobs is not None])


def has_signal(group: list[Segment], config: GRPOConfig) -> bool:
    """Whether a group's segments carry any non-zero advantage (runs that scored alike carry none)."""
    return bool(group) and bool((step_advantages([group], config) != 0).any())


def rollout_sampling(config: GRPOConfig) -> dict[str, Any]:
    """How online rollouts sample each role: `max_new_tokens` (the rehearse role `rehearse_max_new_tokens`),
    at EnvACE's temperature 1.0 and with no fixed seed, so a group's K runs differ."""
    roles = role_sampling(SamplingParams(max_new_tokens=config.max_new_tokens, temperature=1.0),
                          config.rehearse_max_new_tokens)
    return {"act": roles["act"], "rehearse": roles["rehearse"]}  # critique keeps the policy's own sampling


class TraceGroups:
    """Groups of recorded runs (a trace's `group_id`: one task's K runs), `groups_per_step` at a time."""

    def __init__(self, traces: str | Path, learner: GRPOLearner, *, runs: list[Trace] | None = None) -> None:
        """`runs`: the folder's runs, already read (the CLI reads them to check them before the model loads)."""
        self.learner = learner
        runs = list(TraceStore(traces).read()) if runs is None else runs
        refuse_untrainable_act(runs, learner.config)
        self.groups = trainable_groups(runs, learner)
        if not self.groups:
            raise UserError(f"no trainable groups in {traces}: need runs with tokens, logprobs and a "
                            f"'{learner.config.reward}' reward")

    def pick(self, order: SeededOrder, config: GRPOConfig) -> list[list[Segment]]:
        """The step's groups, on every rank."""
        return [self.groups[i] for i in order.take(config.groups_per_step, len(self.groups))]

    def next(self, order: SeededOrder, config: GRPOConfig, step: int) -> list[list[Segment]]:
        """This rank's share of the step's groups."""
        return self.pick(order, config)[self.learner.rank::self.learner.world_size]


class RolloutGroups:
    """Fresh rollouts: K graph runs for each of `groups_per_step` tasks with the weights being trained
    (batched through one `TransformersPolicy` over the learner's model), recorded under `out/traces`
    and scored by the suite's checker."""

    def __init__(self, learner: GRPOLearner, suite: Any, out: Path, *, k: int = 4, mode: str = "real",
                 tools: list[Any] | None = None, gate: GateConfig | None = None,
                 limits: RunLimits | None = None,
                 sampling: dict[str, Any] | None = None) -> None:
        """`sampling` (per role): None samples as `config` says, at the policy's own temperature (EnvACE's
        1.0) and without a fixed seed, so a group's K runs differ."""
        config = learner.config
        if config.experimental.dynamic_sampling and learner.world_size > 1:
            raise UserError("dynamic_sampling draws replacement tasks on one process; under torchrun the ranks "
                            "would draw different ones (not done): set it to 0 or train in one process")
        check_rollout_mode(config, mode, gate)
        self.learner, self.suite, self.out = learner, suite, out
        self.k, self.mode, self.tools, self.gate, self.limits = k, mode, tools, gate, limits
        self.sampling = rollout_sampling(config) if sampling is None else sampling
        self.tasks = tasks_of_kinds(suite.split(config.split), config.experimental.kinds, config.split)
        formats = adapter_formats(config.adapter)  # prompts as the adapter learned them
        if config.rollout_server:
            if not config.lora or learner.world_size > 1:
                raise UserError("rollout_server: only a LoRA adapter trained in one process is synced to a server "
                                "(full-weight sync and torchrun with a server are not done)")
            address = config.rollout_server.removeprefix(PREFIX)
            self.policy: Any = VLLMPolicy.from_url(address, tokenizer=learner.tokenizer, **formats)
        else:
            self.policy = TransformersPolicy(learner.model, learner.tokenizer,
                                             name=f"{config.model or 'embedded'} (training)", max_batch_size=max(16, k),
                                             kv_budget_gb=rollout_kv_gb(config.performance.rollout_kv_gb, learner.model),
                                             prefix_cache_tokens=config.performance.rollout_prefix_cache_tokens,
                                             constrain_rehearsals=False,  # its logprobs must be the trainer's
                                             **formats)
        """The rollout policy (replaceable, e.g. by a `ForcedPolicy` around it)."""
        self.stats: dict[str, float] = {}
        """The last step's rollout figures (`uniform_groups`, `rolled_groups`), logged with its metrics."""
        self.served: str | None = None
        """With a rollout server: the adapter version it serves ("step-N", the weights after N steps)."""

    @property
    def backend(self) -> Any:
        """The policy that generates: `policy` itself, or the one inside a wrapper (e.g. `ForcedPolicy`)."""
        return getattr(self.policy, "base", self.policy)

    def serve(self, step: int) -> str:
        """Save the adapter being trained (after `step` steps) to `out/served/step-N` — a new folder each
        time: vLLM keeps prefix-cache blocks of an adapter reloaded from the same path — and hot-load it."""
        name = f"step-{step}"
        if self.served != name:
            folder = self.out / "served" / name
            self.learner.model.save_pretrained(folder)
            self.backend.load_adapter(folder, name=name)
            self.served = name
        return name

    def next(self, order: SeededOrder, config: GRPOConfig, step: int) -> list[list[Segment]]:
        """This step's groups: `groups_per_step` tasks rolled out K times; with `dynamic_sampling`, groups
        without signal are replaced by further rounds. `stats` then holds what the step rolled out."""
        learner = self.learner
        learner.model.eval()
        served = self.serve(step) if learner.config.rollout_server else None
        learner.ce_rows.clear()  # real-output CE rows of this step's groups only
        kept: list[list[Segment]] = []
        rolled = uniform = 0
        rounds = config.experimental.dynamic_sampling
        for round_ in range(rounds + 1):
            wanted = config.groups_per_step - len(kept)
            picked = [self.tasks[i] for i in order.take(wanted, len(self.tasks))]
            picked = picked[learner.rank::learner.world_size]
            if not picked:
                break
            groups = self._roll(picked, step, served, round_)
            signal = [g for g in groups if has_signal(g, config)]
            rolled += len(groups)
            uniform += len(groups) - len(signal)
            kept += signal if rounds else groups
            if not rounds or len(kept) >= config.groups_per_step:
                break
        if served is None:  # the update changes the weights: the engine's cached keys/values are freed now, so the
            self.backend.engine.weights_changed()  # update's activations never sit next to them (peak memory)
        self.stats = {"uniform_groups": uniform / max(rolled, 1), "rolled_groups": float(rolled)}
        return kept

    def _roll(self, tasks: list[Any], step: int, served: str | None, round_: int) -> list[list[Segment]]:
        import anyio

        traces = anyio.run(self._collect, tasks, step, round_)  # a step is synchronous; rollouts run on their own loop
        if served is not None:
            for trace in traces:
                trace.metadata["weights"] = served
        store = TraceStore(self.out / "traces")
        for trace in traces:
            store.append(trace)
        return trainable_groups(traces, self.learner)

    async def _collect(self, tasks: list[Any], step: int, round_: int = 0) -> list[Trace]:
        from envace_mcp.train.rollouts import rollout_group

        async with contextlib.AsyncExitStack() as stack:
            toolbox = None
            if self.mode != "simulated":  # real / mixed: the suite's server, in process, one episode per run
                toolbox = await stack.enter_async_context(Toolbox({self.suite.name: self.suite.build_server()}))
            runs = await asyncio.gather(*(rollout_group(self.suite, task, self.policy, k=self.k, mode=self.mode,
                                                        toolbox=toolbox, tools=self.tools, gate=self.gate, limits=self.limits,
                                                        sampling=self.sampling,
                                                        group_id=f"step{step + 1}:{task.id}" + (f":r{round_}" if round_ else ""))
                                          for task in tasks))
            closing = getattr(self.backend, "aclose", None)
            if closing is not None:  # a server's HTTP client belongs to this step's event loop
                await closing()
        return [t for group in runs for t in group]

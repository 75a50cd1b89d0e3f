"""Running the EnvACE graph on a suite task as one isolated episode, and scoring it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

from langchain_core.messages import AnyMessage, HumanMessage

from envace_mcp.envs.episode import EpisodeToolbox, TaskEpisode
from envace_mcp.envs.rewards import call_f1
from envace_mcp.envs.suites import TaskSuite
from envace_mcp.envs.task import CheckResult, Task
from envace_mcp.errors import UserError
from envace_mcp.graph import EnvaceContext, GateConfig, RunLimits, create_envace_graph
from envace_mcp.graph.gate import UNATTENDED, Mode, gate_for
from envace_mcp.graph.state import Approver
from envace_mcp.graph.tts import Attempt, condense, imagine
from envace_mcp.policy.base import Policy
from envace_mcp.policy.types import (
    ActOutput,
    ActRequest,
    Critique,
    CritiqueRequest,
    Generation,
    Prediction,
    RehearseRequest,
    Role,
    SamplingParams,
)
from envace_mcp.toolbox import ToolSpec
from envace_mcp.traces import Reward, Trace, TraceStore, record_run

G = TypeVar("G", bound=Generation[Any])

@dataclass
class TaskRun:
    """One run of a task: its episode (None where nothing ran on a server), the graph's final state, the
    checker's verdict, test-time rehearsal's imagined attempts, and the recorded trace."""

    task: Task
    episode: TaskEpisode | None
    state: dict[str, Any]
    verdict: CheckResult
    attempts: list[Attempt]
    trace: Trace | None = None


async def run_task(
    suite: TaskSuite,
    task: Task,
    *,
    policy: Policy,
    toolbox: EpisodeToolbox | None,
    mode: Mode = "real",
    gate: GateConfig | None = None,
    limits: RunLimits | None = None,
    rehearse_n: int = 0,
    strategy: Literal["parallel", "sequential"] = "parallel",
    on_update: Callable[[str, Any], None] | None = None,
    sampling: dict[Role, SamplingParams] | None = None,
    store: TraceStore | None = None,
    group_id: str | None = None,
    approve: Approver | None = None,
    tools: list[ToolSpec] | None = None,
) -> TaskRun:
    """Run the agent on `task` against `toolbox` (one fresh episode), then check the final state.

    With a `store`, the committed run is recorded (`envace_mcp.traces`) with the checker's score
    attached as the `task` reward, and its tool-call F1 against the task's reference calls as `call_f1`
    (`envs.rewards.call_f1`; GRPO's `call_f1_weight` shapes with it). `gate` None: the gate the policy
    starts from (`policy_gate`: GateConfig's defaults under its adapter's recommendation); `limits` None:
    `RunLimits()`. `approve` answers the gate's `ask` decisions (`EnvaceContext.approve`; `envace demo`
    asks on the terminal). Without one, nobody is there to ask: a suite's servers are sandboxes reset per
    episode, so the gate runs `UNATTENDED` (`require_approval="never"`; its other rules as given) —
    evaluation and training rollouts.
    Without a toolbox (simulated mode: `tools` are the catalog entries the agent sees) the run is scored
    by replaying its calls on the task's initial state (`score_replayed`)."""
    gate = gate_for(policy, gate)
    if approve is None:
        gate = gate.model_copy(update=UNATTENDED)
    episode = suite.episode(task)
    turns = [task.instruction, *getattr(task, "turns", ())]
    graph = create_envace_graph()
    compiled = graph.compile()
    fields = {"task_id": task.id, "suite": suite.name, "group_id": group_id,
              "rehearsal": {"n": rehearse_n, "strategy": strategy} if rehearse_n else {}}
    attempts: list[Attempt] = []
    turn_traces: list[Trace] = []
    messages: list[AnyMessage] = []
    state: dict[str, Any] = {}
    try:
        for turn, text in enumerate(turns):
            if hasattr(episode, "turn"):
                episode.turn = turn  # tools may appear in later turns (BFCL's missing functions)
            context = EnvaceContext(policy=policy, toolbox=episode.scope(toolbox) if toolbox is not None else None,
                                    tools=tools, gate=gate, limits=limits or RunLimits(), mode=mode,
                                    instructions=suite.instructions,
                                    sampling=sampling or {}, approve=approve)
            notes: dict[str, Any] = {}
            if rehearse_n > 0 and turn == 0:  # test-time rehearsal imagines the opening request
                counting = CountingPolicy(policy)
                attempts = await imagine(graph, text, replace(context, policy=counting),
                                         n=rehearse_n, strategy=strategy)
                notes = {"notes": condense(attempts)} if attempts else {}
                fields["metadata"] = {"imagined_tokens": counting.tokens}  # their cost, in the real run's trace
            # record_run appends each turn's trace (failed or not) to `turn_traces`, a list being store enough
            state, trace = await record_run(compiled, {"messages": [*messages, HumanMessage(content=text)], **notes},
                                            context=context, store=turn_traces, on_update=on_update,
                                            **fields)
            messages = list(state.get("messages", []))
    finally:
        trace = merge_turns(turn_traces, turns) if turn_traces else None
        if store is not None and trace is not None:
            store.append(trace)  # failed or not
    if toolbox is not None:
        verdict = await suite.score(episode, toolbox, {**state, "turn_traces": turn_traces})
    elif hasattr(suite, "score_replayed"):
        verdict = suite.score_replayed(task, trace)
    else:
        raise UserError(f"suite {suite.name!r} scores runs on its server only: give run_task a toolbox")
    f1, match = call_f1(trace, task)
    for reward in (Reward(name="call_f1", value=f1, details=match),
                   Reward(name="task", value=verdict.score, details=verdict.to_dict())):
        trace.rewards.append(reward)
        if store is not None:
            store.attach_reward(trace.run_id, reward)
    return TaskRun(task=task, episode=episode, state=state, verdict=verdict, attempts=attempts, trace=trace)


class CountingPolicy:
    """A policy that counts the tokens it generates per role (test-time rehearsal's cost)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", None)
        self.tokens: dict[str, int] = {}

    def _count(self, generation: G) -> G:
        self.tokens[generation.role] = self.tokens.get(generation.role, 0) + len(generation.completion_ids or [])
        return generation

    async def act(self, request: ActRequest, sampling: SamplingParams | None = None) -> Generation[ActOutput]:
        return self._count(await self.inner.act(request, sampling))

    async def rehearse(self, request: RehearseRequest,
                       sampling: SamplingParams | None = None) -> Generation[Prediction]:
        return self._count(await self.inner.rehearse(request, sampling))

    async def critique(self, request: CritiqueRequest, sampling: SamplingParams | None = None) -> Generation[Critique]:
        return self._count(await self.inner.critique(request, sampling))


def merge_turns(traces: list[Trace], turns: list[str]) -> Trace:
    """One trace for a multi-turn run: the turns' steps in order; `metadata["turns"]` says where each
    turn starts and what the user said. A single turn is returned as it is."""
    if len(traces) == 1 and len(turns) == 1:
        return traces[0]
    first = traces[0].model_copy(deep=True)
    starts = [0]
    for later in traces[1:]:
        starts.append(len(first.steps))
        for step in later.steps:
            first.steps.append(step.model_copy(update={"index": len(first.steps)}))
    last = traces[-1]
    failed = next((t for t in traces if t.status != "finished"), None)
    first.ended_at, first.final_answer = last.ended_at, last.final_answer
    first.status, first.error = (failed.status, failed.error) if failed else (last.status, last.error)
    first.metadata = {**first.metadata, "turns": [{"user": turns[i], "first_step": starts[i]} for i in range(len(traces))]}
    return first

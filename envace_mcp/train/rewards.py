"""Rewards of a recorded run when no checker can score it: what the servers said (`outcomes`), what the
person said (`approvals`), and `combined` weighing them.

Each is a reward function as `record_run(rewards=...)` takes, `fn(trace, final_state) -> (value, details)`,
that reads the trace alone (`envace train grpo --reward` scores runs recorded long ago, whose state is
gone); a `None` value means "cannot score", never 0. Values lie in [0, 1], as the checkers' `task`
reward: EnvACE divides advantages by no std, so a reward's scale is the update's, and settings tuned on
task rewards keep their meaning (a weighted mean of parts in [0, 1] stays there too).

They reward a clean run and calls a person agreed with, not a correct answer: an agent that answers at
once, with no call, scores `outcomes` 1.0. Prefer a checker's reward where one can be written.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace_mcp._sync import run_sync
from envace_mcp.errors import UserError
from envace_mcp.graph.gate import call_key
from envace_mcp.traces.recorder import RewardFunction
from envace_mcp.toolbox.result import NOT_THE_SERVERS
from envace_mcp.traces.schema import STOPPED, Reward, Step, Trace
from envace_mcp.train.judge import Verdict, judge

if TYPE_CHECKING:
    from envace_mcp.traces.store import TraceStore

STALL = "stopped: the agent proposed "
"""How a stalled run's `metadata["stop_reason"]` begins (`graph.nodes._stalls.Stall`): one call was stopped
again and again until the graph ended the run."""


def outcomes(trace: Trace, final_state: Mapping[str, Any] | None = None) -> Verdict:
    """What the servers (and the gate) said of a run's calls, and whether it ended with an answer:
    `0.5 × answered + 0.5 × clean`, `clean` the fraction of judged calls that ran without error (1.0 when
    none was judged). Neither half alone is success: an answer after failed calls may be made up, clean
    calls that never led to an answer (turns spent, a stall) did not finish the task.

    Judged calls: those that ran — fine, an error the server answered (`tool_error`), or one the toolbox
    itself refused (`NOT_THE_SERVERS`: invalid arguments, unknown tool, timeout, ...) — and those the gate
    stopped (`block`, `feedback`, `reject`, `budget`). A call proposed again after it failed counts each
    time (`repeated`), so a run that stalled on one call pays for every stop. Not judged: calls a rehearsal
    answered (no server said anything) and calls a person refused (`approvals` scores those). None: a run
    that did not finish (interrupted, failed), or whose every call was rehearsed."""
    if trace.status != "finished":
        return None, {"unscorable": f"the run is {trace.status}, not finished"}
    counts: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    stopped: Counter[str] = Counter()
    failed: set[str] = set()
    for step in trace.steps_of("tool"):
        if step.decision == "rejected_by_human":
            counts["refused_by_person"] += 1
            continue
        if step.simulated or step.decision == "simulate":
            counts["simulated"] += 1
            continue
        key = call_key(step.tool or "", step.arguments)
        counts["repeated"] += key in failed
        result = step.result or {}
        if step.decision in STOPPED:
            stopped[step.decision] += 1  # type: ignore[index]
        elif not result.get("is_error"):
            counts["ok"] += 1
            continue
        elif result.get("error_kind") in NOT_THE_SERVERS:
            refused[result["error_kind"]] += 1
        else:
            counts["server_errors"] += 1
        failed.add(key)
    judged = counts["ok"] + counts["server_errors"] + sum(refused.values()) + sum(stopped.values())
    if not judged and counts["simulated"]:
        return None, {"unscorable": "every call was answered by a rehearsal: no server said anything"}
    answered = bool((trace.final_answer or "").strip())
    clean = counts["ok"] / judged if judged else 1.0
    reason = trace.metadata.get("stop_reason")
    details = {"answered": answered, "calls": judged, "ok": counts["ok"], "server_errors": counts["server_errors"],
               "refused": dict(refused), "stopped": dict(stopped), "repeated": counts["repeated"],
               "stalled": isinstance(reason, str) and reason.startswith(STALL), "simulated": counts["simulated"],
               "refused_by_person": counts["refused_by_person"]}
    if reason:
        details["stop_reason"] = reason
    return 0.5 * answered + 0.5 * clean, details


def approvals(trace: Trace, final_state: Mapping[str, Any] | None = None) -> Verdict:
    """What the person said of the calls put to them: the fraction approved as proposed. An approval is a
    positive label; a denial and an edit are negative ones (an edit says the proposed call was not the
    one to run; what should have run is kept by `preference_pairs`). Each call's label is in `labels`.
    None: nobody approved, denied or edited a call of this run."""
    labels = [{"call_id": s.call_id, "tool": s.tool, "label": _label(s)} for s in trace.steps_of("tool")
              if s.approved is not None]
    if not labels:
        return None, {"unscorable": "no call of this run was approved, denied or edited by a person"}
    counts = Counter(label["label"] for label in labels)
    return counts["approved"] / len(labels), {**{k: counts[k] for k in ("approved", "denied", "edited")},
                                              "labels": labels}


def _label(step: Step) -> str:
    return "denied" if not step.approved else "edited" if step.edited is not None else "approved"


@dataclass(frozen=True)
class PreferencePair:
    """A person's edit of a proposed call, as a preference (for DPO-style training): given the act turn's
    prompt, the call they ran (`chosen`) over the call the model proposed (`rejected`), each
    `{"name", "arguments"}`. `completion_text` is the act turn as the model wrote it (the rejected call in
    its tool format, and any other calls of that turn)."""

    run_id: str
    call_id: str | None
    prompt_text: str | None
    prompt_ids: list[int] | None
    completion_text: str | None
    chosen: dict[str, Any]
    rejected: dict[str, Any]


def preference_pairs(trace: Trace) -> list[PreferencePair]:
    """One pair per edited call of the run, in order, with the act turn that proposed it."""
    pairs, acts = [], []
    for step in trace.steps:
        if step.role == "act":
            acts.append(step)
        elif step.role == "tool" and step.approved and step.edited is not None:
            act = acts[-1] if acts else None  # the graph records a call's steps after the turn that proposed it
            pairs.append(PreferencePair(
                run_id=trace.run_id, call_id=step.call_id, prompt_text=act.prompt_text if act else None,
                prompt_ids=list(act.prompt_ids) if act and act.prompt_ids is not None else None,
                completion_text=act.text if act else None,
                chosen={"name": step.edited.get("name"), "arguments": step.edited.get("args")},
                rejected={"name": step.tool, "arguments": step.arguments}))
    return pairs


REWARDS: dict[str, Callable[..., Verdict]] = {"outcomes": outcomes, "approvals": approvals}
"""The rewards of a run without a checker, by name (`--reward`); `judge:MODEL` is the third (`train.judge`)."""


@dataclass(frozen=True)
class Combined:
    """The weighted mean of rewards over those that could score a run; None when none could.
    `details["parts"]` holds each part's value (None: skipped), weight and details; a part every run of
    the group already carries (scored alone earlier) is read from the runs, not scored again. A group reward among
    the parts (`judge:MODEL`) makes the combination one: `score_group` scores one task's runs together."""

    parts: tuple[tuple[str, float, Any], ...]

    @property
    def weights(self) -> tuple[tuple[str, float], ...]:
        return tuple((name, weight) for name, weight, _ in self.parts)

    @property
    def name(self) -> str:
        """The reward's name in traces: `outcomes+approvals*2` (a weight of 1 unwritten)."""
        return "+".join(n if w == 1 else f"{n}*{w:g}" for n, w in self.weights)

    def score_group(self, traces: Sequence[Trace]) -> list[Verdict]:
        each = {name: (weight, _recorded(traces, name) or _verdicts(fn, traces)) for name, weight, fn in self.parts}
        verdicts: list[Verdict] = []
        for i in range(len(traces)):
            parts = {name: (w, *verdicts_[i]) for name, (w, verdicts_) in each.items()}
            scored = [(w, v) for w, v, _ in parts.values() if v is not None]
            total = sum(w for w, _ in scored)
            value = sum(w * v for w, v in scored) / total if scored else None
            verdicts.append((value, {"parts": {name: {"value": v, "weight": w, "details": d}
                                               for name, (w, v, d) in parts.items()}}))
        return verdicts

    def __call__(self, trace: Trace, final_state: Mapping[str, Any] | None = None) -> Verdict:
        return self.score_group([trace])[0]

    def release(self) -> None:
        for _, _, fn in self.parts:
            getattr(fn, "release", lambda: None)()


def _recorded(traces: Sequence[Trace], name: str) -> list[Verdict] | None:
    """The part's verdicts where every run already carries them (a judge's are not asked for twice)."""
    rewards = [trace.reward(name) for trace in traces]
    return None if any(r is None for r in rewards) else [(r.value, r.details) for r in rewards]  # type: ignore[union-attr]


def combined(weights: Mapping[str, float], *, rubric: str | Path | None = None) -> Combined:
    """`combined({"outcomes": 1.0, "approvals": 2.0})`: the weighted mean of the parts that could score;
    a `judge:MODEL` part is `train.judge.judge(MODEL, rubric=rubric)`."""
    unknown = sorted(n for n in weights if n not in REWARDS and not n.startswith("judge:"))
    if unknown or not weights:
        raise UserError(f"reward {', '.join(unknown) or '(none)'}: choose from {', '.join(REWARDS)}, judge:MODEL")
    bad = {n: w for n, w in weights.items() if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0)}
    if bad:
        raise UserError(f"reward weights must be positive numbers: {bad}")
    parts = [(float(w), REWARDS.get(name) or judge(name[len("judge:"):], rubric=rubric)) for name, w in weights.items()]
    return Combined(tuple((reward_name(fn), w, fn) for w, fn in parts))


def reward_from(spec: str, *, rubric: str | Path | None = None) -> RewardFunction:
    """The reward `--reward` names: `outcomes`, `approvals`, `judge:MODEL`, or several with optional weights,
    `outcomes=1,judge:embedded=2` (an unweighted part weighs 1); a single name is that reward itself.
    `rubric`: the judge's rubric file."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, weight = item.rpartition("=") if "=" in item else (item, "", "")
        try:
            weights[name.strip()] = float(weight) if weight.strip() else 1.0
        except ValueError:
            raise UserError(f"reward {item!r}: the weight after '=' must be a number") from None
    fn = combined(weights, rubric=rubric)
    if rubric is not None and not any(name.startswith("judge:") for name in weights):
        raise UserError("a rubric is the judge's: it needs a judge:MODEL reward")
    return fn.parts[0][2] if len(fn.parts) == 1 else fn


def reward_name(fn: RewardFunction) -> str:
    """The name a reward function's verdicts are recorded under (as `traces.recorder.score` names them)."""
    return getattr(fn, "name", None) or getattr(fn, "__name__", "reward")


def score_missing(runs: Iterable[Trace], fn: RewardFunction, store: TraceStore, *,
                  on_scored: Callable[[int], None] | None = None) -> list[Reward]:
    """Score each run that has no reward of `fn`'s name yet (a `None` one counts as had: it said "cannot
    score"), add the reward to the run, and save it with the run in `store` (`TraceStore.attach_reward`:
    a reward line appended, the recorded run left as it was). A group reward (`judge:MODEL`) reads each
    group lacking it whole (its runs by `group_id`; a run without one alone), and only the runs that
    lacked it take the new verdict. `on_scored(n)`: n more runs scored (a progress bar). Returns the
    rewards added."""
    name = reward_name(fn)
    runs = list(runs)
    missing = {trace.run_id for trace in runs if trace.reward(name) is None}
    groups: dict[str, list[Trace]] = {}
    for trace in runs:
        key = trace.group_id if trace.group_id is not None and hasattr(fn, "score_group") else f"run:{trace.run_id}"
        groups.setdefault(key, []).append(trace)
    added: list[Reward] = []
    for group in groups.values():
        lacking = [trace for trace in group if trace.run_id in missing]
        if not lacking:
            continue
        for trace, verdict in zip(group, _verdicts(fn, group)):
            if trace.run_id not in missing:
                continue
            value, details = verdict
            reward = Reward(name=name, value=None if value is None else float(value), details=details)
            trace.rewards.append(reward)
            store.attach_reward(trace.run_id, reward)
            added.append(reward)
        if on_scored is not None:
            on_scored(len(lacking))
    return added


def _verdicts(fn: RewardFunction, group: Sequence[Trace]) -> list[Verdict]:
    """`fn`'s verdicts on a group's runs: together for a group reward (`score_group`), one by one
    otherwise (awaited where `fn` is a coroutine function, as `record_run` allows)."""
    if hasattr(fn, "score_group"):
        return list(fn.score_group(group))
    verdicts = []
    for trace in group:
        verdict = fn(trace, {})
        if inspect.isawaitable(verdict):
            verdict = run_sync(_awaited(verdict))
        value, details = verdict if verdict is not None else (None, {"unscorable": True})
        verdicts.append((value, dict(details or {})))
    return verdicts


async def _awaited(verdict: Any) -> Any:
    return await verdict

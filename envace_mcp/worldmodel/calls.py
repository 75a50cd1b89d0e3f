"""Recorded runs as world-model examples: every call that really ran, with what the rehearse role would
have seen before it and what the server answered.

Any trace will do — a run of the EnvACE graph, of an agent with `RehearsalMiddleware` or
`RehearsingToolNode`, or a tool-call log brought in with `envace traces import` — because the example is
rebuilt from the run's calls, not from the prompts it happened to record: the task, then each earlier
call that ran with its reply, then the call. Calls the gate stopped never reached the server and teach
nothing; errors the toolbox made itself (a timeout, invalid arguments it refused) are not the server's
answer either, and are left out.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from envace_mcp.policy.recall import REPLY_CHARS, CallLog, Logged
from envace_mcp.policy.types import Example, RehearseRequest, ToolCall
from envace_mcp.toolbox import ToolResult, ToolSpec
from envace_mcp.toolbox.result import NOT_THE_SERVERS
from envace_mcp.toolbox.catalog import bound_tool
from envace_mcp.traces.schema import Trace

EXAMPLES = 6
"""Earlier real calls shown to the simulator prompt, as the graph shows them (`calls.examples_from`)."""


@dataclass
class Observed:
    """One real call as a world-model example."""

    episode: str
    """The run it belongs to; a call replayed with a changed argument belongs to the run it came from
    (so a split by episode keeps both on one side)."""
    index: int
    """Its place among the run's real calls."""
    request: RehearseRequest
    result: dict[str, Any]
    """The real reply (`ToolResult` as JSON)."""
    spec: ToolSpec
    earlier: list[Any] = field(default_factory=list)
    """Earlier replies' values in the run (what `fidelity.field_split` counts as read earlier)."""

    @property
    def tool(self) -> str:
        return self.spec.name

    @property
    def failed(self) -> bool:
        return bool(self.result.get("is_error"))

    @property
    def value(self) -> Any:
        return ToolResult.model_validate({**self.result, "tool": self.result.get("tool") or self.spec.name}).value


def catalog_of(trace: Trace) -> dict[str, ToolSpec]:
    """The tools a trace recorded (`Trace.tools`), each bounded as a live listing is (`bound_tool`):
    a trace file is no more trusted than a server."""
    specs: dict[str, ToolSpec] = {}
    for entry in trace.tools or []:
        try:
            spec, _ = bound_tool(ToolSpec.from_dict(entry))
        except ValueError:
            continue
        if spec is not None:
            specs[spec.name] = spec
    return specs


def episode_of(trace: Trace) -> str:
    origin = trace.metadata.get("mutated_from") if isinstance(trace.metadata, dict) else None
    return str(origin) if isinstance(origin, str) and origin else trace.run_id


def observed_calls(traces: Iterable[Trace], catalog: Mapping[str, ToolSpec] | None = None
                   ) -> tuple[list[Observed], dict[str, int]]:
    """Every call that ran in `traces`, as `Observed`, in order; and the calls skipped because no catalog
    knows their tool (`catalog`, else each trace's own `tools`), counted by tool name."""
    out: list[Observed] = []
    unknown: dict[str, int] = {}
    for trace in traces:
        specs = dict(catalog) if catalog is not None else catalog_of(trace)
        history: list[BaseMessage] = [HumanMessage(content=trace.task or "")]
        examples: list[Example] = []
        earlier: list[Any] = []
        index = 0
        for step in trace.steps:
            if not step.ran or step.result is None or not step.tool:
                continue
            result = step.result
            if result.get("is_error") and result.get("error_kind") in NOT_THE_SERVERS:
                continue
            spec = specs.get(step.tool)
            if spec is None:
                unknown[step.tool] = unknown.get(step.tool, 0) + 1
                continue
            arguments = step.arguments if isinstance(step.arguments, dict) else {}
            call_id = step.call_id or f"call-{index}"
            call = ToolCall(id=call_id, name=spec.name, arguments=arguments)
            request = RehearseRequest(call=call, tool=spec, allowed=list(specs.values()), history=list(history),
                                      examples=examples[-EXAMPLES:])
            observed = Observed(episode_of(trace), index, request, result, spec, list(earlier))
            out.append(observed)
            text = ToolResult.text_of(result)
            history += [AIMessage(content="", tool_calls=[{"name": spec.name, "args": arguments, "id": call_id,
                                                           "type": "tool_call"}]),
                        ToolMessage(content=text, tool_call_id=call_id, name=spec.name,
                                    status="error" if result.get("is_error") else "success")]
            examples.append(Example(spec.name, arguments, text))
            earlier.append(observed.value)
            index += 1
    return out, unknown


def call_digest(call: Observed) -> str:
    """What a call was, whatever run it came in: its tool, arguments and reply, and the calls before it
    with theirs. A log imported twice gets new run ids; its calls keep their digests, so a report can
    leave out the calls a world model trained on."""
    earlier = [[e.tool, e.arguments, e.result] for e in call.request.examples]
    text = json.dumps([call.tool, call.request.call.arguments, call.result, earlier], sort_keys=True,
                      ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def split_episodes(calls: list[Observed], holdout: float, seed: int) -> tuple[list[str], list[str]]:
    """(training episodes, held-out episodes): the runs in a seeded order, the last `holdout` share held
    out (at least one run each side when there are two or more). The order starts from what each run's
    calls were (`call_digest`), not from its id, so a log imported twice, with new run ids, splits alike."""
    content: dict[str, list[str]] = {}
    for call in calls:
        content.setdefault(call.episode, []).append(call_digest(call))
    episodes = sorted(content, key=lambda e: (hashlib.sha256("".join(content[e]).encode()).hexdigest(), e))
    random.Random(seed).shuffle(episodes)
    held = round(len(episodes) * holdout)
    if len(episodes) >= 2:
        held = min(max(held, 1), len(episodes) - 1)
    return episodes[: len(episodes) - held], episodes[len(episodes) - held:]


def first_calls(calls: list[Observed], episodes: list[str], limit: int | None) -> list[Observed]:
    """The calls of `episodes`, taking whole runs in the given order until `limit` calls (None: all)."""
    by_episode: dict[str, list[Observed]] = {}
    for call in calls:
        by_episode.setdefault(call.episode, []).append(call)
    out: list[Observed] = []
    for episode in episodes:
        if limit is not None and len(out) >= limit:
            break
        out += by_episode.get(episode, [])
    return out


def call_log(calls: Iterable[Observed], source: str | None = None) -> CallLog:
    """`calls` as the logged calls a world model recalls (`policy.recall.CallLog`), each tagged with its run."""
    return CallLog((Logged(c.tool, c.request.call.arguments if isinstance(c.request.call.arguments, dict) else {},
                           ToolResult.text_of(c.result)[:REPLY_CHARS], c.failed, c.spec.server or None, c.episode)
                    for c in calls), source=source)


def logged_like(call: Observed, log: CallLog | None) -> list[Logged] | None:
    """The logged calls most like `call` (`CallLog.nearest`), never from its own run; None without a log."""
    return None if log is None else log.nearest(call.request.call, call.spec.server or None, exclude=call.episode)


def with_similar(call: Observed, log: CallLog | None, nearest: list[Logged] | None = None) -> RehearseRequest:
    """The call's rehearse request with the logged calls most like it (`nearest`, when already found)."""
    nearest = logged_like(call, log) if nearest is None else nearest
    if nearest is None:
        return call.request
    return replace(call.request, similar=[e.example() for e in nearest])

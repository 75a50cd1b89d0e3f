"""The gate: pure functions deciding, per proposed call, whether it is rehearsed and what happens next.

The gate is code, not text: nothing a tool returns or a model writes can change these rules.

    should_rehearse(spec, mode, config)                          -> bool
    decide(call, spec, prediction, mode=, config=, real_calls=, max_real_calls=, evidence=)  -> Decision

Decisions, in the order they are checked:
1. `reject`   — unknown tool or arguments violating its input schema (answered without any server);
2. `simulate` — simulated mode, or a non-read-only tool in mixed mode: the prediction is the answer;
3. `block`    — a destructive tool whose rehearsal predicts a failure (a policy violation, an error), or,
   with `on_unusable="block"`, could not be read; or, by the run's own evidence (`evidence` rules,
   no model involved), one the real server already refused (`repeated_failures`), one that already
   succeeded since the user's last message (`repeated_writes`) or one with an identifier nobody wrote
   (`ungrounded_arguments`): not executed unless `approve_blocked` routes it to a human (`ask`);
4. `feedback` — the rehearsal predicts an error for any other tool (or blocking is off): not executed,
   the prediction goes back to the agent so it can revise;
5. `budget`   — the run's real-call budget (`RunLimits.max_real_calls`) is spent;
6. `ask`      — the configuration wants a human to approve this call (`interrupt()` shows the call and
   its rehearsed outcome);
7. `execute`  — run it on the real server.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, field_validator, model_validator

from envace_mcp.config import Settings, build, parse_text
from envace_mcp.errors import UserError
from envace_mcp.policy.trust import ToolTrust
from envace_mcp.policy.types import Prediction, ToolCall
from envace_mcp.toolbox import ToolSpec
from envace_mcp.toolbox.asking import MAX_INPUT_ROUNDS

Mode = Literal["real", "simulated", "mixed"]
Action = Literal["reject", "simulate", "feedback", "block", "budget", "ask", "execute"]


EvidenceRule = Literal["repeated_failures", "repeated_writes", "ungrounded_arguments"]


class GateConfig(Settings):
    """How calls are rehearsed and gated: the gate's policy. Each default says why. How long a run may go
    on is not the gate's business: `RunLimits`."""

    rehearse: Literal["all", "writes", "none"] = "writes"
    """Rehearse calls to tools not annotated read-only: reads are cheap and safe to just run."""
    feedback_on_predicted_error: bool = True
    """A predicted error is sent back to the agent instead of spending a real call that would fail."""
    block_destructive_on_predicted_failure: bool = True
    """Destructive calls predicted to fail (often policy violations) are where rehearsal pays off most."""
    on_unusable: Literal["allow", "block"] = "allow"
    """What a destructive call whose rehearsal is unusable (`Prediction.status == "invalid"`: no parseable
    reply; or `Prediction.partial`: a result cut at the budget or off the tool's output schema) gets: `block` fails closed, as if the rehearsal
    predicted a failure; `allow` lets the rest of the gate decide (approval, budget), the call treated as
    unrehearsed. `allow` here because an untrained world model's rehearsals are mostly unusable, and
    every write would stop; an adapter whose unusable rehearsals were measured to precede failures
    recommends `block` in its envace.json (the shipped one does: docs/evidence.md)."""
    evidence: tuple[EvidenceRule, ...] = ()
    """Rules that block a destructive call by the run's own evidence, with no model involved:
    `repeated_failures`: identical (tool and arguments) to one the real server refused earlier in the run,
    with no write succeeding since — the environment has already answered it;
    `repeated_writes`: identical to one that already succeeded since the user's last message — it is done,
    and running it again writes twice or fails (a user who wants it again says so in a new message);
    `ungrounded_arguments`: it carries an identifier-like string argument (no spaces, not an enum) that
    appears as a whole token nowhere in the user's messages or in replies of calls that ran without
    error — an account or order the model made up or mistyped.
    None by default: each can stop a call a person meant (a retried write, an id they know by heart)."""
    min_failure_confidence: float = Field(default=0.0, ge=0.0, le=1.0)
    """A predicted failure stops a call (block, feedback) only when the rehearsal was at least this sure of
    it (`Prediction.confidence`; none reported counts as sure). 0 trusts every predicted failure. A
    threshold helps only as far as the world model's confidence ranks its mistakes: measure that on saved
    runs first (docs/evidence.md)."""
    approve_blocked: bool = False
    """Off: blocked calls are final. On: a human may approve them (needs a checkpointer)."""
    require_approval: Literal["never", "measured", "destructive", "always"] = "destructive"
    """Approval for every destructive call (tools not annotated read-only, or whose server's annotations are
    not trusted), or every call, with the call and its rehearsed outcome shown whole. The default in every
    form — CLI, served graph, drop-ins, Python — since a real server's writes cannot be taken back and a
    world model's "no objection" is no consent. `"never"` is the explicit opt-out, for sandboxes (the
    bundled servers in evaluation and training, `UNATTENDED`) and runs nobody can answer. `"measured"`: as
    `"destructive"`, except where the world model's trust table says its predicted successes of that tool
    were measured reliable (`ToolTrust.skip_approval`) and it predicts success: your choice to let a
    measured world model stand in for you; an adapter's table alone never skips a question."""
    trust: dict[str, ToolTrust] | None = None
    """The world model's trust table, tool by tool (`envace_mcp.policy.trust`), as re-checked when its
    policy loaded: with one, a tool it does not cover is untrusted, its predictions shown and never acted
    on alone. Filled from the policy (`policy.trust`, read once from its adapter's `trust.json`) wherever a
    gate is resolved (`gate_for`); None: no table, every prediction acted on as the settings above say."""

    MOVED: ClassVar[dict[str, str]] = {
        key: f"it is a run limit (RunLimits; --limits {key}=N, ENVACE_LIMITS)"
        for key in ("max_steps", "max_rehearsals", "max_real_calls")}
    LEGACY_KEYS: ClassVar[tuple[str, ...]] = (
        "block_destructive_on_unusable_rehearsal", "block_repeated_failures", "block_repeated_writes",
        "block_ungrounded_arguments")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """Settings written before the evidence rules became one set and failing closed one choice (old
        adapters' envace.json, recorded runs, journals) read as the new shape."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in cls.MOVED:
            if key in data:
                raise ValueError(f"{key} is not a gate setting: {cls.MOVED[key]}")
        unusable = data.pop("block_destructive_on_unusable_rehearsal", None)
        if unusable is not None:
            data.setdefault("on_unusable", "block" if _truth(unusable) else "allow")
        rules = [rule for rule in get_args(EvidenceRule) if _truth(data.pop(f"block_{rule}", False))]
        if rules:
            data["evidence"] = [*rules, *(data.get("evidence") or ())]
        return data

    @field_validator("evidence", mode="before")
    @classmethod
    def _rule_set(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value] if value else []
        return tuple(sorted(set(value))) if isinstance(value, (list, tuple, set, frozenset)) else value

    @property
    def reads_evidence(self) -> bool:
        """Whether any evidence rule is on (`objection`), so the gate needs the run's `Evidence`."""
        return bool(self.evidence)


def _truth(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"))


class RunLimits(Settings):
    """How far one run may go, whatever the gate decides. Each default says why."""

    max_steps: int = Field(default=12, ge=1)
    """Agent turns before the run stops (the bundled tasks need at most 7)."""
    max_rehearsals: int | None = Field(default=100, ge=0)
    """Bounds model time spent rehearsing in one run (None: no bound)."""
    max_real_calls: int | None = Field(default=50, ge=0)
    """Bounds what one run can do to real systems (None: no bound)."""
    max_input_rounds: int = Field(default=MAX_INPUT_ROUNDS, ge=1)
    """Rounds of questions one call's server may ask a person before the call ends as an error: a
    confirmation and a follow-up or two; a server that keeps asking is looping (`toolbox.asking`)."""


UNATTENDED = {"require_approval": "never"}
"""The gate settings under GateConfig's defaults for runs nobody approves on servers that are sandboxes:
evaluation and training on the bundled suites, whose state is reset per episode."""


ADAPTER_GATE_SETTINGS = ("rehearse", "feedback_on_predicted_error", "block_destructive_on_predicted_failure",
                         "min_failure_confidence", "on_unusable", *GateConfig.LEGACY_KEYS[:1])
"""What an adapter may recommend in its `envace.json` (`"gate": {...}`): how far to trust its world
model, as measured with it. Approval, evidence rules and budgets stay the caller's."""


def gate_settings(settings: Any, where: str, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Gate settings as JSON gives them (`{"require_approval": "destructive", "evidence": [...]}`), checked
    against GateConfig (old keys read as the new shape), as the dict of what they set. `allowed`: the only
    keys they may set. A bad one is a UserError that starts with `where`."""
    if not isinstance(settings, dict):
        raise UserError(f"{where}: gate settings must be an object of GateConfig fields, not {settings!r}")
    checked = build(GateConfig, settings, where=where, allowed=allowed)
    return {key: getattr(checked, key) for key in GateConfig._legacy(settings)}  # as given, old keys mapped


def gate_text(text: str, where: str) -> dict[str, Any]:
    """Gate settings written as `rehearse=all,require_approval=never,evidence=[repeated_writes]` (`--gate`,
    `ENVACE_GATE`), checked as `gate_settings` does."""
    return gate_settings(parse_text(text, GateConfig, where), where)


def limits_settings(settings: Any, where: str) -> dict[str, Any]:
    """Run limits as JSON gives them (`{"max_steps": 6}`), checked, as the dict of what they set."""
    if not isinstance(settings, dict):
        raise UserError(f"{where}: run limits must be an object of RunLimits fields, not {settings!r}")
    checked = build(RunLimits, settings, where=where)
    return {key: getattr(checked, key) for key in settings}


def limits_text(text: str, where: str) -> dict[str, Any]:
    """Run limits written as `max_steps=8,max_real_calls=none` (`--limits`, `ENVACE_LIMITS`), checked."""
    return limits_settings(parse_text(text, RunLimits, where), where)


def adapter_gate(adapter: Any) -> dict[str, Any]:
    """The gate settings an adapter folder recommends (`"gate"` in its `envace.json`, beside the prompt
    formats), checked by `gate_settings`; {} when it recommends none. `adapter`: the folder as a loaded
    policy carries it (`policy.adapter.Adapter`), or its path before anything loads. `envace demo`,
    `envace run` and the served graph start from them; in Python: `GateConfig(**adapter_gate(folder))`. A
    setting outside `ADAPTER_GATE_SETTINGS`, of the wrong type, or a torn file is a UserError naming the file."""
    from envace_mcp.policy.adapter import Adapter
    from envace_mcp.policy.tool_text import FORMAT_FILE, adapter_file

    if adapter is None:
        return {}
    if isinstance(adapter, Adapter):
        path, recommended = adapter.path, adapter.gate
    else:
        path, recommended = Path(adapter), adapter_file(adapter).get("gate")
    if recommended is None:
        return {}
    return gate_settings(recommended, f"{path / FORMAT_FILE} (an adapter's recommendation)", allowed=ADAPTER_GATE_SETTINGS)


def policy_gate(policy: Any, **settings: Any) -> GateConfig:
    """The gate a run with `policy` starts from: GateConfig's defaults, then what the world model's adapter
    recommends (`adapter_gate` of `policy.adapter`, read when it loaded: the rehearse adapter's, for
    `RolePolicies`), then `settings`. What the graph, the drop-ins, `envace demo/run/eval` and the served
    graph all use when no gate is given, so each measures and runs the same configuration."""
    return build(GateConfig, adapter_gate(getattr(policy, "adapter", None)), settings,
                 where="the gate settings")


def gate_for(policy: Any, gate: GateConfig | None = None) -> GateConfig:
    """The gate a run with `policy` uses: `gate`, or `policy_gate(policy)` when None; either way with the
    world model's trust table unless the gate already carries one. Every entry point resolves its gate here."""
    gate = gate if gate is not None else policy_gate(policy)
    if gate.trust is None:
        table = getattr(policy, "trust", None)  # read and re-checked once, when the policy loaded
        if table is not None:
            gate = gate.model_copy(update={"trust": table.tools})
    return gate


@dataclass(frozen=True)
class Evidence:
    """What a run has seen, for the gate's evidence rules: `text`, the user's messages and the replies of
    calls that ran without error; `refused`, the calls (`call_key`) the real server refused since the
    last write that succeeded; `done`, the writes that succeeded since the user's last message. Built
    from the conversation by `Evidence.of`."""

    text: str = ""
    refused: frozenset[str] = frozenset()
    done: frozenset[str] = frozenset()

    @classmethod
    def of(cls, messages: list[Any], read_only: dict[str, bool] | None = None) -> Evidence:
        """From LangChain messages. `read_only`: tool name -> its annotation; a tool missing from it counts
        as one that writes, so its success clears `refused`. Replies the gate gave instead of a tool
        (`prompts.NOT_EXECUTED`) and the graph's own notes to the agent (`prompts.GRAPH_NOTE`) are not
        evidence of anything."""
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

        from envace_mcp.policy.prompts import GRAPH_NOTE, NOT_EXECUTED

        texts: list[str] = []
        refused: set[str] = set()
        done: set[str] = set()
        keys: dict[str, tuple[str, str]] = {}
        for message in messages:
            if isinstance(message, HumanMessage) and not message.additional_kwargs.get(GRAPH_NOTE):
                texts.append(_text(message.content))
                done.clear()
            elif isinstance(message, AIMessage):
                keys.update({c["id"]: (c["name"], call_key(c["name"], c["args"])) for c in message.tool_calls if c.get("id")})
            elif isinstance(message, ToolMessage) and not message.additional_kwargs.get(NOT_EXECUTED):
                name, key = keys.get(message.tool_call_id, (message.name or "", ""))
                if message.status == "error":
                    refused.add(key)
                    continue
                texts.append(_text(message.content))
                if not (read_only or {}).get(name, False):
                    refused.clear()
                    done.add(key)
        refused.discard("")
        done.discard("")
        return cls("\n".join(texts), frozenset(refused), frozenset(done))

    def grounded(self, value: str) -> bool:
        """Whether `value` occurs in `text` as a whole token (`BRK-1` is not found inside `BRK-1549`), in any
        case: a user who writes "aapl" and a model that writes "AAPL" name the same ticker, and servers that
        care about case reject the wrong one themselves."""
        return re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", self.text, re.IGNORECASE) is not None


def call_key(name: str, arguments: Any) -> str:
    return name + json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _text(content: Any) -> str:
    """A message's text, with a JSON reply's strings also written unescaped (ids with non-ASCII letters)."""
    if isinstance(content, list):
        content = "\n".join(str(b.get("text", "")) if isinstance(b, dict) else str(b) for b in content)
    text = str(content)
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return text + "\n" + json.dumps(value, ensure_ascii=False)


def _identifiers(arguments: dict[str, Any], schema: dict[str, Any]) -> list[tuple[str, str]]:
    """(argument, value) for each identifier-like string: no whitespace, not an enum or const (a list's
    strings included)."""
    props = schema.get("properties") or {}
    out = []
    for key, value in arguments.items():
        prop = props.get(key) or {}
        if not isinstance(prop, dict) or "enum" in prop or "const" in prop or any(
                isinstance(s, dict) and ("enum" in s or "const" in s) for s in prop.get("anyOf", [])):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item and not any(ch.isspace() for ch in item):
                out.append((key, item))
    return out


def objection(call: ToolCall, spec: ToolSpec, evidence: Evidence, config: GateConfig) -> str | None:
    """Why the run's own evidence says a destructive call should not run (None: it does not)."""
    key = call_key(call.name, call.arguments)
    if "repeated_failures" in config.evidence and key in evidence.refused:
        return "the server refused this exact call earlier in this run, and no write has succeeded since"
    if "repeated_writes" in config.evidence and key in evidence.done:
        return "this exact call already succeeded earlier in this run, since the user's last message: it is done"
    if "ungrounded_arguments" in config.evidence:
        for argument, value in _identifiers(call.arguments, spec.input_schema):
            if not evidence.grounded(value):
                return f"{argument}={value!r} appears nowhere in the user's messages or in any tool's reply"
    return None


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def simulates(mode: Mode, read_only: bool) -> bool:
    """Whether the rehearsal answers a call instead of the real tool (simulated mode; writes in mixed mode)."""
    return mode == "simulated" or (mode == "mixed" and not read_only)


def rehearses(mode: Mode, config: GateConfig, read_only: bool) -> bool:
    """Whether a call to a tool (read-only or not) is rehearsed before the gate decides."""
    if simulates(mode, read_only):
        return True  # the prediction *is* the answer
    return config.rehearse == "all" or (config.rehearse == "writes" and not read_only)


def rehearses_real_calls(mode: Mode, config: GateConfig) -> bool:
    """Whether any call is both rehearsed and really run, so a rehearsal can meet a real result (what a
    fidelity reward scores): never in simulated mode, nor in mixed mode unless reads are rehearsed."""
    return any(rehearses(mode, config, read_only) and not simulates(mode, read_only) for read_only in (True, False))


def should_rehearse(spec: ToolSpec | None, mode: Mode, config: GateConfig) -> bool:
    """Whether a call to `spec` is rehearsed before the gate decides."""
    return spec is not None and rehearses(mode, config, spec.annotations.read_only)


def decide(
    call: ToolCall,
    spec: ToolSpec | None,
    prediction: Prediction | None,
    *,
    mode: Mode,
    config: GateConfig,
    real_calls: int = 0,
    max_real_calls: int | None = None,
    evidence: Evidence | None = None,
) -> Decision:
    """What happens to one proposed call. Pure: same inputs, same decision. `real_calls` of
    `max_real_calls` (None: no budget) already spent; `evidence`: what the run has seen
    (`Evidence.of(messages)`), for the evidence rules; None skips them."""
    if spec is None:
        return Decision("reject", f"unknown tool '{call.name}'")
    problems = spec.validator.errors(call.arguments)
    if problems:
        where = f"field '{problems[0]['field']}'" if problems[0]["field"] else "arguments"
        return Decision("reject", f"invalid arguments for '{spec.name}': {where}: {problems[0]['message']}")
    if simulates(mode, spec.annotations.read_only):
        return Decision("simulate", f"{mode} mode: the rehearsal answers this call")
    earned = config.trust.get(call.name) if config.trust is not None else None
    if earned is not None and not earned.covers(spec):
        earned = None  # measured on another server's tool of this name, or on another schema
    predicted = prediction is not None and prediction.status == "tool_error"
    unusable = prediction is not None and (prediction.status == "invalid" or prediction.partial)
    confidence = prediction.confidence if prediction is not None else None
    p_error = prediction.p_error if prediction is not None else None
    believed = config.trust is None or (earned is not None and earned.believe_failures and (
        earned.min_p_error is None or p_error is None or p_error >= earned.min_p_error))
    closed = config.trust is None or (earned is not None and earned.fail_closed)
    failing = predicted and (confidence is None or confidence >= config.min_failure_confidence) and believed
    sure = (f" (P(error) {p_error:.2f})" if p_error is not None else
            f" (confidence {confidence:.2f})" if confidence is not None else "")
    shown = ""  # a prediction the trust table says not to act on: said, not acted on
    if (predicted and not believed) or (unusable and not closed):
        measured = ("was not measured on" if earned is None else
                    f"is believed only at P(error) ≥ {earned.min_p_error:g} on" if earned.believe_failures
                    else "was not measured reliable on")
        shown = (f"; the world model {measured} '{spec.name}' (trust table), so its prediction "
                 f"({prediction.code}{sure}) is shown, not acted on")
        unusable = unusable and closed
    seen = objection(call, spec, evidence, config) if evidence is not None and spec.annotations.destructive else None
    if seen:
        if config.approve_blocked:
            return Decision("ask", f"destructive call blocked ({seen}); a human may approve it")
        return Decision("block", f"destructive call blocked: {seen}")
    if spec.annotations.destructive and ((failing and config.block_destructive_on_predicted_failure)
                                         or (unusable and config.on_unusable == "block")):
        why = (f"rehearsal unusable ({prediction.code}), failing closed (on_unusable=block; with on_unusable=allow "
               "approval decides)" if unusable else
               f"rehearsal predicts {prediction.code}{sure}: {prediction.message or prediction.details or 'failure'}")
        if config.approve_blocked:
            return Decision("ask", f"destructive call blocked ({why}); a human may approve it")
        return Decision("block", f"destructive call blocked: {why}")
    if failing and config.feedback_on_predicted_error:
        return Decision("feedback", f"rehearsal predicts {prediction.code}{sure}: "
                                    f"{prediction.message or prediction.details or 'an error'}")
    if max_real_calls is not None and real_calls >= max_real_calls:
        return Decision("budget", f"real-call budget of {max_real_calls} spent")
    vouched = (config.require_approval == "measured" and earned is not None and earned.skip_approval
               and prediction is not None and prediction.status == "result" and not prediction.partial)
    if config.require_approval == "always" or (
            config.require_approval in ("destructive", "measured") and spec.annotations.destructive and not vouched):
        unread = f"; rehearsal unusable ({prediction.code}), so it predicts nothing" if unusable else ""
        return Decision("ask", f"approval required for {'destructive ' if spec.annotations.destructive else ''}"
                               f"tool '{spec.name}'{unread}{shown}")
    if shown:
        return Decision("execute", shown.removeprefix("; "))
    if vouched and spec.annotations.destructive:
        return Decision("execute", f"rehearsal predicts success, and the world model's predicted successes of "
                                   f"'{spec.name}' were measured reliable (require_approval=measured)")
    if predicted and not failing:  # an objection too unsure to count: say so, a reviewer reads this
        return Decision("execute", f"rehearsal predicts {prediction.code} at confidence {confidence:.2f}, under "
                                   f"min_failure_confidence {config.min_failure_confidence:g}")
    if unusable:  # it predicts nothing, so it cannot have raised "no objection"
        return Decision("execute", f"rehearsal unusable ({prediction.code}), so it predicts nothing; run without "
                                   "a prediction (on_unusable=block fails closed)")
    return Decision("execute", "rehearsal raised no objection" if prediction is not None else "not rehearsed")

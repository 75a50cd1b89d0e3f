"""The gate's settings and a run's limits: `GateConfig` (how calls are rehearsed and gated), `RunLimits` (how
far one run may go), and how they are read from JSON, `key=value` text, an adapter's recommendation and a
policy (`gate_for`, where every entry point resolves its gate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, field_validator, model_validator

from envace_mcp.config import Settings, build, parse_text
from envace_mcp.errors import UserError
from envace_mcp.policy.adapter import Adapter
from envace_mcp.policy.tool_text import FORMAT_FILE, adapter_file
from envace_mcp.policy.trust import ToolTrust
from envace_mcp.toolbox.asking import MAX_INPUT_ROUNDS

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
    """Approval for every destructive call (a tool is destructive unless its server annotates it read-only or
    `destructiveHint: false`: one without hints, or whose server's annotations are not trusted, is), or every
    call, with the call and its rehearsed outcome shown whole. A write annotated not destructive runs unasked
    under `"destructive"`, as a read does, unless the rest of the gate stops it. The default in every
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


"""The context of a served graph (`langgraph dev`, LangGraph Platform), where the context arrives as
JSON: it names the services, and `prepare()` loads them on first use, once per process, in a worker
thread (loading a model or starting servers on the event loop would stall every other run, and
LangGraph's server refuses blocking calls there).

`ServedContext` trusts whoever builds it (Python code). `DeployedContext` is what `graphs/envace_graph.py`
serves, where the context is an API caller's JSON: the deployment (its environment, `env` in
langgraph.json) names the services and the gate, and a caller may only tighten the gate (`loosened`),
unless `ENVACE_ALLOW_CONTEXT` lets callers choose."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from envace_mcp.config import build, settings_text
from envace_mcp.errors import UserError
from envace_mcp.graph.gate import (
    GateConfig,
    Mode,
    RunLimits,
    adapter_gate,
    gate_for,
    gate_settings,
    gate_text,
    limits_settings,
    limits_text,
)
from envace_mcp.graph.state import EnvaceContext
from envace_mcp.policy import load_policy
from envace_mcp.policy.types import context_sampling
from envace_mcp.policy.embedded import default_adapter
from envace_mcp.toolbox import blocking_toolbox

logger = logging.getLogger(__name__)


@dataclass
class ServedContext(EnvaceContext):
    """`EnvaceContext` whose policy and toolbox are named, and loaded by `prepare()`."""

    model: str | None = None
    """Hugging Face id or folder for the policy when `policy` is not given (`None`: embedded model)."""
    adapter: str | None = None
    """LoRA adapter for `model`: `None` = the shipped one with the embedded model (as `envace demo`),
    none with other models; `"none"` = no adapter."""
    rehearse_adapter: str | None = None
    """A second LoRA adapter for `model` that runs the rehearse role (a world model trained apart from the
    agent, `load_policy(rehearse_adapter=...)`); its recommended gate is the one started from."""
    servers: str | None = None
    """Path of an `mcpServers` JSON file for the toolbox when `toolbox` is not given."""
    gate: GateConfig | dict[str, Any] | None = None  # type: ignore[assignment]
    """A `GateConfig`, or its settings as the context's JSON gives them (`{"require_approval":
    "destructive"}`), over what the loaded world model's adapter recommends (`adapter_gate`, as `envace
    demo` starts from it; `rehearse_adapter`'s when given; nothing when `policy` is given) and GateConfig's
    defaults."""
    limits: RunLimits | dict[str, Any] | None = None  # type: ignore[assignment]
    """A `RunLimits`, or its settings as JSON (`{"max_steps": 6}`), over RunLimits' defaults."""

    def __post_init__(self) -> None:
        pass  # the gate and the limits are built by `load()`, once what the adapter recommends is known

    def _needs_toolbox(self) -> bool:
        return self.toolbox is None and bool(self.servers) and self.mode != "simulated"

    def load(self) -> ServedContext:
        """Fill in `policy`, `toolbox` and `gate` from `model` / `servers` / the gate's settings (the services
        process-wide, on first use; blocking)."""
        if not isinstance(self.gate, GateConfig):
            self.gate = self._build_gate()  # a bad gate fails before anything loads
        if not isinstance(self.limits, RunLimits):
            self.limits = self._build_limits()
        if self.policy is None:
            self.policy = _shared_policy(self.model, self.adapter, self.rehearse_adapter)
        if self._needs_toolbox():
            self.toolbox = _shared_toolbox(self.servers)  # type: ignore[arg-type]
        if self.sampling is None:
            self.sampling = context_sampling(self.policy)
        self.gate = gate_for(self.policy, self.gate)  # the world model's trust table, as every entry point
        return self

    def _build_gate(self) -> GateConfig:
        settings = gate_settings(self.gate or {}, "the context's gate")
        return GateConfig(**{**self._recommended("the context's gate overrides"), **settings})

    def _build_limits(self) -> RunLimits:
        return RunLimits(**limits_settings(self.limits or {}, "the context's limits"))

    def _recommended(self, overridden_by: str) -> dict[str, Any]:
        """What the world model's adapter recommends (for a policy given as an object: its own adapter's,
        `policy_gate`), logged."""
        if self.policy is not None:
            return adapter_gate(getattr(self.policy, "adapter", None))
        world = self.rehearse_adapter or default_adapter(self.model, self.adapter)
        recommended = adapter_gate(world)
        if recommended:
            _announce(recommended, world, "the rehearse adapter's" if self.rehearse_adapter else "the adapter's",
                      overridden_by)
        return recommended

    async def prepare(self) -> ServedContext:
        """`load()` for the graph's nodes: what is still to load is loaded in a worker thread."""
        if (self.policy is None or self._needs_toolbox() or not isinstance(self.gate, GateConfig)
                or not isinstance(self.limits, RunLimits) or self.sampling is None):
            import anyio

            await anyio.to_thread.run_sync(self.load)
        return self


# ------------------------------------------------------------------ what a deployment lets callers set

CALLER_CHOICES = ("servers", "model", "adapter", "rehearse_adapter", "mode", "gate", "limits")
"""What `ENVACE_ALLOW_CONTEXT` may hand to callers: without it a caller may send each only as the deployment
has it (the gate and the limits: only tighter, `loosened`; the mode: only fewer real calls)."""

_ENV = {"servers": "ENVACE_SERVERS", "model": "ENVACE_MODEL", "adapter": "ENVACE_ADAPTER",
        "rehearse_adapter": "ENVACE_REHEARSE_ADAPTER", "mode": "ENVACE_MODE"}
_SERVICES = ("policy", "toolbox", "tools", "approve")
_JSON = (str, int, float, dict, list)  # bool is an int
_APPROVAL = ("never", "measured", "destructive", "always")
_MODES = ("real", "mixed", "simulated")  # fewer real calls to the right: writes, then every call, simulated
_STOPS_MORE_WHEN_TRUE = ("feedback_on_predicted_error", "block_destructive_on_predicted_failure")
_BLOCKS_MORE = ("block_destructive_on_predicted_failure", "on_unusable", "evidence", "min_failure_confidence",
                "rehearse")


@dataclass(frozen=True)
class Deployment:
    """What the deployment decides, read from the environment (`env` in langgraph.json): the services
    (`ENVACE_SERVERS`, `ENVACE_MODEL`, `ENVACE_ADAPTER`, `ENVACE_REHEARSE_ADAPTER`, `ENVACE_MODE`), gate
    settings over the adapter's recommendation and GateConfig's defaults (`ENVACE_GATE`: a JSON object or
    `key=value,...` as `--gate` takes), run limits over RunLimits' defaults (`ENVACE_LIMITS`, as
    `--limits` takes), and what callers may choose themselves (`ENVACE_ALLOW_CONTEXT`: names from
    `CALLER_CHOICES`, comma-separated; `gate` and `limits` let them loosen those too)."""

    servers: str | None = None
    model: str | None = None
    adapter: str | None = None
    rehearse_adapter: str | None = None
    mode: Mode = "real"
    gate: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    allow: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Deployment:
        """From `environ` (default `os.environ`); a bad value is a UserError naming the variable."""
        env = os.environ if environ is None else environ
        mode = env.get("ENVACE_MODE") or "real"
        if mode not in get_args(Mode):
            raise UserError(f"ENVACE_MODE must be one of {', '.join(get_args(Mode))}, not {mode!r}")
        allow = frozenset(filter(None, (n.strip() for n in env.get("ENVACE_ALLOW_CONTEXT", "").split(","))))
        if allow - set(CALLER_CHOICES):
            raise UserError(f"ENVACE_ALLOW_CONTEXT: unknown {', '.join(sorted(allow - set(CALLER_CHOICES)))}; "
                            f"known: {', '.join(CALLER_CHOICES)}")
        return cls(**{name: env.get(var) or None for name, var in _ENV.items() if name != "mode"}, mode=mode,
                   gate=_deployed(env.get("ENVACE_GATE", ""), "ENVACE_GATE", gate_text, gate_settings),
                   limits=_deployed(env.get("ENVACE_LIMITS", ""), "ENVACE_LIMITS", limits_text, limits_settings),
                   allow=allow)


def _deployed(text: str, where: str, from_text: Any, from_json: Any) -> dict[str, Any]:
    """`ENVACE_GATE` / `ENVACE_LIMITS`: a JSON object, or `key=value,...` as the CLI option takes it."""
    if not text.strip().startswith("{"):
        return from_text(text, where)
    try:
        settings = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{where}: not a JSON object ({exc})") from None
    return from_json(settings, where)


def loosened(deployed: GateConfig, settings: Mapping[str, Any], whose: str = "the deployment's",
             limits: RunLimits | None = None) -> str | None:
    """Why `settings` over `deployed` would let a call through that `deployed` stops, naming the first
    setting that does; None when every one is at least as strict. A stop is a call not run without a human
    (block, feedback) or one a human approves first (ask). Not tighter either way: widening `rehearse`
    from `writes` to `all` under a rehearsal budget (`limits.max_rehearsals`: rehearsed reads spend what
    writes need); and with `approve_blocked` on, what blocks more turns feedback stops into questions."""
    if "trust" in settings:
        return "trust replaces the world model's trust table, which only the deployment sets"
    merged = deployed.model_copy(update=dict(settings))
    for key, value in settings.items():
        old = getattr(deployed, key)
        if value == old:
            continue
        why = None
        if key == "require_approval" and _APPROVAL.index(value) < _APPROVAL.index(old):
            why = "asks a human about fewer calls"
        elif key in _STOPS_MORE_WHEN_TRUE and not value:
            why = "stops fewer calls"
        elif key == "on_unusable" and value == "allow":
            why = "runs calls whose rehearsal could not be read"
        elif key == "evidence" and set(old) - set(value):
            why = f"drops the evidence rule {sorted(set(old) - set(value))[0]}"
        elif key == "approve_blocked" and value:
            why = "lets a human run calls the gate blocks"
        elif key == "min_failure_confidence" and value > old:
            why = "trusts fewer predicted failures"
        elif key == "rehearse" and not (old == "none" or (value == "all" and limits is not None
                                                          and limits.max_rehearsals is None)):
            why = ("rehearses fewer calls" if value == "none" or old == "all" else
                   "spends the rehearsal budget on reads, leaving writes unrehearsed")
        elif key in _BLOCKS_MORE and merged.approve_blocked:
            why = "sends calls feedback stops to a human instead (approve_blocked is on)"
        if why:
            return f"{key}={json.dumps(value)} over {whose} {json.dumps(old)} {why}"
    return None


def limits_loosened(deployed: RunLimits, settings: Mapping[str, Any], whose: str = "the deployment's") -> str | None:
    """Why `settings` over `deployed` would let a run go further, naming the first limit that does. A
    changed rehearsal budget counts either way: fewer leave writes unrehearsed, more spend model time."""
    for key, value in settings.items():
        old = getattr(deployed, key)
        if value == old:
            continue
        if key == "max_rehearsals":
            why = "changes the rehearsal budget (fewer leave calls unrehearsed, more spend model time)"
        elif value is None or (old is not None and value > old):
            why = "raises a budget"
        else:
            continue
        return f"{key}={json.dumps(value)} over {whose} {json.dumps(old)} {why}"
    return None


def _env_default(name: str) -> Any:
    return field(default_factory=lambda: getattr(Deployment.from_env(), name))


@dataclass
class DeployedContext(ServedContext):
    """A `ServedContext` built from an API caller's JSON (`langgraph dev`, LangGraph Platform), over the
    deployment's choices (`Deployment.from_env()`). The caller may send `servers`, `model`, `adapter`,
    `rehearse_adapter` only as the deployment has them, `mode` only towards fewer real calls (real →
    mixed → simulated), `gate` settings only as strict as the deployment's gate or stricter (`loosened`),
    and no service as JSON: anything else fails the run, naming the field, before anything loads or runs.
    `ENVACE_ALLOW_CONTEXT` lifts this per field. A `GateConfig` object (Python, not JSON) is used as is."""

    servers: str | None = _env_default("servers")
    model: str | None = _env_default("model")
    adapter: str | None = _env_default("adapter")
    rehearse_adapter: str | None = _env_default("rehearse_adapter")
    mode: Mode = _env_default("mode")

    def __post_init__(self) -> None:
        self._deployment = deployment = Deployment.from_env()  # read once per context
        for name in _SERVICES:
            value = getattr(self, name)
            if isinstance(value, _JSON) and not (name == "tools" and all(not isinstance(v, _JSON) for v in value)):
                raise UserError(f"the run's context cannot set {name}: it is a Python object the deployment gives")
        for name in _ENV:
            chosen, deployed = getattr(self, name), getattr(deployment, name)
            if chosen == deployed or name in deployment.allow:
                continue
            if name == "mode" and chosen in _MODES and _MODES.index(chosen) > _MODES.index(deployed):
                continue  # fewer real calls, nothing else loaded
            raise UserError(f"the run's context may not set {name} ({chosen!r}): the deployment chooses it "
                            f"({_ENV[name]}); ENVACE_ALLOW_CONTEXT={name} lets callers choose")

    def _build_gate(self) -> GateConfig:
        settings = gate_settings(self.gate or {}, "the context's gate")
        deployment = self._deployment
        deployed = GateConfig(**{**self._recommended("ENVACE_GATE, then the run's context, override"),
                                 **deployment.gate})
        limits = build(RunLimits, deployment.limits, where="ENVACE_LIMITS")
        why = None if "gate" in deployment.allow else loosened(deployed, settings, limits=limits)
        if why:
            raise UserError(f"the context's gate may only tighten the deployment's: {why} "
                            "(ENVACE_ALLOW_CONTEXT=gate lets callers loosen it)")
        return deployed.model_copy(update=settings)

    def _build_limits(self) -> RunLimits:
        deployment = self._deployment
        deployed = build(RunLimits, deployment.limits, where="ENVACE_LIMITS")
        settings = limits_settings(self.limits or {}, "the context's limits")
        why = None if "limits" in deployment.allow else limits_loosened(deployed, settings)
        if why:
            raise UserError(f"the context's limits may only tighten the deployment's: {why} "
                            "(ENVACE_ALLOW_CONTEXT=limits lets callers loosen them)")
        return deployed.model_copy(update=settings)


_ANNOUNCED: set[tuple[str, str]] = set()
_ANNOUNCING = threading.Lock()


def _announce(recommended: dict[str, Any], folder: Any, whose: str, overridden_by: str) -> None:
    """Log an adapter's recommended gate once per process (every run applies it), as `envace demo` prints
    it; at WARNING where it stops fewer calls than GateConfig's defaults."""
    shown = settings_text(recommended)
    with _ANNOUNCING:
        if (str(folder), shown) in _ANNOUNCED:
            return
        _ANNOUNCED.add((str(folder), shown))
    looser = loosened(GateConfig(), recommended, "GateConfig's default")
    logger.log(logging.WARNING if looser else logging.INFO, "gate from %s envace.json (%s): %s (%s)%s",
               whose, folder, shown, overridden_by, f"; {looser}" if looser else "")


_SHARED: dict[tuple[str | None, ...], Any] = {}
_LOADING = threading.Lock()  # two first runs at once load one copy


def _shared_policy(model: str | None, adapter: str | None = None, rehearse_adapter: str | None = None) -> Any:
    adapter = default_adapter(model, adapter)
    key = ("policy", model, adapter, rehearse_adapter)
    with _LOADING:
        if key not in _SHARED:
            _SHARED[key] = load_policy(model, adapter=adapter, rehearse_adapter=rehearse_adapter)
    return _SHARED[key]


def _shared_toolbox(servers: str) -> Any:
    """A toolbox on its own event-loop thread, open for the life of the process (calls from any
    loop are carried to it), closed at exit."""
    key = ("toolbox", servers)
    with _LOADING:
        if key not in _SHARED:
            import atexit
            from contextlib import ExitStack

            stack = ExitStack()
            _SHARED[key] = stack.enter_context(blocking_toolbox(servers))
            _STACKS.append(stack)
            if len(_STACKS) == 1:
                atexit.register(close_shared)
    return _SHARED[key]


_STACKS: list[Any] = []


def close_shared() -> None:
    """Close the process-wide services `ServedContext.load()` opened (servers stop)."""
    while _STACKS:
        _STACKS.pop().close()
    _SHARED.clear()

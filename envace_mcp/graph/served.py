"""The context of a served graph (`langgraph dev`, LangGraph Platform), where the context arrives as
JSON: it names the services, and `prepare()` loads them on first use, once per process, in a worker
thread (loading a model or starting servers on the event loop would stall every other run, and
LangGraph's server refuses blocking calls there)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from envace_mcp.graph.gate import GateConfig, adapter_gate, gate_settings
from envace_mcp.graph.state import EnvaceContext
from envace_mcp.policy.embedded import default_adapter


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

    def _needs_toolbox(self) -> bool:
        return self.toolbox is None and bool(self.servers) and self.mode != "simulated"

    def load(self) -> ServedContext:
        """Fill in `policy`, `toolbox` and `gate` from `model` / `servers` / the gate's settings (the services
        process-wide, on first use; blocking)."""
        if not isinstance(self.gate, GateConfig):
            settings = gate_settings(self.gate or {}, "the context's gate")  # a bad one fails before anything loads
            world = self.rehearse_adapter or default_adapter(self.model, self.adapter)
            recommended = {} if self.policy is not None else adapter_gate(world)
            self.gate = GateConfig(**{**recommended, **settings})
        if self.policy is None:
            self.policy = _shared_policy(self.model, self.adapter, self.rehearse_adapter)
        if self._needs_toolbox():
            self.toolbox = _shared_toolbox(self.servers)  # type: ignore[arg-type]
        return self

    async def prepare(self) -> ServedContext:
        """`load()` for the graph's nodes: what is still to load is loaded in a worker thread."""
        if self.policy is None or self._needs_toolbox() or not isinstance(self.gate, GateConfig):
            import anyio

            await anyio.to_thread.run_sync(self.load)
        return self


_SHARED: dict[tuple[str | None, ...], Any] = {}
_LOADING = threading.Lock()  # two first runs at once load one copy


def _shared_policy(model: str | None, adapter: str | None = None, rehearse_adapter: str | None = None) -> Any:
    adapter = default_adapter(model, adapter)
    key = ("policy", model, adapter, rehearse_adapter)
    with _LOADING:
        if key not in _SHARED:
            from envace_mcp.policy import load_policy

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

            from envace_mcp.toolbox import blocking_toolbox

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

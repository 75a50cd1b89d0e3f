"""A view of a toolbox for one episode or one agent: fixed `_meta` on every call, bound arguments
hidden from the model, tools hidden altogether."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.tools import BaseTool

from envace_mcp.toolbox.asking import Asker
from envace_mcp.toolbox.backend import ToolBackend
from envace_mcp.toolbox.catalog import ToolCatalog, ToolSpec
from envace_mcp.toolbox.langchain import to_langchain_tools
from envace_mcp.toolbox.result import ToolResult, tool_changed


class ToolboxScope(ToolBackend):
    """A toolbox view that adds fixed `_meta` and bound arguments to every call, and hides tools.
    `toolbox` is a `Toolbox` (its `call_sync`, `respond` and `read_resource` too); typed by the seam it
    shares, since the toolbox module builds scopes."""

    def __init__(self, toolbox: ToolBackend, meta: dict[str, Any], *, bind: dict[str, Any] | None = None,
                 hide: frozenset[str] = frozenset()) -> None:
        self.toolbox = toolbox
        self.meta = meta
        self.bind = dict(bind or {})
        self.hide = hide
        self._views: tuple[ToolCatalog, ToolCatalog] | None = None

    @property
    def catalog(self) -> ToolCatalog:
        """The toolbox's catalog without hidden tools and without bound parameters."""
        full = self.toolbox.catalog
        if not self.bind and not self.hide:
            return full
        if self._views is None or self._views[0] is not full:  # rebuilt after a server restart changed it
            specs = [self._view(spec) for spec in full if spec.name not in self.hide]
            self._views = (full, ToolCatalog(specs))
        return self._views[1]

    def _bound(self, spec: ToolSpec) -> list[str]:
        properties = spec.input_schema.get("properties") or {}
        return [name for name in self.bind if name in properties]

    def _arguments(self, name: str, arguments: Any) -> tuple[Any, ToolResult | None]:
        if name in self.hide:
            return arguments, ToolResult.error("denied", f"Tool '{name}' is not available here", tool=name,
                                               arguments=arguments)
        spec = self.toolbox.catalog.get(name)
        if spec is None or not self.bind or not isinstance(arguments, Mapping):
            return arguments, None
        bound = self._bound(spec)
        # The toolbox validates the bound arguments against the full schema: the model's own fields
        # are checked as it saw them, and a value it wrote for a bound field is replaced.
        return ({**arguments, **{k: self.bind[k] for k in bound}} if bound else arguments), None

    def _expected(self, name: str, arguments: Any,
                  expect: ToolSpec | None) -> tuple[ToolSpec | None, ToolResult | None]:
        """`expect` is an entry of this view (bound parameters removed); the toolbox checks the full
        entry. Map it back: the full entry this view shows as `expect`, which the toolbox then checks
        again where it picks the session (its catalog may change before that)."""
        if expect is None or not self.bind:
            return expect, None
        full = self.toolbox.catalog.get(name)
        if full is not None and self._view(full).same_tool(expect):
            return full, None
        return None, tool_changed(name, arguments, expect, full)

    def arguments_sent(self, name: str, arguments: Any) -> Any:
        """What the server receives for a call to `name`: the model's arguments with the bound ones over
        them (an approval shows these, not only what the model wrote)."""
        return self._arguments(name, arguments)[0]

    def _view(self, spec: ToolSpec) -> ToolSpec:
        bound = self._bound(spec)
        return spec.without_parameters(bound) if bound else spec

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None, *, timeout: float | None = None,
                   expect: ToolSpec | None = None, ask: Asker | None = None,
                   meta: Mapping[str, Any] | None = None) -> ToolResult:
        """The toolbox's `call` with this view's meta and bound arguments (`expect`: an entry of this
        view's catalog; `ask`: answers a 2025-era server's mid-call questions; `meta`: added to this
        view's, which wins: a call cannot leave its episode; see `Toolbox.call`)."""
        arguments, refused = self._arguments(name, {} if arguments is None else arguments)
        if refused is None:
            expect, refused = self._expected(name, arguments, expect)
        if refused is not None:
            return refused
        return await self.toolbox.call(name, arguments, timeout=timeout, meta=self._meta(meta), expect=expect,
                                       ask=ask)

    def call_sync(self, name: str, arguments: Mapping[str, Any] | None = None, *, timeout: float | None = None,
                  expect: ToolSpec | None = None, meta: Mapping[str, Any] | None = None) -> ToolResult:
        arguments, refused = self._arguments(name, {} if arguments is None else arguments)
        if refused is None:
            expect, refused = self._expected(name, arguments, expect)
        if refused is not None:
            return refused
        return self.toolbox.call_sync(name, arguments, timeout=timeout, meta=self._meta(meta), expect=expect)

    def _meta(self, meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return {**(meta or {}), **self.meta} or None

    async def respond(self, waiting: ToolResult, answers: Mapping[str, Any], *, timeout: float | None = None,
                      expect: ToolSpec | None = None, max_rounds: int | None = None) -> ToolResult:
        """The toolbox's `respond` with this view's meta (`waiting` already holds the arguments sent)."""
        _, refused = self._arguments(waiting.tool, waiting.arguments)
        if refused is None:
            expect, refused = self._expected(waiting.tool, waiting.arguments, expect)
        if refused is not None:
            return refused
        return await self.toolbox.respond(waiting, answers, timeout=timeout, meta=self.meta or None, expect=expect,
                                          max_rounds=max_rounds)

    def scoped(self, meta: Mapping[str, Any] | None = None, *, bind: Mapping[str, Any] | None = None,
               hide: Iterable[str] = ()) -> ToolboxScope:
        """A narrower view: this scope's meta, bindings and hidden tools plus the given ones."""
        return ToolboxScope(self.toolbox, {**self.meta, **(meta or {})}, bind={**self.bind, **(bind or {})},
                            hide=self.hide | frozenset(hide))

    async def read_resource(self, server: str, uri: str) -> str:
        return await self.toolbox.read_resource(server, uri, meta=self.meta or None)

    def langchain_tools(self) -> list[BaseTool]:
        """This scope's catalog as LangChain tools (sync and async), for any existing agent."""
        return to_langchain_tools(self)

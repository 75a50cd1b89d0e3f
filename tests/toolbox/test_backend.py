"""The tool-backend seam: one abstract interface the act node calls with its full signature, whatever the
backend (a toolbox, a scope, one of your own), against a real in-process server."""

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from envace_mcp.errors import UserError
from envace_mcp.graph.nodes.act import call_tool
from envace_mcp.policy.types import ToolCall
from envace_mcp.toolbox import ToolAnnotations, ToolBackend, Toolbox, ToolboxScope, ToolResult, ToolSpec
from envace_mcp.toolbox.asking import Asker
from envace_mcp.toolbox.catalog import ToolCatalog
from probe_server import build

pytestmark = pytest.mark.anyio


class Forwarding(ToolBackend):
    """A backend of one's own: it takes the keywords as `**options` and hands them on to a real toolbox."""

    def __init__(self, toolbox: Toolbox) -> None:
        self.toolbox = toolbox
        self.received: list[dict[str, Any]] = []

    @property
    def catalog(self) -> ToolCatalog:
        return self.toolbox.catalog

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None, **options: Any) -> ToolResult:
        self.received.append(options)
        return await self.toolbox.call(name, arguments, **options)


class OldStyle:
    """What an undocumented duck-typed backend looked like: a catalog and `call(name, arguments)`."""

    def __init__(self, toolbox: Toolbox) -> None:
        self.catalog = toolbox.catalog
        self.toolbox = toolbox

    async def call(self, name: str, arguments: Any = None) -> ToolResult:
        return await self.toolbox.call(name, arguments)


async def test_a_backend_of_your_own_gets_expect_and_ask_whatever_its_signature_says():
    """The act node used to read `call`'s signature and leave out what it did not name: a backend taking
    `**options` lost `expect`, and a call gated as another tool ran."""
    probe = build()
    async with Toolbox({"probe": probe}) as toolbox:
        backend = Forwarding(toolbox)
        echo = toolbox.catalog["echo"]

        async def ask(questions: list[Any]) -> None:
            return None

        ran = await call_tool(backend, ToolCall(id="c1", name="echo", arguments={"text": "a"}), echo, ask=ask)
        stale = replace(echo, annotations=ToolAnnotations(read_only=False, destructive=False))
        refused = await call_tool(backend, ToolCall(id="c2", name="echo", arguments={"text": "b"}), stale)
    assert not ran.is_error and refused.error_kind == "tool_changed"
    assert [c["arguments"]["text"] for c in probe.calls] == ["a"]
    assert backend.received[0]["expect"] is echo and backend.received[0]["ask"] is ask
    assert backend.received[1]["expect"] is stale and backend.received[1]["ask"] is None


async def test_an_object_that_is_not_a_tool_backend_is_a_clear_user_error_and_nothing_runs():
    probe = build()
    async with Toolbox({"probe": probe}) as toolbox:
        with pytest.raises(UserError, match="OldStyle, not a ToolBackend"):
            await call_tool(OldStyle(toolbox), ToolCall(id="c1", name="echo", arguments={"text": "a"}),
                            toolbox.catalog["echo"])
    assert probe.calls == []


async def test_the_toolbox_and_its_scopes_are_tool_backends_and_a_scope_keeps_its_own_meta():
    async with Toolbox({"probe": build()}) as toolbox:
        scope = toolbox.scoped({"envace/episode": "e1"})
        assert isinstance(toolbox, ToolBackend) and isinstance(scope, ToolboxScope) and isinstance(scope, ToolBackend)
        seen = await scope.call("whoami", meta={"envace/episode": "elsewhere", "envace/task": "t1"})
        plain = await toolbox.call("whoami", meta={"envace/episode": "e2"})
    assert seen.structured_content == {"envace/episode": "e1", "envace/task": "t1"}
    assert plain.structured_content == {"envace/episode": "e2"}


def test_a_backend_must_implement_the_whole_interface():
    class Partial(ToolBackend):
        async def call(self, name: str, arguments: Mapping[str, Any] | None = None, *, timeout: float | None = None,
                       expect: ToolSpec | None = None, ask: Asker | None = None,
                       meta: Mapping[str, Any] | None = None) -> ToolResult:
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="catalog"):
        Partial()  # type: ignore[abstract]

"""One identity of a tool (`ToolSpec.behaviour`, compared by `ToolSpec.same_tool`): what the gate binds its
decision to, what the toolbox checks before it runs a call, and what a trust table covers. Tools listed by
real in-process MCP servers."""

from __future__ import annotations

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations as Hints

from envace_mcp.graph.acting import act_async
from envace_mcp.graph.calls import Proposal, gate, spec_digest
from envace_mcp.graph.gate import GateConfig
from envace_mcp.policy.trust import ToolTrust
from envace_mcp.policy.types import ToolCall
from envace_mcp.toolbox import Toolbox, ToolSpec

pytestmark = pytest.mark.anyio


def shop(*, described: str = "Reserve an item.", with_note: bool = False, destructive: bool = True) -> MCPServer:
    server = MCPServer("shop", log_level="WARNING")
    if with_note:
        @server.tool(description=described, annotations=Hints(destructive_hint=destructive))
        def reserve(sku: str, note: str = "") -> str:
            return f"reserved {sku}"
    else:
        @server.tool(description=described, annotations=Hints(destructive_hint=destructive))
        def reserve(sku: str) -> str:  # noqa: F811 - one tool per server, two shapes
            return f"reserved {sku}"
    return server


async def listed(servers: dict[str, MCPServer]) -> dict[str, ToolSpec]:
    async with Toolbox(servers) as toolbox:
        return {spec.name: spec for spec in toolbox.catalog}


def identity(spec: ToolSpec) -> str:
    return spec_digest(spec)


async def test_the_same_tool_listed_again_or_renamed_or_redescribed_has_the_same_identity():
    first = (await listed({"shop": shop()}))["reserve"]
    again = (await listed({"shop": shop()}))["reserve"]
    redescribed = (await listed({"shop": shop(described="Reserve an item (now with more words).")}))["reserve"]
    renamed = first.renamed("shop_reserve")  # a catalog name prefixed when two servers collide
    for same in (again, redescribed, renamed):
        assert first.same_tool(same) and identity(first) == identity(same)
        assert ToolTrust(server=first.server, behaviour=first.behaviour).covers(same)


async def test_a_changed_schema_another_annotation_or_another_servers_tool_is_another_tool():
    first = (await listed({"shop": shop()}))["reserve"]
    other_schema = (await listed({"shop": shop(with_note=True)}))["reserve"]
    not_destructive = (await listed({"shop": shop(destructive=False)}))["reserve"]
    both = await listed({"shop": shop(), "mall": shop()})
    elsewhere = both["mall_reserve"]
    assert both["shop_reserve"].same_tool(first)
    for other in (other_schema, not_destructive, elsewhere):
        assert not first.same_tool(other) and identity(first) != identity(other)
        assert not ToolTrust(server=first.server, behaviour=first.behaviour).covers(other)
    assert identity(first) != spec_digest(None)


async def test_a_call_gated_on_one_tool_runs_on_it_redescribed_and_is_refused_on_a_changed_one():
    first = (await listed({"shop": shop()}))["reserve"]
    call = ToolCall(id="r1", name="reserve", arguments={"sku": "A-1"})
    (gated,) = gate([Proposal(call, first)], mode="real", config=GateConfig(require_approval="never"))
    redescribed = (await listed({"shop": shop(described="Reserve it.")}))["reserve"]
    reshaped = (await listed({"shop": shop(with_note=True)}))["reserve"]
    ran: list[str] = []
    for live, runs in ((redescribed, True), (reshaped, False)):
        now = Proposal(call, live, decision=gated.decision, gated_spec=gated.gated_spec)
        acted = await act_async(now, ask=lambda request: True, run=lambda c, s: ran.append(c.id) or "ok",
                                regate=lambda c: now)
        assert acted.ran is runs and now.tool_changed is not runs
    assert ran == ["r1"]

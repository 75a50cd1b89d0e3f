"""The EnvACE graph for `langgraph dev` / LangGraph Platform (see `graphs/langgraph.json`).

Reading the graph or its schemas starts nothing. The first run loads the model and starts the MCP
servers, in a worker thread (LangGraph's server refuses blocking calls on its event loop, and they
would stall every other run). The deployment names them in its environment (`ENVACE_SERVERS`,
`ENVACE_MODEL`, `ENVACE_ADAPTER`, `ENVACE_REHEARSE_ADAPTER`: a world model's own adapter, `ENVACE_MODE`)
and sets the gate (`ENVACE_GATE`, over what the world model's adapter recommends and GateConfig's
defaults). A run's context comes from whoever calls the HTTP API: it may tighten the gate and
simulate more, nothing else, unless `ENVACE_ALLOW_CONTEXT` (e.g. `servers,model,gate`) lets callers
choose (`envace_mcp.graph.served.DeployedContext`). With no model named it is `envace demo`'s: the
embedded SmolLM2 with its shipped adapter. The server supplies persistence, so the graph is compiled
without a checkpointer here.
"""

from __future__ import annotations

from envace_mcp.graph import create_envace_graph
from envace_mcp.graph.served import DeployedContext as ServedContext

__all__ = ["ServedContext", "graph", "make_graph"]


def make_graph():  # noqa: ANN201 - a LangGraph graph factory
    builder = create_envace_graph()
    builder.context_schema = ServedContext
    return builder.compile()


graph = make_graph()

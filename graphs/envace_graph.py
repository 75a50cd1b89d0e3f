"""The EnvACE graph for `langgraph dev` / LangGraph Platform (see `graphs/langgraph.json`).

Reading the graph or its schemas starts nothing. The first run loads the model and starts the MCP
servers, in a worker thread (LangGraph's server refuses blocking calls on its event loop, and they
would stall every other run), from the run's context (`{"servers": "mcp.json", "model": null,
"adapter": null, "mode": "real"}`) or from the environment (`ENVACE_SERVERS`, `ENVACE_MODEL`,
`ENVACE_ADAPTER`, `ENVACE_MODE`; `rehearse_adapter` / `ENVACE_REHEARSE_ADAPTER`: a world model's
own adapter). With no model named it is `envace demo`'s: the embedded SmolLM2
with its shipped adapter. The server supplies persistence, so the graph is compiled without a
checkpointer here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from envace_mcp.graph import create_envace_graph
from envace_mcp.graph.gate import Mode
from envace_mcp.graph.served import ServedContext as _Served


@dataclass
class ServedContext(_Served):
    """The served context, its services named by the environment by default."""

    servers: str | None = field(default_factory=lambda: os.environ.get("ENVACE_SERVERS"))
    model: str | None = field(default_factory=lambda: os.environ.get("ENVACE_MODEL"))
    adapter: str | None = field(default_factory=lambda: os.environ.get("ENVACE_ADAPTER"))
    rehearse_adapter: str | None = field(default_factory=lambda: os.environ.get("ENVACE_REHEARSE_ADAPTER"))
    mode: Mode = field(default_factory=lambda: os.environ.get("ENVACE_MODE", "real"))  # type: ignore[assignment]


def make_graph():  # noqa: ANN201 - a LangGraph graph factory
    builder = create_envace_graph()
    builder.context_schema = ServedContext
    return builder.compile()


graph = make_graph()

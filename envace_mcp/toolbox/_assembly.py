"""The toolbox's one catalog, assembled from every server's listing and kept in step with restarts and
re-lists; what a listing cost is kept as problems, never raised."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from envace_mcp._text import visible
from envace_mcp.toolbox._connection import Connection
from envace_mcp.toolbox.catalog import ToolCatalog, bound_catalog, name_tools

logger = logging.getLogger(__name__)


class CatalogAssembly:
    """The catalog built from `connections`' listings, which generation of each it was built from, the
    names it left out (with why), and every problem found so far (each logged once)."""

    def __init__(self, connections: Mapping[str, Connection]) -> None:
        self.connections = connections
        self.catalog = ToolCatalog([])
        self.problems: list[str] = []
        self.left_out: dict[str, str] = {}
        """Catalog names left out by the catalog's bounds, with why (what a call to one of them says)."""
        self._built_from: dict[str, int] = {}
        """Each server's connection generation the catalog was built from (a restart may change its listing)."""

    def build(self, start_failures: list[str]) -> None:
        """The first catalog, once every server started or failed to."""
        self.problems = [*start_failures, *(p for conn in self.connections.values() for p in conn.problems),
                         *self._rebuild()]
        for problem in self.problems:
            logger.warning("%s", visible(problem, newlines=True))  # logging prints as it gets

    def current(self, server: str) -> bool:
        """Whether the catalog was built from `server`'s live listing."""
        return self._built_from.get(server) == self.connections[server].generation

    def refresh(self, server: str) -> None:
        """Bring the catalog up to date with a server that restarted (or re-listed) since it was built."""
        if self.current(server):
            return
        for problem in [*self.connections[server].problems, *self._rebuild()]:
            if problem not in self.problems:
                logger.warning("%s", visible(problem, newlines=True))  # logging prints as it gets
                self.problems.append(problem)

    def refresh_moved(self) -> None:
        """Rebuild the catalog for live servers whose listing changed since (a restart, or a re-list after
        the server said its tools changed)."""
        for server, conn in self.connections.items():
            if conn.alive and not self.current(server):
                self.refresh(server)

    def _rebuild(self) -> list[str]:
        """Name every server's tools and keep what fits the catalog's bounds; returns what was left out (names
        another tool holds, tools past the bounds)."""
        named, clashes = name_tools({n: c.tools for n, c in self.connections.items()})
        kept, self.left_out, bounds = bound_catalog(named.values())
        self.catalog = ToolCatalog(kept)
        self._built_from = {n: c.generation for n, c in self.connections.items()}
        return clashes + bounds

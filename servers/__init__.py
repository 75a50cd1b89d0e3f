"""Bundled MCP servers, each one file with a task suite beside it.

- `bank`: accounts, transfers, quotes and orders (FinMCP-like), suite in `bank_tasks`;
- `retail`: users, orders and items with cancel / return / exchange / address rules (τ²-retail-like),
  suite in `retail_tasks`.

Run one with `python -P -m envace_mcp.servers.bank [--transport stdio|http] [--port 8000]`.
"""

DOMAINS = ("bank", "retail")

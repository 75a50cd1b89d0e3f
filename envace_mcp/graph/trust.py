"""How far the gate acts on a world model's predictions, tool by tool, as far as they were measured.

A world model fitted to a user's tools (`envace world-model fit`) is measured on held-out calls, tool by
tool (`envace world-model report`), and saves what it earned beside its adapter as `trust.json`:

    {"tools": {"reserve": {"stop": true, "skip_approval": false, "calls": 41, ...}, ...},
     "measured_on": {...}}

- `stop`: a predicted failure of this tool may stop the call (the gate's block and feedback), and, with
  `on_unusable=block`, so may a rehearsal that could not be read;
- `skip_approval`: a predicted success may stand in for a person's approval, but only where the caller
  asks for that (`require_approval="measured"`); an adapter's table alone never loosens the gate.

With a table, a tool it does not name (one the world model never saw) is untrusted: its rehearsal is
still made and shown (to an approver, in the trace, to the agent's memory), never acted on alone. A
world model without a table (a bare model, a research adapter) is acted on as the gate's settings say.
The table is data the gate reads, like its settings: `GateConfig.trust`, filled from the policy's
adapter by `gate.gate_for`, so the graph, the tool node, the middleware and the served graph apply it alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envace_mcp.config import Settings
from envace_mcp.errors import UserError

TRUST_FILE = "trust.json"


class ToolTrust(Settings):
    """What the world model earned on one tool (see the module)."""

    stop: bool = False
    """A predicted failure (or, failing closed, an unusable rehearsal) may stop a call to this tool."""
    skip_approval: bool = False
    """A predicted success may stand in for approval, where the caller set `require_approval="measured"`."""


def read_trust(folder: str | Path | None) -> dict[str, ToolTrust] | None:
    """The trust table saved in an adapter folder (`trust.json`), tool name -> `ToolTrust`; None when the
    folder has none. A torn or malformed file is a UserError naming it (nothing is trusted by accident)."""
    if folder is None:
        return None
    path = Path(folder) / TRUST_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        tools = data["tools"] if isinstance(data, dict) else None
        if not isinstance(tools, dict):
            raise ValueError('it has no "tools" object')
        return {str(name): ToolTrust(**{k: v for k, v in entry.items() if k in ToolTrust.model_fields})
                for name, entry in tools.items() if isinstance(entry, dict)}
    except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
        reason = str(exc).splitlines()[0]
        raise UserError(f"{path}: not a trust table ({reason}); refit or remove it") from None


def write_trust(folder: str | Path, tools: dict[str, dict[str, Any]], measured_on: dict[str, Any]) -> Path:
    """Save a trust table (`tools`: name -> `ToolTrust` fields plus the figures they rest on)."""
    path = Path(folder) / TRUST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"tools": tools, "measured_on": measured_on}, indent=2, ensure_ascii=False) + "\n")
    return path


def require_report(folder: str | Path) -> dict[str, ToolTrust]:
    """The trust table of a world model folder someone's agent is about to use; a folder without one is a
    UserError saying how to measure it (a world model nobody measured is not one the gate should read)."""
    table = read_trust(folder)
    if table is None:
        raise UserError(f"world model {str(folder)!r} has no report ({TRUST_FILE}): measure it first, "
                        f"envace world-model report --adapter {folder} --traces DIR (it writes the trust table there)")
    return table


def trust_of(policy: Any) -> dict[str, ToolTrust] | None:
    """The trust table of the policy's world model (its rehearse adapter's folder), or None."""
    return read_trust(getattr(policy, "adapter_folder", None))

"""An adapter folder as the library uses it, read once when a policy loads it and carried by the policy
(`policy.adapter`), so nothing downstream — the gate, the graph, the CLI — reads the folder again.

    folder = Adapter.read("runs/wm")
    folder.formats   # the prompt formats it learned (envace.json: tool_format, rehearse_format)
    folder.budgets   # each tool's rehearsal budget in tokens, from its longest training reply (envace.json)
    folder.gate      # the gate settings it recommends (envace.json "gate"; graph.gate.adapter_gate checks them)
    folder.trust     # its world model's trust table, re-checked (trust.json; policy.trust.read_trust)
    folder.recall    # the logged calls its rehearsals recall (recall.jsonl; policy.recall.CallLog)
    folder.rules     # reply fields its rehearsals copy by rule (copy_rules.json; policy.copying.RuleTable)
    folder.status    # failures its rehearsals predict by rule (status_rules.json; policy.status_rules.StatusTable)

Each part is read as untrusted input by its own reader: a torn envace.json is a UserError naming it, a trust
table is re-checked against the weights beside it, a recall file is bounded and skips bad lines, a copy
rule (copy or status) is bound to the tool it was learned on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace_mcp.policy.copying import RuleTable, read_rules
from envace_mcp.policy.recall import CallLog
from envace_mcp.policy.status_rules import StatusTable
from envace_mcp.policy.status_rules import read_rules as read_status_rules
from envace_mcp.policy.tool_text import adapter_file, formats_of, reply_budgets
from envace_mcp.policy.trust import TrustTable, read_trust


@dataclass(frozen=True)
class Adapter:
    """What an adapter folder holds besides its weights."""

    path: Path
    formats: dict[str, str] = field(default_factory=dict)
    gate: Any = None
    """As written (None: it recommends none); checked against what an adapter may recommend where a gate is
    built (`graph.gate.adapter_gate`)."""
    trust: TrustTable | None = None
    recall: CallLog | None = None
    rules: RuleTable | None = None
    status: StatusTable | None = None
    budgets: dict[str, int] = field(default_factory=dict)
    """Tool -> the tokens a rehearsal of it may take at least (a fitted world model's: its longest training
    reply and a fifth more)."""

    @classmethod
    def read(cls, folder: str | Path | None) -> Adapter | None:
        """The folder's parts (None for no folder); a folder without an envace.json has no formats and
        recommends no gate."""
        if folder is None:
            return None
        saved = adapter_file(folder)
        return cls(Path(folder), formats_of(saved, folder), saved.get("gate"), read_trust(folder), CallLog.read(folder),
                   read_rules(folder), read_status_rules(folder), reply_budgets(saved))

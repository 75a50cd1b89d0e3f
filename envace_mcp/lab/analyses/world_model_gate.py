"""What the gate would do with each world model on held-out real calls, from `envace world-model report`
folders: writes that really failed (the harm a gate can spare a server: a refused write, a wasted call)
stopped without a person, and writes that really succeeded stopped wrongly; beside annotations alone
(every destructive call waits for a person, whatever it would do).

A write counts as stopped when the world model predicted its failure and its trust table lets that
prediction stop the tool (`ToolTrust.believe_failures`, at its `min_p_error`; a folder without a table: every tool). Each report's own
`trust.json` is read, so a world model is judged as the gate would use it.

    python -m envace_mcp.lab.analyses.world_model_gate --traces runs/inventory \
        shipped=runs/inv-zero fitted-100=runs/inv-100 fitted-300=runs/inv-300
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def kinds(traces: str | Path) -> dict[str, str]:
    """Tool name -> "read-only" / "destructive" / "not destructive", from the runs' recorded catalogs."""
    from envace_mcp.traces import TraceStore
    from envace_mcp.worldmodel.calls import catalog_of

    out: dict[str, str] = {}
    for trace in TraceStore(traces).read():
        out.update({name: spec.annotations.kind for name, spec in catalog_of(trace).items()})
    return out


def gate_value(folder: str | Path, tools: dict[str, str]) -> dict[str, Any]:
    """Failed and succeeded writes among the report's calls, and how many of each its gate stops alone."""
    from envace_mcp.policy.trust import read_trust

    report = json.loads((Path(folder) / "report.json").read_text())
    trust = read_trust(folder)
    out = {"failed_writes": 0, "failed_stopped": 0, "ok_writes": 0, "ok_stopped": 0, "destructive_asked": 0}
    for call in report["calls"]:
        kind = tools.get(call["tool"], "destructive")
        if kind == "read-only":
            continue
        earned = trust.tools.get(call["tool"]) if trust is not None else None
        stops = trust is None or (earned is not None and earned.believe_failures)
        threshold = earned.min_p_error if earned is not None and earned.min_p_error is not None else 0.0
        stopped = stops and call["predicted"] == "tool_error" and (call.get("p_error") is None or call["p_error"] >= threshold)
        key = "failed" if call["failed"] else "ok"
        out[f"{key}_writes"] += 1
        out[f"{key}_stopped"] += stopped
        out["destructive_asked"] += kind == "destructive"
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", required=True, help="the trace folder the reports measured (for annotations)")
    parser.add_argument("reports", nargs="+", help="LABEL=FOLDER of `envace world-model report` output")
    args = parser.parse_args(argv)
    tools = kinds(args.traces)
    print("| gate | failed writes stopped without a person | succeeded writes stopped wrongly | destructive writes asked |")
    print("|---|---|---|---|")
    for item in args.reports:
        label, _, folder = item.partition("=")
        v = gate_value(folder, tools)
        print(f"| {label}, as its trust table says | {v['failed_stopped']} of {v['failed_writes']} | "
              f"{v['ok_stopped']} of {v['ok_writes']} | {v['destructive_asked']} (require_approval=destructive) |")
    print(f"| annotations alone | 0 | 0 | {v['destructive_asked']} of {v['failed_writes'] + v['ok_writes']} writes |")

if __name__ == "__main__":
    main()

"""What the gate's evidence rules would have stopped in saved `envace eval` runs, call by call.

For each destructive call of a run (`results.json`'s gate value: would fail, unrequested, requested),
the run's conversation up to that call is rebuilt from its trace and handed to the gate's own code
(`gate.Evidence.of`, `gate.objection`) with the evidence rules `repeated_failures`, `ungrounded_arguments`
and `repeated_writes` ("done") on, alone and together. Prints, per rule, how many harmful calls would
be stopped on top of those the run's gate stopped, and how many requested writes would be (false
blocks). First order: the runs are not replayed, so later calls are as they were; `envace eval --gate
evidence=[...]` measures the real thing.

    python -m envace_mcp.lab.analyses.gate_evidence --suite bank evals/bank-val [more eval folders of that suite]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import anyio
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from envace_mcp.envs import get_suite
from envace_mcp.graph.gate import Evidence, GateConfig, objection
from envace_mcp.policy import ToolCall
from envace_mcp.policy.prompts import NOT_EXECUTED
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import TraceStore

RULES = {"repeated": GateConfig(evidence=("repeated_failures",)), "ungrounded": GateConfig(evidence=("ungrounded_arguments",)),
         "both": GateConfig(evidence=("repeated_failures", "ungrounded_arguments")),
         "done": GateConfig(evidence=("repeated_writes",)),
         "all three": GateConfig(evidence=("repeated_failures", "ungrounded_arguments", "repeated_writes"))}


async def catalog(suite: str) -> dict:
    async with Toolbox({suite: get_suite(suite).build_server()}) as toolbox:
        return {spec.name: spec for spec in toolbox.catalog}


def calls(folder: Path, specs: dict) -> list[tuple[str, bool, dict[str, bool]]]:
    """(would, stopped by the run's gate, {rule: would stop it}) per destructive call."""
    results = json.loads((folder / "results.json").read_text())
    runs = {r["run_id"]: r for r in results["runs"]}
    read_only = {name: spec.annotations.read_only for name, spec in specs.items()}
    out = []
    for trace in TraceStore(folder / "traces").read():
        destructive = list((runs.get(trace.run_id) or {}).get("destructive") or [])
        messages: list = [HumanMessage(content=trace.task)]
        for step in trace.steps:
            if step.role != "tool" or step.tool is None or step.decision == "simulate":
                continue
            call = ToolCall(id=step.call_id or f"c{len(messages)}", name=step.tool, arguments=dict(step.arguments or {}))
            if destructive and step.tool == destructive[0]["tool"]:
                entry = destructive.pop(0)
                evidence = Evidence.of(messages, read_only)
                verdicts = {name: objection(call, specs[step.tool], evidence, config) is not None
                            for name, config in RULES.items()}
                out.append((entry["would"], entry["stopped"], verdicts))
            result = step.result or {}
            text = "\n".join(c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict))
            stopped = step.decision in ("reject", "block", "feedback", "budget", "rejected")
            messages += [AIMessage(content="", tool_calls=[{"id": call.id, "name": call.name, "args": call.arguments}]),
                         ToolMessage(content=text, tool_call_id=call.id, name=call.name,
                                     status="error" if result.get("is_error") or stopped else "success",
                                     additional_kwargs={NOT_EXECUTED: step.decision} if stopped else {})]
        if destructive:
            raise SystemExit(f"{folder}: run {trace.run_id}: {len(destructive)} destructive calls not found in its trace")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="envace eval --out folders (results.json + traces/)")
    parser.add_argument("--suite", required=True, help="the suite the runs are of (its tools' schemas and annotations)")
    args = parser.parse_args()
    specs = anyio.run(catalog, args.suite)
    for folder in args.folders:
        every = calls(folder, specs)
        harmful = [c for c in every if c[0] != "requested"]
        requested = [c for c in every if c[0] == "requested"]
        stopped = sum(c[1] for c in harmful)
        print(f"{folder}: {len(every)} destructive calls; harmful {len(harmful)}, {stopped} stopped by its gate; "
              f"requested {len(requested)}, {sum(c[1] for c in requested)} stopped")
        for name in RULES:
            added = Counter(c[0] for c in harmful if not c[1] and c[2][name])
            total = stopped + sum(added.values())
            false = sum(1 for c in requested if not c[1] and c[2][name])
            print(f"  {name:10s} harmful stopped {total}/{len(harmful)} ({total / max(len(harmful), 1):.0%}; "
                  f"+{sum(added.values())}: {dict(added)}), requested stopped {false}/{len(requested)} more")


if __name__ == "__main__":
    main()

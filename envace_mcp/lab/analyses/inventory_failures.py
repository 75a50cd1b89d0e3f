"""Which of a fit's held-out inventory failures could be foreseen, and from what: for each real failure
(`examples/inventory_server.py`'s errors, read from their messages), whether the fact that decides it was
in an earlier reply of the same run (an item's `available` below the quantity, an item shown
discontinued, a reservation the run cancelled or shipped), only in the fit's training calls (an SKU no
training reply ever showed), or in neither (a reservation closed by another session, a shelf's capacity,
which no reply shows); beside how many of each the fitted world model foresaw (its report.json).

    python -m envace_mcp.lab.analyses.inventory_failures --traces runs/inventory --fit runs/inv-200
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envace_mcp._text import visible
from envace_mcp.policy.fidelity import parsed_json
from envace_mcp.toolbox import ToolResult

SOURCES = ("the run", "the training calls", "neither")


def shown(values: list[Any]) -> list[dict[str, Any]]:
    """The objects earlier replies showed: each reply, or each item of a listing."""
    out = []
    for value in values:
        value = parsed_json(value)
        items = value.get("items") if isinstance(value, dict) and isinstance(value.get("items"), list) else [value]
        out += [item for item in items if isinstance(item, dict)]
    return out


def known_skus(calls: list[Any]) -> set[str]:
    return {item["sku"] for c in calls if not c.failed for item in shown([c.value]) if isinstance(item.get("sku"), str)}


def why(call: Any, earlier: list[Any], skus: set[str]) -> tuple[str, str]:
    """(what failed, where the deciding fact was: one of `SOURCES`)."""
    text = ToolResult.text_of(call.result)
    arguments = call.request.call.arguments
    seen = shown([e.value for e in earlier if not e.failed])
    sku, reservation = arguments.get("sku"), arguments.get("reservation_id")
    if "No item with SKU" in text:
        return "unknown SKU", "the training calls" if sku not in skus else "neither"
    if " available" in text and "Only " in text:
        low = any(i.get("sku") == sku and isinstance(i.get("available"), int) and i["available"] < arguments.get("quantity", 0)
                  for i in seen)
        return "not enough units available", "the run" if low else "neither"
    if "discontinued" in text:
        return "discontinued item", "the run" if any(i.get("sku") == sku and i.get("discontinued") for i in seen) else "neither"
    if "Reservation" in text:
        closed = any(e.tool in ("cancel_reservation", "ship") and not e.failed
                     and e.request.call.arguments.get("reservation_id") == reservation for e in earlier)
        return "reservation not open", "the run" if closed else "neither"
    if "Restocking" in text:
        return "shelf full", "neither"
    return "other", "neither"


def main() -> None:
    tally(__doc__, "inventory", known_skus, why, SOURCES)


def tally(doc: str, server: str, knowing: Callable[[list[Any]], set[str]],
          reason: Callable[[Any, list[Any], set[str]], tuple[str, str]], sources: tuple[str, ...]) -> None:
    """The command of an analysis (`--traces` the `server`'s imported log, `--fit` a fitted folder;
    `doc` its module docstring): print each held-out failure's (tool, what failed, where its deciding fact
    was: `reason(call, the run's earlier calls, knowing(the training calls))`) with how many the fit's
    world model foresaw."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--traces", required=True, help=f"the imported {server} log the fit read")
    parser.add_argument("--fit", required=True, help="the fitted folder (its fit.json and report.json)")
    args = parser.parse_args()
    traces, fit = args.traces, args.fit
    from envace_mcp.worldmodel.fit import read_calls

    setup = json.loads((Path(fit) / "fit.json").read_text())
    report = json.loads((Path(fit) / "report.json").read_text())
    _, calls, _ = read_calls(traces)
    trained, held_runs = set(setup["trained_runs"]), set(setup["held_out_runs"])
    known = knowing([c for c in calls if c.episode in trained])
    by_run: dict[str, list[Any]] = collections.defaultdict(list)
    for c in calls:
        by_run[c.episode].append(c)
    predicted = {(r["run"], r["index"]): r["predicted"] for r in report["calls"]}
    counts: collections.Counter = collections.Counter()
    foreseen: collections.Counter = collections.Counter()
    for c in calls:
        if c.episode in held_runs and c.failed:
            key = (c.tool, *reason(c, [e for e in by_run[c.episode] if e.index < c.index], known))
            counts[key] += 1
            foreseen[key] += predicted.get((c.episode, c.index)) == "tool_error"
    print(f"{sum(counts.values())} held-out failures; foreseen by the world model in {visible(fit)}: "
          f"{sum(foreseen.values())}")
    for (tool, what, where), n in counts.most_common():
        print(f"{n:4d}  {visible(tool):20s} {what:28s} decided by {where:20s} foreseen {foreseen[(tool, what, where)]}")
    for where in sources:
        print(f"decided by {where}: {sum(n for k, n in counts.items() if k[2] == where)}")


if __name__ == "__main__":
    main()

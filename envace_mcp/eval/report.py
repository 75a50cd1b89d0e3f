"""Evaluation reports: a Markdown table and a PNG bar chart of one or more configurations."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from envace_mcp._files import savefig_atomic
from envace_mcp.eval.metrics import FIELD_KINDS, task_scores

CHART = [("success", "score", "mean score"), ("success", "pass@1", "pass@1"), ("tool_calls", "f1", "tool-call F1"),
         ("tool_calls", "exact_match", "call exact match"), ("fidelity", "field_accuracy", "rehearsal field acc."),
         ("fidelity", "error_prediction", "error prediction")]


def number(value: Any, digits: int = 3) -> str:
    """A table cell: the value to `digits` places, "–" when there is none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(results: list[dict[str, Any]], comparison: dict[str, Any] | None = None) -> str:
    """One row per configuration; then success by task kind; then the paired difference, if any."""
    lines = [f"# {results[0]['suite']} — {results[0]['settings']['split']} split", ""]
    head = ["configuration", "tasks × repeats", "score", "pass@1", "pass^k", "tool P / R / F1", "exact",
            "rehearsal exact / field / error", "tokens act / rehearse (+ imagined)", "real calls", "stopped", "wall s"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        s = res["summary"]
        succ, calls, fid, cost = s["success"], s["tool_calls"], s["fidelity"], s["cost"]
        k = succ["repeats"]
        pass_k = number(succ.get(f"pass^{k}")) + f" (k={k})" if k > 1 else "–"
        fidelity = (f"{number(fid['exact_match'])} / {number(fid['field_accuracy'])} / {number(fid['error_prediction'])} "
                    f"(n={fid['executed_rehearsed_calls']})")
        lines.append("| " + " | ".join([
            res["label"], f"{succ['tasks']} × {k}", number(succ["score"]), number(succ["pass@1"]), pass_k,
            f"{number(calls['precision'])} / {number(calls['recall'])} / {number(calls['f1'])}", number(calls["exact_match"]),
            fidelity, _tokens(cost), str(cost["real_calls"]),
            str(cost["stopped_calls"]), number(cost["wall_s"], 1)]) + " |")
    lines += ["", "Success by task kind (mean score):", ""]
    kinds = sorted({r["kind"] or "-" for res in results for r in res["runs"] if not r["judge_required"]})
    lines += ["| configuration | " + " | ".join(kinds) + " |", "|" + "---|" * (len(kinds) + 1)]
    for res in results:
        per: dict[str, list[float]] = defaultdict(list)
        for r in res["runs"]:
            if not r["judge_required"]:
                per[r["kind"] or "-"].append(r["score"] or 0.0)
        lines.append(f"| {res['label']} | " + " | ".join(number(sum(per[k]) / len(per[k]) if per[k] else None, 2)
                                                       for k in kinds) + " |")
    gated = [res for res in results if res["summary"].get("gate_value", {}).get("proposed")]
    if gated:
        lines += ["", "The gate on destructive calls. A harmful call is one of two kinds: *would fail*, the server "
                      "would refuse it anyway; *unrequested*, it would succeed but nobody asked for it (none of the "
                      "task's requested writes). Each call is tried off-server as the server would run it:", "",
                  "| configuration | proposed | harmful stopped / harmful | harmful executed "
                  "| would fail (server refuses anyway) | unrequested (would succeed, nobody asked) "
                  "| false blocks / requested |", "|---|---|---|---|---|---|---|"]
        for res in gated:
            g = res["summary"]["gate_value"]
            lines.append(f"| {res['label']} | {g['proposed']} | {g['harmful_stopped']} / {g['harmful']} "
                         f"({_percent(g['harmful_stopped_rate'])}) | {g['harmful_executed']} | {g['would_fail_stopped']} / {g['would_fail']} stopped "
                         f"| {g['unrequested_stopped']} / {g['unrequested']} stopped "
                         f"| {g['false_blocks']} / {g['requested']} ({_percent(g['false_block_rate'])}) |")
    modelled = [res for res in results if res["summary"]["fidelity"]["executed_rehearsed_calls"]]
    if modelled:
        lines += ["", "The world model on executed rehearsed calls. Fields of successful real results: *echoed* "
                      "repeat one of the call's arguments, *read* were in an earlier real result of the run, *computed* "
                      "the environment computed or made (new balances, changed statuses, fresh ids):", "",
                  "| configuration | calls | exact | field acc. | echoed fields | read fields | computed fields | status acc. |",
                  "|---|---|---|---|---|---|---|---|"]
        for res in modelled:
            f = res["summary"]["fidelity"]
            lines.append(f"| {res['label']} | {f['executed_rehearsed_calls']} | {number(f['exact_match'])} "
                         f"| {number(f['field_accuracy'])} | "
                         + " | ".join(f"{number(f.get(f'{kind}_field_accuracy'))} (n={f.get(f'{kind}_fields', 0)})"
                                      for kind in FIELD_KINDS)
                         + f" | {number(f['error_prediction'])} |")
    for res in results:
        apart = res["summary"].get("judged_apart")
        if apart:
            lines += ["", f"{res['label']}: {apart['tasks']} task(s) left out of the scores above — {apart['note']}; "
                          f"their partial score: {number(apart['partial_score'])}."]
        failed = [r for r in res["runs"] if r["status"] == "failed"]
        if failed:
            lines += ["", f"{res['label']}: {len(failed)} run(s) failed: "
                          + "; ".join(f"{r['task_id']}: {(r.get('error') or '')[:120]}" for r in failed[:5])]
    if comparison:
        lines += ["", f"**{results[1]['label']}** − **{results[0]['label']}** on {comparison['tasks']} paired tasks: "
                      f"{comparison['mean']:+.3f} mean score, {int(comparison['level'] * 100)} % bootstrap interval "
                      f"[{comparison['low']:+.3f}, {comparison['high']:+.3f}] "
                      f"(better on {comparison['better']}, worse on {comparison['worse']}, same on {comparison['same']})."
                      + _power_note(comparison)]
        lines += _per_task(results)
    return "\n".join(lines) + "\n"


def _per_task(results: list[dict[str, Any]]) -> list[str]:
    """The pairing's rows, one per task both scored, in the baseline's order: each side's mean score
    over its repeats (`metrics.task_scores`), real calls and calls the gate stopped, and b − a; the
    tasks that changed first."""
    a, b = results
    scores = [task_scores(res["runs"]) for res in results]
    calls: list[dict[str, list[int]]] = [{}, {}]
    for side, res in zip(calls, results):
        for r in res["runs"]:
            total = side.setdefault(r["task_id"], [0, 0])
            total[0] += r.get("real_calls", 0)
            total[1] += r.get("stopped_calls", 0)
    kinds = {r["task_id"]: r["kind"] or "-" for r in a["runs"]}
    tasks = [t for t in kinds if t in scores[0] and t in scores[1]]
    if not tasks:
        return []
    changed = [t for t in tasks if scores[0][t] != scores[1][t]]
    lines = ["", f"Per task, a = {a['label']}, b = {b['label']} ({len(changed)} of {len(tasks)} changed, listed "
                 "first; score: the mean over repeats; calls: real calls / stopped by the gate):", "",
             "| task | kind | a: score | a: calls | b: score | b: calls | b − a |",
             "|---|---|---|---|---|---|---|"]
    for t in changed + [t for t in tasks if t not in changed]:
        (sa, sb), (ca, cb) = (side[t] for side in scores), (side[t] for side in calls)
        lines.append(f"| {t} | {kinds[t]} | {number(sa, 2)} | {ca[0]} / {ca[1]} "
                     f"| {number(sb, 2)} | {cb[0]} / {cb[1]} | {sb - sa:+.2f} |")
    return lines


def _power_note(comparison: dict[str, Any]) -> str:
    """How small a difference these paired tasks could find (see `metrics.power`); '' without the figures."""
    if comparison.get("tasks_for_target") is None:
        return ""
    return (f" With this spread, {comparison['tasks']} tasks detect a difference of {comparison['detectable']:.2f} or more "
            f"{int(comparison['power'] * 100)} % of the time; ±{comparison['target']:.2f} would take "
            f"about {comparison['tasks_for_target']} tasks.")


def _percent(value: float) -> str:
    return "–" if value != value else f"{100 * value:.0f} %"


def _tokens(cost: dict[str, Any]) -> str:
    text = f"{cost.get('tokens_act', 0)} / {cost.get('tokens_rehearse', 0)}"
    imagined = sum(v for k, v in cost.items() if k.startswith("tokens_imagined_"))
    return f"{text} (+ {imagined})" if imagined else text


def plot(results: list[dict[str, Any]], path: Path) -> bool:
    """Grouped bars, one group per metric, one bar per configuration. False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(results)
    for i, res in enumerate(results):
        values = [res["summary"][group][key] for group, key, _ in CHART]
        xs = [j + i * width for j in range(len(CHART))]
        bars = ax.bar(xs, [0 if (v is None or v != v) else v for v in values], width, label=res["label"])
        for bar, v in zip(bars, values):
            ax.annotate("n/a" if v is None or v != v else f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(CHART))], [label for *_, label in CHART], fontsize=8)
    ax.set_ylim(0, 1.1)
    summary = results[0]["summary"]["success"]
    ax.set_title(f"{results[0]['suite']} ({results[0]['settings']['split']}): {summary['tasks']} tasks × {summary['repeats']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)
    return True

"""A training run's metrics: one JSON line per step (readable while it runs), and a PNG of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envace_mcp._files import open_append, savefig_atomic, write_atomic


class MetricsLog:
    """`metrics.jsonl` of a run (rank 0 writes); `trim(step)` forgets what a killed run logged after its
    checkpoint, and a line torn by the kill, so a resumed run's log has each step once."""

    def __init__(self, path: Path, rank: int = 0) -> None:
        self.path, self.rank = path, rank

    def append(self, record: dict[str, Any]) -> None:
        if self.rank == 0:
            with open_append(self.path) as fh:  # never through a link planted there
                fh.write(json.dumps(record) + "\n")

    def trim(self, step: int) -> None:
        if self.rank != 0 or not self.path.exists():
            return
        kept = [record for record in read_metrics(self.path) if record["step"] <= step]
        write_atomic(self.path, "".join(json.dumps(record) + "\n" for record in kept))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The step records of a `metrics.jsonl`, skipping a line torn by a kill or still being written."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
            rows.append(record)
    return rows


PLOTTED = [("reward", "mean task reward"), ("success", "success rate"), ("uniform_groups", "uniform groups (no signal)"),
           ("loss", "loss"), ("kl", "KL (k3)"), ("fidelity", "rehearsal fidelity (real calls)"),
           ("call_f1", "tool-call F1 (runs)"), ("clip_high", "clipped fraction (high)"), ("grad_norm", "grad norm"),
           ("ce", "real-output CE")]


def plot_metrics(metrics: Path | dict[str, Path], png: Path) -> Path | None:
    """Reward, success, uniform groups, loss, KL, clip fraction, ... over steps (needs matplotlib; skipped
    without it). `metrics`: one run's `metrics.jsonl`, or {label: path} to draw runs (arms) side by side."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    runs = {label: read_metrics(path) for label, path in (metrics if isinstance(metrics, dict) else {"": metrics}).items()}
    if not any(runs.values()):
        return None
    rows_of_panels = -(-len(PLOTTED) // 3)
    fig, axes = plt.subplots(rows_of_panels, 3, figsize=(13, 3 * rows_of_panels))
    for ax in axes.flat[len(PLOTTED):]:
        ax.axis("off")
    for ax, (key, title) in zip(axes.flat, PLOTTED):
        drawn = False
        for colour, (label, rows) in enumerate(runs.items()):  # a run keeps its colour in every panel
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                ax.plot(*zip(*points), marker=".", label=label or None, color=f"C{colour}")
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not measured\n(simulated mode / off)", ha="center", va="center", transform=ax.transAxes)
        elif len(runs) > 1:
            ax.legend(fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    savefig_atomic(fig, png, dpi=80)
    plt.close(fig)
    return png

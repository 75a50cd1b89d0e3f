"""A training run's metrics: one JSON line per step (readable while it runs), and a PNG of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLog:
    """`metrics.jsonl` of a run (rank 0 writes); `trim(step)` forgets what a killed run logged after its
    checkpoint, and a line torn by the kill, so a resumed run's log has each step once."""

    def __init__(self, path: Path, rank: int = 0) -> None:
        self.path, self.rank = path, rank

    def append(self, record: dict[str, Any]) -> None:
        if self.rank == 0:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")

    def trim(self, step: int) -> None:
        if self.rank != 0 or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(line)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)


def plot_metrics(metrics: Path, png: Path) -> Path | None:
    """Reward, loss, KL, clip fraction and success over steps (needs matplotlib; skipped without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if not rows:
        return None
    keys = [("reward", "mean task reward"), ("success", "success rate"), ("loss", "loss"), ("kl", "KL (k3)"),
            ("fidelity", "rehearsal fidelity (real calls)"), ("clip_high", "clipped fraction (high)"),
            ("grad_norm", "grad norm"), ("ce", "real-output CE")]
    fig, axes = plt.subplots(2, 4, figsize=(15, 6))
    for ax, (key, title) in zip(axes.flat, keys):
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points), marker=".")
        else:
            ax.text(0.5, 0.5, "not measured\n(simulated mode / off)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return png

"""Learning curves of several training runs in one PNG (`envace lab plot`): one line per run (arm).

The drawing is the trainer's own (`train.metrics.plot_metrics`, which writes each run's `metrics.png`);
this module names and checks the runs compared."""

from __future__ import annotations

from pathlib import Path

from envace_mcp.errors import UserError
from envace_mcp.train.metrics import plot_metrics


def run_labels(runs: list[Path]) -> list[str]:
    """Each run's legend label: its folder name, or its whole path where two names are the same."""
    missing = [str(run) for run in runs if not (run / "metrics.jsonl").exists()]
    if missing:
        raise UserError(f"no metrics.jsonl in {', '.join(missing)}: give the --out folders of `envace train`")
    names = [run.name for run in runs]
    labels = names if len(set(names)) == len(names) else [str(run) for run in runs]
    if len(set(labels)) != len(labels):
        raise UserError("the same run twice: give each folder once")
    return labels


def plot_runs(runs: list[Path], png: Path) -> Path:
    """Reward, success, uniform groups, loss, ... over steps for every run in `runs` (training `--out`
    folders), written to `png`."""
    labels = run_labels(runs)
    if plot_metrics({label: run / "metrics.jsonl" for label, run in zip(labels, runs)}, png) is None:
        raise UserError("nothing to plot: the runs have no completed step yet, or matplotlib is missing "
                        "(pip install 'envace-mcp[train]')")
    return png

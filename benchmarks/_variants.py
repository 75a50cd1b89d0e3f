"""What the training benchmarks (`sft_throughput.py`, `grpo_update.py`) share: the reference runs they
measure on, the path before issue 53 they compare with, and one process per variant (each its own peak
RSS). Scripts in this folder import it as a sibling (`python benchmarks/NAME.py` puts the folder first
on the path)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from typing import Any


def reference_traces(folder: str | None, limit: int) -> str:
    """`folder`, or a new one holding the first `limit` bank train reference runs (token ids, no scores)."""
    if folder is not None:
        return folder
    import anyio

    from envace_mcp.lab.reference import record_reference_traces
    from envace_mcp.policy import load_policy

    folder = tempfile.mkdtemp()
    anyio.run(lambda: record_reference_traces(load_policy(None), "bank", folder, limit=limit, score=False))
    return folder


def recompute_attention() -> None:
    """Checkpointing as before issue 53: the backward pass recomputes the attention kernel too (for this
    process; call it before the model is prepared for training)."""
    import functools

    import envace_mcp.train.rows as training_rows

    training_rows.checkpoint_kwargs = functools.partial(dict, use_reentrant=False)


def run_each(script: str, argv: list[str], names: list[str], label: str) -> dict[str, dict | str]:
    """Run `script argv --variant NAME` for each name, one after the other, with a progress line; each
    prints its result as JSON on its last line. Returns name -> that result, or a line saying why none."""
    from envace_mcp._progress import Progress

    results: dict[str, dict | str] = {}
    with Progress(f"{label} (each in its own process)", total=len(names)) as progress:
        for name in names:
            out = subprocess.run([sys.executable, script, *argv, "--variant", name], capture_output=True, text=True)
            if out.returncode == 0:
                results[name] = json.loads(out.stdout.strip().splitlines()[-1])
            else:
                last = (out.stderr.strip().splitlines() or [""])[-1]
                results[name] = f"failed (rc {out.returncode}; -9 = killed, e.g. out of memory): {last!r}"
            progress.advance(last=name)
    return results


def print_each(results: dict[str, dict | str], width: int, line: Any) -> None:
    """One line per variant: its name, then `line(result, ratio)` (`ratio`: the first variant's seconds over
    this one's, from each result's "seconds"), or why it has no result."""
    base = next(iter(results.values()), None)
    for name, got in results.items():
        if isinstance(got, str):
            print(f"{name:{width}s} {got}")
            continue
        ratio = f"x{base['seconds'] / got['seconds']:.2f}" if isinstance(base, dict) else "-"
        print(f"{name:{width}s} {line(got, ratio)}")

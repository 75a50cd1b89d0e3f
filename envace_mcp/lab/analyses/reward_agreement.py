"""Do rewards without a checker order a group's runs as the checker does? For each reward named, over the
recorded groups of an `envace eval --repeats K` folder (a task's K runs, scored by its checker as `task`):
the runs it scores (saved in the folder, as `envace train grpo --reward` saves them), then for every pair
of runs of one group that the checker tells apart, whether the reward orders them the same way (agree),
the other way (disagree) or not at all (tie). GRPO learns only from such orders within a group.

Figures: pairwise agreement (agree / pairs; a tie counted half beside it), Kendall's tau-b per group
averaged over groups where both vary, and 95 % bootstrap intervals over groups. Floors: a reward
ordering pairs at random agrees on 0.50; a constant one ties every pair.

    python -m envace_mcp.lab.analyses.reward_agreement runs/bank-val-k4 --reward outcomes \\
        --reward judge:embedded --reward outcomes,judge:embedded [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from itertools import combinations
from pathlib import Path
from typing import Any

from envace_mcp.traces import TraceStore
from envace_mcp.train.rewards import reward_from, reward_name, score_missing

RESAMPLES = 2000


def pairs_of(groups: list[list[tuple[float, float]]]) -> list[tuple[int, int, int]]:
    """(agree, disagree, tie) per group over the pairs the checker tells apart; each run `(checker, reward)`."""
    out = []
    for runs in groups:
        agree = disagree = tie = 0
        for (c1, r1), (c2, r2) in combinations(runs, 2):
            if c1 == c2:
                continue
            if abs(r1 - r2) < 1e-9:
                tie += 1
            elif (c1 > c2) == (r1 > r2):
                agree += 1
            else:
                disagree += 1
        out.append((agree, disagree, tie))
    return out


def tau_b(runs: list[tuple[float, float]]) -> float | None:
    """Kendall's tau-b of checker and reward over one group's runs; None where either is constant."""
    concordant = discordant = ties_c = ties_r = 0
    for (c1, r1), (c2, r2) in combinations(runs, 2):
        dc, dr = c1 - c2, r1 - r2
        if dc == 0 and abs(dr) < 1e-9:
            continue
        if dc == 0:
            ties_c += 1
        elif abs(dr) < 1e-9:
            ties_r += 1
        elif (dc > 0) == (dr > 0):
            concordant += 1
        else:
            discordant += 1
    n0 = concordant + discordant
    denominator = ((n0 + ties_c) * (n0 + ties_r)) ** 0.5
    return (concordant - discordant) / denominator if denominator and n0 + ties_c and n0 + ties_r else None


def summary(groups: list[list[tuple[float, float]]], seed: int = 0) -> dict[str, Any]:
    counts = pairs_of(groups)
    taus = [tau_b(runs) for runs in groups]

    def figures(idx: list[int]) -> tuple[float | None, float | None, float | None]:
        a = sum(counts[i][0] for i in idx)
        d = sum(counts[i][1] for i in idx)
        t = sum(counts[i][2] for i in idx)
        n = a + d + t
        kept = [taus[i] for i in idx if taus[i] is not None]
        return (a / n if n else None, (a + t / 2) / n if n else None, sum(kept) / len(kept) if kept else None)

    everything = list(range(len(groups)))
    point = figures(everything)
    rng = random.Random(seed)
    boot: list[list[float]] = [[], [], []]
    for _ in range(RESAMPLES):
        for k, value in enumerate(figures([rng.choice(everything) for _ in everything])):
            if value is not None:
                boot[k].append(value)

    def interval(values: list[float]) -> list[float] | None:
        values.sort()
        return [values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]] if values else None

    agree, disagree, tie = (sum(c[k] for c in counts) for k in range(3))
    return {"groups": len(groups), "groups_told_apart": sum(1 for c in counts if sum(c)),
            "pairs": agree + disagree + tie, "agree": agree, "disagree": disagree, "tie": tie,
            "agreement": point[0], "agreement_interval": interval(boot[0]),
            "agreement_ties_half": point[1], "agreement_ties_half_interval": interval(boot[1]),
            "tau_b": point[2], "tau_b_interval": interval(boot[2]),
            "tau_groups": sum(t is not None for t in taus)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="envace eval --repeats K folders (their traces/)")
    parser.add_argument("--reward", action="append", required=True, help="as --reward takes it (repeatable)")
    parser.add_argument("--rubric", type=Path, help="the judge's rubric file")
    parser.add_argument("--checker", default="task", help="the checker's reward name (default task)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for folder in args.runs:
        store = TraceStore(folder / "traces" if (folder / "traces").is_dir() else folder)
        for spec in args.reward:
            fn = reward_from(spec, rubric=args.rubric if "judge:" in spec else None)
            name = reward_name(fn)
            started = time.monotonic()
            added = score_missing(list(store.read()), fn, store)
            getattr(fn, "release", lambda: None)()
            groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
            for trace in store.read():
                checker, reward = trace.reward(args.checker), trace.reward(name)
                if trace.group_id and checker and reward and checker.value is not None and reward.value is not None:
                    groups[trace.group_id].append((checker.value, reward.value))
            figures = summary(list(groups.values()))
            figures["scored_now"], figures["scoring_s"] = len(added), round(time.monotonic() - started, 1)
            results[f"{folder}:{name}"] = figures
            shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in figures.items()}
            print(f"{folder} {name}: {json.dumps(shown)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

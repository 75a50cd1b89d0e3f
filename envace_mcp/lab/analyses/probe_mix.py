"""Build a balanced probe mix (docs/evidence.md#the-world-model): the reference runs of 10 fit
tasks of each of the 12 bank kinds (the fit tasks in even rounds of 12; the kinds alternate, so every
other task would be 6 kinds only), every non-typo probe of those tasks, and `--typos` of their typo
probes picked at random.

    python -m envace_mcp.lab.analyses.probe_mix refs-bank-fit probes-other probes-all sft-data2 [--typos 100] [--seed 0]
    python -m envace_mcp.lab.analyses.probe_mix refs-retail-fit probes-other-retail probes-all-retail mix-retail --kinds 10 --every 4
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from pathlib import Path

from envace_mcp.traces import TraceStore

TYPOS = ("digit", "drop_digit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("refs", type=Path, help="`envace lab reference` folder (the split's runs, in task order)")
    parser.add_argument("other", type=Path, help="`envace lab probe` folder recorded with --mutations swap,halve,enum,scale")
    parser.add_argument("all", type=Path, help="`envace lab probe` folder with every mutation (its typos are sampled)")
    parser.add_argument("out", type=Path, help="trace folder to write the mix to (for train sft --traces)")
    parser.add_argument("--typos", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", type=int, default=12, help="task kinds, in the order the split cycles through them")
    parser.add_argument("--every", type=int, default=2, help="keep the tasks of every N-th round of kinds (2: half the fit tasks)")
    args = parser.parse_args()

    refs = list(TraceStore(args.refs).read())
    keep = {r.task_id for i, r in enumerate(refs) if (i // args.kinds) % args.every == 0}
    chosen = [r for r in refs if r.task_id in keep]
    other = [p for p in TraceStore(args.other).read() if p.metadata["probe"]["of"] in keep]
    typos = [p for p in TraceStore(args.all).read()
             if p.metadata["probe"]["of"] in keep and p.metadata["probe"]["mutation"] in TYPOS]
    random.Random(args.seed).shuffle(typos)
    typos = typos[:args.typos]
    out = TraceStore(args.out)
    for name, part in (("probes-other", other), ("probes-typo", typos), ("refs", chosen)):
        for trace in part:
            out.append(trace)
        print(f"{name}: {len(part)}")
    print(dict(Counter(p.metadata["probe"]["mutation"] for p in other + typos)))


if __name__ == "__main__":
    main()

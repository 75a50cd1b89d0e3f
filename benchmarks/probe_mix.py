"""Build the balanced probe mix of docs/evidence.md ("third session"): the reference runs of 10 fit
tasks of each of the 12 bank kinds (the fit tasks in even rounds of 12; the kinds alternate, so every
other task would be 6 kinds only), every non-typo probe of those tasks, and `--typos` of their typo
probes picked at random.

    python benchmarks/probe_mix.py refs-bank-fit probes-other probes-all sft-data2 [--typos 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

TYPOS = ("digit", "drop_digit")


def rows(folder: Path) -> list[dict]:
    with open(folder / "traces.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("refs", type=Path, help="traces reference folder (the split's runs, in task order)")
    parser.add_argument("other", type=Path, help="traces probe folder recorded with --mutations swap,halve,enum,scale")
    parser.add_argument("all", type=Path, help="traces probe folder with every mutation (its typos are sampled)")
    parser.add_argument("out", type=Path, help="folder to write the SFT traces to")
    parser.add_argument("--typos", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", type=int, default=12, help="task kinds, in the order the split cycles through them")
    args = parser.parse_args()

    refs = rows(args.refs)
    keep = {r["task_id"] for i, r in enumerate(refs) if (i // args.kinds) % 2 == 0}
    chosen = [r for r in refs if r["task_id"] in keep]
    other = [p for p in rows(args.other) if p["metadata"]["probe"]["of"] in keep]
    typos = [p for p in rows(args.all) if p["metadata"]["probe"]["of"] in keep and p["metadata"]["probe"]["mutation"] in TYPOS]
    random.Random(args.seed).shuffle(typos)
    typos = typos[:args.typos]
    args.out.mkdir(parents=True, exist_ok=True)
    for name, part in (("refs", chosen), ("probes-other", other), ("probes-typo", typos)):
        with open(args.out / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
        print(f"{name}: {len(part)}")
    print(dict(Counter(p["metadata"]["probe"]["mutation"] for p in other + typos)))


if __name__ == "__main__":
    main()

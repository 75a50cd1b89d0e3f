"""Zero-shot, recall only, fit, fit + recall: one world model's arms on the same held-out calls.

The split is a fit's own (its `fit.json`: seed, holdout, max calls), so every arm is measured on exactly the
calls that fit held out, and recalls only that fit's training calls (never a held-out run). An arm is
`NAME=ADAPTER` (its rehearsals recall nothing) or `NAME=ADAPTER+recall`; ADAPTER is a folder or `shipped`.

    python -m envace_mcp.lab.analyses.world_model_arms --traces runs/inventory --split runs/inv-100 \
        --out runs/arms.json zero-shot=shipped recall=shipped+recall fit=runs/inv-100 \
        fit+recall=runs/inv-100r+recall

`--fit-with-recall DIR` first fits a world model that learns with recall (`fit(recall=True)`: the product's
`fit` leaves it off) on the split's training calls, into DIR, measuring it on the held-out calls there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def arm(spec: str) -> tuple[str, str, bool]:
    name, _, adapter = spec.partition("=")
    if not name or not adapter:
        raise argparse.ArgumentTypeError(f"{spec!r}: an arm is NAME=ADAPTER or NAME=ADAPTER+recall")
    recall = adapter.endswith("+recall")
    return name, adapter.removesuffix("+recall"), recall


def main(argv: list[str] | None = None) -> None:
    from envace_mcp.policy import load_policy
    from envace_mcp.policy.embedded import embedded_adapter
    from envace_mcp.worldmodel.calls import call_log, first_calls
    from envace_mcp.worldmodel.fit import measure, read_calls, split

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", required=True)
    parser.add_argument("--split", required=True, help="a fitted folder whose fit.json gives the split")
    parser.add_argument("--out", default=None, help="where the arms' figures go (JSON; needed with arms)")
    parser.add_argument("--max-held", type=int, default=None, help="measure the held-out runs' first N calls "
                                                                      "(whole runs)")
    parser.add_argument("--fit-with-recall", default=None, help="fit a world model with recall into this folder first "
                                                                    "(same split as --split; --max-calls from its fit.json)")
    parser.add_argument("arms", nargs="*", type=arm)
    args = parser.parse_args(argv)
    if args.arms and not args.out:
        parser.error("arms need --out FILE")
    setup = json.loads((Path(args.split) / "fit.json").read_text())
    if args.fit_with_recall:
        from envace_mcp.policy.embedded import embedded_adapter
        from envace_mcp.train.config import SFTConfig
        from envace_mcp.worldmodel.fit import fit

        fit(args.traces, args.fit_with_recall, adapter=str(embedded_adapter()), holdout=setup["holdout"],
            seed=setup["seed"], max_calls=setup["max_calls"], max_held=setup.get("max_held"), recall=True,
            settings=SFTConfig(seed=setup["seed"]))  # as `envace world-model fit` builds its settings
    _, calls, _ = read_calls(args.traces)
    train, held, _ = split(calls, setup["holdout"], setup["seed"], setup["max_calls"], setup.get("max_held"))
    if args.max_held is not None:
        held = first_calls(held, list(dict.fromkeys(c.episode for c in held)), args.max_held)
    log = call_log(train)
    out: dict[str, Any] = {"traces": args.traces, "split": args.split, "training_calls": len(train),
                           "held_out_calls": len(held), "arms": {}}
    for name, adapter, recall in args.arms:
        policy = load_policy(None, adapter=str(embedded_adapter()) if adapter == "shipped" else adapter)
        policy.recall = log if recall else None
        result = measure(policy, held, label=name, majority=setup.get("training_majority"))
        out["arms"][name] = {"adapter": adapter, "recall": recall, "overall": result["overall"],
                             "tools": result["tools"]}
        Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")  # each arm kept as it ends
        o = result["overall"]
        print(f"{name}: status {o['status_accuracy']:.3f} {o['status_interval']} floors {o['floors']} "
              f"unusable {o['unusable']:.3f} failures {o['failure_precision']}·{o['failure_recall']} "
              f"fields {o['field_accuracy']} (floor {o['field_floor']}) ece {o['calibration']['ece']}", flush=True)


if __name__ == "__main__":
    main()

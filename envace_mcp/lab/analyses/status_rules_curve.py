"""How many held-out failures status rules foresee as the training log grows, with no model at all: for each
size, the rules `policy.status_rules` learns from the first N training calls of a fit's split (whole runs,
as `fit --max-calls N` takes them), applied to the split's held-out calls; beside it the status accuracy of
"always succeeds" and of "succeeds unless a rule says it fails" (the rules alone, what a fit adds them to).

    python -m envace_mcp.lab.analyses.status_rules_curve --traces runs/inventory --sizes 50 100 200 400 0
"""

from __future__ import annotations

import argparse

from envace_mcp._text import visible


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", required=True, help="a trace folder (recorded runs, or `envace traces import`)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 400, 0],
                        help="training calls (0: all), as `fit --max-calls`")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--holdout", type=float, default=0.2)
    args = parser.parse_args()
    from envace_mcp.policy import status_rules
    from envace_mcp.worldmodel.fit import MAX_HELD, read_calls, split

    _, calls, _ = read_calls(args.traces)
    print("training calls | rules (tools) | held-out calls, failures | predicted failures (right) | "
          "status: always succeeds · the rules alone")
    for size in args.sizes:
        train, held, _ = split(calls, args.holdout, args.seed, size or None, MAX_HELD if size else None)
        learned = status_rules.learn(train)
        rules, texts, logged = learned.rules, set(learned.known), status_rules.logged_numbers(learned.logged)
        said = [c for c in held if any(r.fact in status_rules.facts(c.request, texts, logged)
                                       for r in rules.get(c.tool, []))]
        right = sum(c.failed for c in said)
        failed = sum(c.failed for c in held)
        print(f"{len(train)} | {sum(map(len, rules.values()))} ({len(rules)}) | {len(held)}, {failed} | "
              f"{len(said)} ({right}) | {(len(held) - failed) / len(held):.3f} · "
              f"{(len(held) - failed - (len(said) - right) + right) / len(held):.3f}")
        for tool, found in rules.items():
            print(f"    {visible(tool)}: " + "; ".join(visible(r.words()) for r in found))


if __name__ == "__main__":
    main()

"""Held-out evidence for the embedded model, with or without an adapter, on the bank test split.

    python -m envace_mcp.lab.analyses.training_evidence --tasks 24 [--suite bank|retail] [--adapter DIR] [--label NAME] [--out DIR]

Test tasks (entities and amounts disjoint from train) are taken round-robin over task kinds. The
adapter's `envace.json` says which prompt formats it was trained on (tool text, rehearse prompt).
1. agent: the EnvACE graph in real mode (rehearse -> gate -> act) against the in-process bank
   server, greedy decoding; success = checker score 1.0; first-call exact = the first tool call
   equals the reference's first action (name and arguments).
2. world model: the reference actions are forced, the model rehearses every call itself, the gate
   lets every call run, and each rehearsal is compared with the real result: field accuracy (mean
   match score), status accuracy (predicted error <-> real error).
Appends one JSON line per run to OUT/results.jsonl and prints a table of every line so far.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pick(tasks: list, n: int) -> list:
    kinds: dict[str, list] = {}
    for task in tasks:
        kinds.setdefault(task.kind, []).append(task)
    picked, lists = [], list(kinds.values())
    while len(picked) < n and any(lists):
        for bucket in lists:
            if bucket and len(picked) < n:
                picked.append(bucket.pop(0))
    return picked


async def agent_runs(policy, suite, tasks, sampling, concurrency, out: Path) -> dict:
    from envace_mcp._progress import Progress
    from envace_mcp.envs import run_task
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.traces import TraceStore

    store = TraceStore(out)
    limit = asyncio.Semaphore(concurrency)
    scores: list[float] = []
    async with Toolbox({suite.name: suite.build_server()}) as toolbox:
        async def one(task):
            async with limit:
                run = await run_task(suite, task, policy=policy, toolbox=toolbox, sampling=sampling, store=store)
            scores.append(run.verdict.score)
            progress.advance(**{"mean score": round(sum(scores) / len(scores), 3)})
            return run

        with Progress("agent runs", total=len(tasks)) as progress:
            runs = await asyncio.gather(*(one(t) for t in tasks))
    exact = 0
    for run in runs:
        first = next((s for s in run.trace.steps if s.role == "tool"), None)
        want = run.task.actions[0] if run.task.actions else None
        if first is not None and want is not None and first.tool == want.tool and first.arguments == want.arguments:
            exact += 1
        elif first is None and want is None:
            exact += 1
    return {"success": sum(r.verdict.score >= 1.0 for r in runs) / len(runs),
            "score": sum(r.verdict.score for r in runs) / len(runs), "first_call_exact": exact / len(runs)}


async def world_model(policy, suite, tasks, sampling, out: Path) -> dict:
    from envace_mcp._progress import Progress
    from envace_mcp.lab.reference import record_reference_traces

    ids = {t.id for t in tasks}
    before = dict(policy.engine.stats)
    with Progress("world model (forced reference calls)", total=len(ids)) as progress:
        await record_reference_traces(policy, suite.name, out, split="test", score=False, own_rehearsals=True,
                                      sampling=sampling, only=ids, on_task=lambda *_: progress.advance())
    scores = world_scores(out)
    # the act turns are forced (never prefilled), so only rehearsals ran on the engine here
    stats = {k: policy.engine.stats[k] - before.get(k, 0) for k in ("prompt_tokens", "reused_tokens", "prefill_s", "decode_s")}
    n = max(scores["rehearsals"], 1)
    return scores | {"rehearse_prompt_tokens": round(stats["prompt_tokens"] / n, 1),
                     "prefilled_per_rehearsal": round((stats["prompt_tokens"] - stats["reused_tokens"]) / n, 1),
                     "seconds_per_rehearsal": round((stats["prefill_s"] + stats["decode_s"]) / n, 3)}


def world_scores(folder: Path) -> dict:
    """Field accuracy (mean match score) and status accuracy (a *valid* rehearsal that predicted an
    error exactly when the real call failed; an unusable rehearsal counts as wrong) over real calls."""
    from envace_mcp.traces import TraceStore

    scores, status, rehearsals = [], [], 0
    for trace in TraceStore(folder).read():
        rehearsals += sum(s.role == "rehearse" for s in trace.steps)
        predicted = {s.call_id: (s.parsed or {}).get("status") for s in trace.steps if s.role == "rehearse"}
        for step in trace.steps:
            if step.role == "tool" and step.comparison is not None:
                scores.append(step.comparison.score)
                guess = predicted.get(step.call_id)
                real_error = bool((step.result or {}).get("is_error"))
                status.append(guess in ("result", "tool_error") and (guess == "tool_error") == real_error)
    return {"field_accuracy": sum(scores) / max(len(scores), 1), "status_accuracy": sum(status) / max(len(status), 1),
            "real_calls": len(scores), "rehearsals": rehearsals}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--suite", default="bank", choices=["bank", "retail"])
    parser.add_argument("--adapter", default=None)
    parser.add_argument("--label", default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--out", default="evidence")
    parser.add_argument("--skip-agent", action="store_true")
    parser.add_argument("--skip-world", action="store_true")
    parser.add_argument("--rescore", action="store_true", help="recompute the world-model scores of OUT/results.jsonl from its traces")
    args = parser.parse_args()

    from envace_mcp.envs import get_suite
    from envace_mcp.policy import SamplingParams, load_policy

    out = Path(args.out)
    if args.rescore:
        rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        rows = [r | world_scores(out / r["label"] / "world") if (out / r["label"] / "world").exists() else r for r in rows]
        (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        show(out)
        return

    from envace_mcp.engine.model import machine

    suite = get_suite(args.suite)
    tasks = pick(suite.split("test"), args.tasks)
    label = args.label or (Path(args.adapter).name if args.adapter else "base")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    sampling = {"act": greedy, "rehearse": greedy}
    policy = load_policy(None, adapter=args.adapter)
    started = time.perf_counter()
    row: dict = {"label": label, "adapter": args.adapter, "suite": args.suite, "tasks": len(tasks),
                 "rehearse_format": policy.rehearse_format, "tool_format": policy.tool_format,
                 "dtype": str(next(policy.model.parameters()).dtype).removeprefix("torch."), "machine": machine()}
    if not args.skip_agent:
        row |= asyncio.run(agent_runs(policy, suite, tasks, sampling, args.concurrency, out / label / "agent"))
    if not args.skip_world:
        row |= asyncio.run(world_model(policy, suite, tasks, sampling, out / label / "world"))
    row["seconds"] = round(time.perf_counter() - started, 1)
    with open(out / "results.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
    show(out)


def show(out: Path) -> None:
    print(f"{'label':16s} {'suite':6s} {'format':9s} {'tasks':>5s} {'success':>8s} {'score':>6s} {'1st call':>8s} "
          f"{'fields':>7s} {'status':>7s} {'calls':>5s} {'prompt':>7s} {'prefill':>7s} {'s/reh':>6s}")
    for line in (out / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        nan = float("nan")
        print(f"{r['label']:16s} {r.get('suite', 'bank'):6s} {r.get('rehearse_format', 'simulator'):9s} {r['tasks']:5d} "
              f"{r.get('success', nan):8.3f} {r.get('score', nan):6.3f} "
              f"{r.get('first_call_exact', nan):8.3f} {r.get('field_accuracy', nan):7.3f} "
              f"{r.get('status_accuracy', nan):7.3f} {r.get('real_calls', 0):5d} {r.get('rehearse_prompt_tokens', nan):7.1f} "
              f"{r.get('prefilled_per_rehearsal', nan):7.1f} {r.get('seconds_per_rehearsal', nan):6.2f}")
    machines = {json.loads(line).get("machine") for line in (out / "results.jsonl").read_text().splitlines()} - {None}
    for m in sorted(machines):
        print(m)


if __name__ == "__main__":
    main()

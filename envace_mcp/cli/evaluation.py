"""`envace eval`: measure a configuration (or compare two) on a suite's tasks."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import anyio
import typer

from envace_mcp.cli._common import (
    AdapterOpt,
    GateOpt,
    LimitsOpt,
    ModelOpt,
    RehearseAdapterOpt,
    _config_layers,
    _fail,
    _gate_text,
    _holding,
    _limits,
    _suite,
    app,
    console,
    loading,
)
from envace_mcp.errors import EnvaceError


@app.command("eval")
def eval_command(
    out: Annotated[Path, typer.Option(file_okay=False, help="folder for results.json / .md / .png, traces/ and "
                                                            "runs.jsonl; the same command resumes there")],
    suite: Annotated[Optional[str], typer.Option(help="bank, retail, tau2-airline, tau2-retail, bfcl-base, bfcl-miss_func, "
                                                     "bfcl-miss_param, bfcl-long_context, bfcl-simple, bfcl-multiple, "
                                                     "bfcl-parallel, bfcl-parallel_multiple, bfcl-irrelevance")] = None,
    split: Annotated[Optional[Literal["train", "test", "validation", "fit"]], typer.Option(
        help="which split's tasks (default test)")] = None,
    limit: Annotated[Optional[int], typer.Option(min=1, help="the first K tasks of the split")] = None,
    task: Annotated[Optional[list[str]], typer.Option("--task", help="only these task ids (repeatable)")] = None,
    model: ModelOpt = None,
    adapter: AdapterOpt = None,
    rehearse_adapter: RehearseAdapterOpt = None,
    policy: Annotated[Optional[Literal["model", "reference", "noop"]], typer.Option(
        help="model (default); reference (the tasks' reference solutions: a ceiling); "
             "noop (answers without calling anything: the floor)")] = None,
    mode: Annotated[Optional[Literal["real", "simulated", "mixed"]], typer.Option(
        help="where tool results come from (default real)")] = None,
    repeats: Annotated[Optional[int], typer.Option(min=1, help="runs per task (pass^k needs k <= repeats)")] = None,
    gate: GateOpt = None,
    limits: LimitsOpt = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(min=1, help="tokens per turn of the agent (default 160)")] = None,
    config: Annotated[Optional[list[str]], typer.Option(
        "--config", "-c", help="more settings (repeatable): a JSON file of EvalConfig fields, or key=value pairs, "
                               "e.g. -c temperature=1,seed=3,concurrency=4,transport=stdio; research switches: rehearse=N "
                               "(test-time rehearsal), constrain_calls=true (docs/evaluation.md)")] = None,
    compare: Annotated[Optional[str], typer.Option(
        help="a second configuration as changes to this one, e.g. 'rehearse=2' or 'adapter=runs/sft'; "
             "both run on the same tasks and the difference is reported with a 95 % bootstrap interval")] = None,
) -> None:
    """Measure a configuration (or compare two) on a suite's tasks.

    By default what ships: the embedded model with its adapter and the gate that adapter recommends.
    Reports success, pass^k, tool-call P/R/F1, rehearsal fidelity and cost; every run is recorded as
    a trace."""
    from envace_mcp.config import build
    from envace_mcp.eval.evaluate import EvalConfig, finished_runs, select_tasks

    options = {"suite": suite, "split": split, "limit": limit, "tasks": list(task) if task else None, "model": model,
               "adapter": adapter, "rehearse_adapter": rehearse_adapter, "policy": policy, "mode": mode,
               "repeats": repeats, "max_new_tokens": max_new_tokens}
    try:
        settings = build(EvalConfig, *_config_layers(config, EvalConfig),
                         {k: v for k, v in options.items() if v is not None},
                         {"gate": _gate_text(gate)} if gate else {}, {"limits": _limits(limits).model_dump()} if limits else {},
                         where="envace eval")
    except EnvaceError as exc:
        _fail(exc)
    target = _suite(settings.suite)
    try:
        configs = [settings] + ([settings.overridden(compare)] if compare else [])
        for one in configs:
            one.gate_config()  # a bad gate, or an adapter's bad recommendation, before anything runs
        tasks = select_tasks(target, settings)
        if settings.transport and settings.transport not in target.transports:
            raise ValueError(f"suite {settings.suite!r} runs over {', '.join(target.transports)}")
    except (EnvaceError, ValueError) as exc:
        _fail(exc)
    if not tasks:
        _fail(ValueError(f"no tasks selected from {settings.suite}/{settings.split}"))
    folders = [out] if len(configs) == 1 else [out / "a", out / "b"]
    for one, folder in zip(configs, folders):  # another configuration's runs there: refused before loading
        try:
            done = finished_runs(folder, one)
        except EnvaceError as exc:
            _fail(exc)
        wanted = {(t.id, r) for t in tasks for r in range(one.repeats)}
        if wanted & set(done):
            console.print(f"resuming {folder}: {len(wanted & set(done))} of {len(wanted)} runs already there")
    with _holding(out):  # one process per folder: two would tear its journal
        results = [_one(target, tasks, one, folder) for one, folder in zip(configs, folders)]
        _finish(results, out)


def _one(suite: Any, tasks: list[Any], settings: Any, out: Path) -> dict[str, Any]:
    from envace_mcp._progress import Progress
    from envace_mcp.eval.evaluate import evaluate

    policy = None
    if settings.policy == "model":
        from envace_mcp.eval.evaluate import load_model_policy

        with loading(settings.model, settings.adapter_folder(), settings.rehearse_adapter):
            try:
                policy = load_model_policy(settings)
            except EnvaceError as exc:
                _fail(exc)
    passed, scores = [0, 0], []
    with Progress(f"eval {settings.label()}", total=len(tasks) * settings.repeats, console=console) as progress:

        def on_run(record: dict[str, Any]) -> None:
            passed[0] += record["passed"]
            passed[1] += 1
            if record.get("score") is not None:
                scores.append(record["score"])
            progress.advance(passed=f"{passed[0]}/{passed[1]}",
                             **({"mean score": round(sum(scores) / len(scores), 3)} if scores else {}))

        try:
            return anyio.run(lambda: evaluate(suite, tasks, settings, out=out, policy=policy, on_run=on_run))
        except EnvaceError as exc:
            _fail(exc)
    raise AssertionError("unreachable")


@app.command("compare")
def compare_command(
    baseline: Annotated[Path, typer.Argument(help="an `envace eval --out` folder (or its results.json): the baseline, a")],
    other: Annotated[Path, typer.Argument(help="a second one, b, on the same suite and split")],
    out: Annotated[Optional[Path], typer.Option(file_okay=False, help="write compare.json, results.md and .png here")] = None,
) -> None:
    """Pair two saved evaluations task by task: b − a with a 95 % bootstrap interval, by kind, and the
    gate's value side by side. Runs nothing: for runs made apart (other days, other adapters)."""
    results = []
    for path in (baseline, other):
        file = path / "results.json" if path.is_dir() else path
        try:
            results.append(json.loads(file.read_text()))
        except (OSError, ValueError) as exc:
            _fail(ValueError(f"{path}: no readable results.json ({exc.__class__.__name__}: {exc})"))
        if not isinstance(results[-1], dict) or "runs" not in results[-1] or "summary" not in results[-1]:
            _fail(ValueError(f"{path}: not the results.json of `envace eval`"))
    a, b = results
    where = [(r["suite"], r["settings"]["split"]) for r in results]
    if where[0] != where[1]:
        _fail(ValueError(f"they measured different tasks: {'/'.join(where[0])} and {'/'.join(where[1])}"))
    shared = {r["task_id"] for r in a["runs"]} & {r["task_id"] for r in b["runs"]}
    if not shared:
        _fail(ValueError("no task in common: nothing to pair"))
    for res, path in zip(results, (baseline, other)):
        apart = len({r["task_id"] for r in res["runs"]} - shared)
        if apart:
            console.print(f"[yellow]{path}: {apart} task(s) the other did not run are left out of the pairing[/]")
    if a["label"] == b["label"]:  # the same configuration run twice: tell them apart by where they are
        for res, path in zip(results, (baseline, other)):
            res["label"] = f"{res['label']} ({path})"
    with _holding(out) if out is not None else contextlib.nullcontext():
        _finish(results, out, ran=False)


def _finish(results: list[dict[str, Any]], out: Path | None, *, ran: bool = True) -> None:
    from envace_mcp.eval.metrics import paired_difference, task_scores
    from envace_mcp.eval.report import markdown, number, plot

    comparison = None
    if len(results) == 2:
        comparison = paired_difference(task_scores(results[0]["runs"]), task_scores(results[1]["runs"]))
        if out is not None:
            from envace_mcp._files import write_atomic

            write_atomic(out / "compare.json", json.dumps({"a": results[0]["label"], "b": results[1]["label"],
                                                           "difference": comparison}, indent=2))
            write_atomic(out / "results.md", markdown(results, comparison))
            plot(results, out / "results.png")
    from rich.table import Table

    table = Table(title=f"{results[0]['suite']} / {results[0]['settings']['split']}")
    for column in ("configuration", "tasks×k", "score", "pass@1", "pass^k", "call F1", "rehearsal field acc.",
                   "real calls", "stopped", "tokens"):
        table.add_column(column)
    for res in results:
        s = res["summary"]
        k = s["success"]["repeats"]
        table.add_row(res["label"], f"{s['success']['tasks']}×{k}", number(s["success"]["score"]), number(s["success"]["pass@1"]),
                      number(s["success"].get(f"pass^{k}")) if k > 1 else "–", number(s["tool_calls"]["f1"]),
                      number(s["fidelity"]["field_accuracy"]), str(s["cost"]["real_calls"]), str(s["cost"]["stopped_calls"]),
                      str(sum(v for key, v in s["cost"].items() if key.startswith("tokens_"))))
    console.print(table)
    if "judged_apart" in results[0]["summary"]:
        console.print(f"[yellow]{results[0]['summary']['judged_apart']['tasks']} task(s) need a language judge: "
                      "scored apart (see results.md)[/]")
    if comparison:
        for res in results:
            g = res["summary"].get("gate_value")
            if g and g["proposed"]:
                console.print(f"gate, {res['label']}: {g['proposed']} destructive calls proposed; harmful "
                              f"{g['harmful']}: {g['harmful_stopped']} stopped, {g['harmful_executed']} executed; "
                              f"false blocks {g['false_blocks']} / {g['requested']} requested")
        console.print(f"[bold]difference[/] (b − a, mean score over {comparison['tasks']} tasks): "
                      f"{comparison['mean']:+.3f}  95 % CI [{comparison['low']:+.3f}, {comparison['high']:+.3f}]  "
                      f"(better on {comparison['better']}, worse on {comparison['worse']}, same on {comparison['same']})")
        if comparison.get("tasks_for_target") is not None:
            console.print(f"[dim]detectable with {int(comparison['power'] * 100)} % power: "
                          f"{comparison['detectable']:.2f}; ±{comparison['target']:.2f} needs about "
                          f"{comparison['tasks_for_target']} paired tasks[/]")
    if out is not None:
        written = "results.json, results.md, results.png, traces/" if ran else "compare.json, results.md, results.png"
        console.print(f"[dim]results in {out}/ ({written})[/]")

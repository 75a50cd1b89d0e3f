"""`envace eval`: measure a configuration (or compare two) on a suite's tasks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import anyio
import typer

from envace_mcp.cli._common import _fail, _gate, _suite, app, console
from envace_mcp.errors import EnvaceError


@app.command("eval")
def eval_command(
    suite: Annotated[str, typer.Option(help="bank, retail, tau2-airline, tau2-retail, bfcl-base, bfcl-miss_func, "
                                            "bfcl-miss_param, bfcl-long_context, bfcl-simple, bfcl-multiple, "
                                            "bfcl-parallel, bfcl-parallel_multiple, bfcl-irrelevance")],
    out: Annotated[Path, typer.Option(help="folder for results.json / .md / .png and traces/")],
    split: Annotated[str, typer.Option(help="train or test")] = "test",
    limit: Annotated[Optional[int], typer.Option(help="the first K tasks of the split")] = None,
    task: Annotated[Optional[list[str]], typer.Option("--task", help="only these task ids (repeatable)")] = None,
    model: Annotated[Optional[str], typer.Option(help="Hugging Face id or folder (default: embedded SmolLM2)")] = None,
    adapter: Annotated[Optional[str], typer.Option(help="a LoRA adapter folder")] = None,
    policy: Annotated[str, typer.Option(help="model; reference (the tasks' reference solutions: a ceiling); "
                                             "noop (answers without calling anything: the floor)")] = "model",
    mode: Annotated[str, typer.Option(help="real, simulated or mixed")] = "real",
    rehearse: Annotated[int, typer.Option(help="imagined runs before each real one (test-time rehearsal N)")] = 0,
    strategy: Annotated[str, typer.Option(help="parallel or sequential test-time rehearsal")] = "parallel",
    repeats: Annotated[int, typer.Option(help="runs per task (pass^k needs k <= repeats)")] = 1,
    concurrency: Annotated[int, typer.Option(help="runs in flight together (batched generation)")] = 8,
    transport: Annotated[Optional[str], typer.Option(help="inprocess, stdio or http (default: the suite's first)")] = None,
    gate: Annotated[Optional[str], typer.Option(help="e.g. rehearse=all,max_steps=8")] = None,
    max_new_tokens: int = 160,
    temperature: float = 0.0,
    seed: int = 0,
    compare: Annotated[Optional[str], typer.Option(
        help="a second configuration as changes to this one, e.g. 'rehearse=2' or 'adapter=runs/sft'; "
             "both run on the same tasks and the difference is reported with a 95 % bootstrap interval")] = None,
) -> None:
    """Run a suite's tasks through the EnvACE graph and report success, pass^k, tool-call P/R/F1,
    rehearsal fidelity and cost; every run is recorded as a trace."""
    import dataclasses

    from envace_mcp.eval.evaluate import EvalSettings, select_tasks

    if mode not in ("real", "simulated", "mixed") or strategy not in ("parallel", "sequential"):
        _fail(ValueError("--mode must be real, simulated or mixed; --strategy parallel or sequential"))
    if policy not in ("model", "reference", "noop"):
        _fail(ValueError("--policy must be model, reference or noop"))
    if repeats < 1:
        _fail(ValueError("--repeats must be at least 1"))
    target = _suite(suite)
    gate_config = dataclasses.asdict(_gate(gate)) if gate else {}
    settings = EvalSettings(suite=suite, split=split, limit=limit, tasks=list(task) if task else None, model=model,
                            adapter=adapter, policy=policy, mode=mode, rehearse=rehearse, strategy=strategy,
                            repeats=repeats, concurrency=concurrency, transport=transport, gate=gate_config,
                            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    try:
        configs = [settings] + ([settings.overridden(compare)] if compare else [])
        tasks = select_tasks(target, settings)
        if transport and transport not in target.transports:
            raise ValueError(f"suite {suite!r} runs over {', '.join(target.transports)}")
    except (EnvaceError, ValueError) as exc:
        _fail(exc)
    if not tasks:
        _fail(ValueError(f"no tasks selected from {suite}/{split}"))
    results = []
    for i, config in enumerate(configs):
        folder = out if len(configs) == 1 else out / ("a", "b")[i]
        results.append(_one(target, tasks, config, folder))
    _finish(results, out)


def _one(suite: Any, tasks: list[Any], settings: Any, out: Path) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from envace_mcp.eval.evaluate import evaluate

    policy = None
    if settings.policy == "model":
        from envace_mcp.policy import load_policy

        with console.status(f"loading {settings.model or 'the embedded SmolLM2-135M-Instruct'} …"):
            try:
                policy = load_policy(settings.model, adapter=settings.adapter)
            except EnvaceError as exc:
                _fail(exc)
    passed = [0, 0]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task(settings.label(), total=len(tasks) * settings.repeats)

        def on_run(record: dict[str, Any]) -> None:
            passed[0] += record["passed"]
            passed[1] += 1
            progress.update(bar, advance=1, description=f"{settings.label()}  passed {passed[0]}/{passed[1]}")

        try:
            return anyio.run(lambda: evaluate(suite, tasks, settings, out=out, policy=policy, on_run=on_run))
        except EnvaceError as exc:
            _fail(exc)
    raise AssertionError("unreachable")


def _finish(results: list[dict[str, Any]], out: Path) -> None:
    from envace_mcp.eval.metrics import paired_difference, task_scores
    from envace_mcp.eval.report import _f, markdown, plot

    comparison = None
    if len(results) == 2:
        comparison = paired_difference(task_scores(results[0]["runs"]), task_scores(results[1]["runs"]))
        (out / "compare.json").write_text(json.dumps({"a": results[0]["label"], "b": results[1]["label"],
                                                      "difference": comparison}, indent=2))
        (out / "results.md").write_text(markdown(results, comparison))
        plot(results, out / "results.png")
    from rich.table import Table

    table = Table(title=f"{results[0]['suite']} / {results[0]['settings']['split']}")
    for column in ("configuration", "tasks×k", "score", "pass@1", "pass^k", "call F1", "rehearsal field acc.",
                   "real calls", "stopped", "tokens"):
        table.add_column(column)
    for res in results:
        s = res["summary"]
        k = s["success"]["repeats"]
        table.add_row(res["label"], f"{s['success']['tasks']}×{k}", _f(s["success"]["score"]), _f(s["success"]["pass@1"]),
                      _f(s["success"].get(f"pass^{k}")) if k > 1 else "–", _f(s["tool_calls"]["f1"]),
                      _f(s["fidelity"]["field_accuracy"]), str(s["cost"]["real_calls"]), str(s["cost"]["stopped_calls"]),
                      str(sum(v for key, v in s["cost"].items() if key.startswith("tokens_"))))
    console.print(table)
    if "judged_apart" in results[0]["summary"]:
        console.print(f"[yellow]{results[0]['summary']['judged_apart']['tasks']} task(s) need a language judge: "
                      "scored apart (see results.md)[/]")
    if comparison:
        console.print(f"[bold]difference[/] (b − a, mean score over {comparison['tasks']} tasks): "
                      f"{comparison['mean']:+.3f}  95 % CI [{comparison['low']:+.3f}, {comparison['high']:+.3f}]")
    console.print(f"[dim]results in {out}/ (results.json, results.md, results.png, traces/)[/]")

"""`envace lab reference|sample|probe|plot`: the research tools (training data, training mixes, probes,
learning curves). Tested, but not what a user of the plugin needs; their code is `envace_mcp.lab`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Optional

import anyio
import typer
from rich.table import Table

from envace_mcp.cli._common import (
    SplitOpt,
    _fail,
    _holding,
    _model_name,
    _report_problems,
    _suite,
    console,
)
from envace_mcp.errors import EnvaceError

lab_app = typer.Typer(no_args_is_help=True, help="Research tools: reference and probe traces for SFT, seeded training "
                                                 "mixes, learning curves of several runs.")


@lab_app.command("reference")
def lab_reference(
    out: Annotated[Path, typer.Argument(file_okay=False, help="trace folder to write")],
    suite: Annotated[str, typer.Option(help="bank or retail")] = "bank",
    split: SplitOpt = "train",
    limit: Annotated[Optional[int], typer.Option(min=1, help="only the first N tasks")] = None,
    model: Annotated[Optional[str], typer.Option(callback=_model_name, help="tokenizer/model for token ids and logprobs")] = None,
    logprobs: Annotated[bool, typer.Option(help="score each turn (needed by offline GRPO; SFT needs only tokens)")] = True,
    tool_format: Annotated[Literal["json", "compact"], typer.Option(
        help="tools in act prompts, for templates without native tools: JSON schemas or one line per tool")] = "json",
    rehearse_format: Annotated[Literal["simulator", "inline"], typer.Option(
        help="rehearse prompts: EnvACE's fresh simulator chat, or the act context continued with the tool's reply")] = "simulator",
    rehearsed: Annotated[int, typer.Option(min=0, help="start each run with the rehearsal memory of this many imagined attempts (right, mistyped, cut short, falling into the task's trap), as test-time rehearsal (`envace eval -c rehearse=N`) would: SFT data for an act role that will see one")] = 0,
    seed: Annotated[int, typer.Option(help="with --rehearsed: which attempts are drawn")] = 0,
) -> None:
    """Record the suite's reference solutions through the graph (teacher forcing): SFT data."""
    from envace_mcp._progress import Progress
    from envace_mcp.lab.reference import record_reference_traces
    from envace_mcp.policy import load_policy

    total = len(_suite(suite).split(split))
    scores: list[float] = []

    def on_task(task_id: str, score: float) -> None:
        scores.append(score)
        progress.advance(**{"mean score": round(sum(scores) / len(scores), 3)})

    with _holding(out):
        policy = load_policy(model, tool_format=tool_format, rehearse_format=rehearse_format)
        with Progress(f"{suite} {split} references", total=min(limit or total, total), console=console) as progress:
            written = anyio.run(lambda: record_reference_traces(policy, suite, out, split=split, limit=limit,
                                                                score=logprobs, on_task=on_task, rehearsed=rehearsed,
                                                                seed=seed))
    console.print(f"wrote {written} runs to {out}")


@lab_app.command("sample")
def lab_sample(
    out: Annotated[Path, typer.Argument(file_okay=False, help="trace folder to write (new, or without traces)")],
    sources: Annotated[list[str], typer.Argument(help="trace folders, each DIR (every run) or DIR:N (N runs drawn from it)")],
    seed: Annotated[int, typer.Option(help="which runs are drawn")] = 0,
) -> None:
    """A seeded training mix: runs drawn from several trace folders into one (`envace train sft --traces OUT`).
    From each `DIR:N`, N runs without replacement; attached rewards travel with their runs; the same
    folders and seed draw the same runs."""
    from envace_mcp.lab.sample import draw_sample, parse_source, refuse_filled, write_sample

    try:
        for source in sources:  # every source checked before the output folder
            parse_source(source)
        refuse_filled(out)
        drawn = draw_sample(sources, seed, on_problems=_report_problems)
    except EnvaceError as exc:
        _fail(exc)
    with _holding(out):
        try:
            written = write_sample(out, drawn)
        except EnvaceError as exc:
            _fail(exc)
    console.print(f"wrote {written} runs to {out}: "
                  + ", ".join(f"{len(d.runs)} of {d.held} from {d.folder}" for d in drawn))


@lab_app.command("probe")
def lab_probe(
    out: Annotated[Path, typer.Argument(file_okay=False, help="trace folder to write")],
    suite: Annotated[str, typer.Option(help="bank or retail")] = "bank",
    split: SplitOpt = "fit",
    limit: Annotated[Optional[int], typer.Option(min=1, help="only the first N tasks")] = None,
    per_call: Annotated[int, typer.Option(min=1, help="probes of each reference call (one per mutation family first)")] = 2,
    seed: Annotated[int, typer.Option(help="which mutations are picked")] = 0,
    mutations: Annotated[Optional[str], typer.Option(help="only these, comma-separated: typo (drop_digit, digit), swap, scale, halve, enum (default: all)")] = None,
    model: Annotated[Optional[str], typer.Option(callback=_model_name, help="tokenizer/model for token ids (default: embedded SmolLM2)")] = None,
    adapter: Annotated[Optional[str], typer.Option(help="a LoRA adapter folder (its prompt formats apply); with --own-rehearsals, the world model measured")] = None,
    own_rehearsals: Annotated[bool, typer.Option(help="the model rehearses each probed call itself: its world model on wrong calls, scored against the real replies")] = False,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="with --own-rehearsals")] = 160,
    tool_format: Annotated[Optional[Literal["json", "compact"]], typer.Option(help="tools in act prompts (default: the adapter's, else json)")] = None,
    rehearse_format: Annotated[Optional[Literal["simulator", "inline"]], typer.Option(help="rehearse prompts (default: the adapter's, else simulator)")] = None,
) -> None:
    """Record reference prefixes with one perturbed call each (an id mistyped, an amount x 100, another
    enum value), answered by the suite's sandbox server: SFT data with real errors for the world model."""
    from envace_mcp.envs import require_sandbox
    from envace_mcp.lab.probes import check_kinds

    try:
        kinds = check_kinds([k.strip() for k in mutations.split(",") if k.strip()] if mutations is not None else None)
    except EnvaceError as exc:
        _fail(EnvaceError(f"--mutations: {exc}"))
    try:
        total = len(require_sandbox(_suite(suite)).split(split))  # before anything heavy is imported
    except EnvaceError as exc:
        _fail(exc)
    from envace_mcp._files import write_atomic
    from envace_mcp._progress import Progress
    from envace_mcp.lab.probes import record_probe_traces
    from envace_mcp.policy import SamplingParams, load_policy

    formats = {k: v for k, v in (("tool_format", tool_format), ("rehearse_format", rehearse_format)) if v}
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    with _holding(out):
        policy = load_policy(model, adapter=adapter, **formats)
        with Progress(f"{suite} {split} probes", total=min(limit or total, total), console=console) as progress:
            summary = anyio.run(lambda: record_probe_traces(
                policy, suite, out, split=split, limit=limit, per_call=per_call, seed=seed, kinds=kinds,
                own_rehearsals=own_rehearsals,
                sampling={"rehearse": greedy}, on_task=lambda task_id, n: progress.advance()))
        report = summary.to_dict()
        write_atomic(out / "probes.json", json.dumps(report, indent=2) + "\n")
    table = Table(title=f"{report['runs']} probes in {out} ({report['real_errors']} real errors)")
    columns = ["mutation", "probes", "real errors"] + (["status right"] if own_rehearsals else [])
    for col in columns:
        table.add_column(col)
    for mutation, row in sorted(report["by_mutation"].items()):
        table.add_row(mutation, str(row["runs"]), str(row["real_errors"]), *([str(row["status_right"])] if own_rehearsals else []))
    console.print(table)
    if own_rehearsals:
        console.print(f"world model: field accuracy {report.get('field_accuracy', '-')}, errors predicted "
                      f"{report.get('error_predicted', '-')}, successes predicted {report.get('success_predicted', '-')}")


@lab_app.command("plot")
def lab_plot(
    runs: Annotated[list[Path], typer.Argument(exists=True, file_okay=False, help="training --out folders (each with a metrics.jsonl), e.g. one per arm")],
    out: Annotated[Path, typer.Option(dir_okay=False, help="the PNG to write")] = Path("runs.png"),
) -> None:
    """Learning curves of several training runs in one PNG, one line per run: reward, success, uniform groups, loss and more over steps."""
    from envace_mcp.lab.plot import plot_runs

    try:
        plot_runs(runs, out)
    except EnvaceError as exc:
        _fail(exc)
    console.print(f"{len(runs)} runs plotted to {out}")

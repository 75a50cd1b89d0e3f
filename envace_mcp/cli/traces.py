"""`envace traces ls|show|stats|reference|sample|probe`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import anyio
import typer
from rich.table import Table
from rich.text import Text

from envace_mcp._terminal import call_display, safe
from envace_mcp.cli._common import (
    SplitOpt,
    TracesDir,
    _fail,
    _holding,
    _model_name,
    _report_problems,
    _store,
    _suite,
    console,
    traces_app,
)
from envace_mcp.errors import EnvaceError


@traces_app.command("ls")
def traces_ls(
    directory: TracesDir,
    suite: Optional[str] = None,
    task: Optional[str] = None,
    status: Optional[str] = None,
    limit: Annotated[int, typer.Option(min=1, help="rows shown")] = 50,
) -> None:
    """A table of recorded runs (newest last)."""
    store = _store(directory)
    table = Table(title=f"runs in {directory}")
    for col in ("run", "task", "group", "mode", "status", "task reward", "steps", "real calls", "started"):
        table.add_column(col)
    import datetime

    shown = 0
    for trace in store.read(suite=suite, task=task, status=status):
        if shown >= limit:
            break
        shown += 1
        reward = trace.reward("task")
        real = sum(1 for s in trace.steps if s.ran and s.result)
        when = datetime.datetime.fromtimestamp(trace.started_at).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(*(safe(str(v)) for v in (trace.run_id[:12], trace.task_id or "-", trace.group_id or "-", trace.mode,
                                                trace.status)),
                      "-" if reward is None or reward.value is None else f"{reward.value:.2f}", str(len(trace.steps)),
                      str(real), when)
    console.print(table)
    _report_problems(store)


@traces_app.command("show")
def traces_show(run: Annotated[str, typer.Argument(help="run id (a prefix is enough)")],
                directory: Annotated[Path, typer.Option("--dir", file_okay=False, help="trace folder")] = Path("traces")) -> None:
    """One run as a transcript: each call's rehearsal beside what really happened."""
    store = _store(directory)
    try:
        trace = store.get(run)
    except EnvaceError as exc:
        _fail(exc)
    console.print(Text.assemble(safe(str(trace.run_id), "bold"), " ", safe(f"{trace.task_id or ''} ({trace.mode}, {trace.status}, "
                                                                  f"model {trace.model})")))
    if trace.task:
        console.print(safe(trace.task, "italic"))
    predictions: dict[str, Any] = {}
    for step in trace.steps:
        if step.role == "act":
            calls = (step.parsed or {}).get("tool_calls") or []
            for call in calls:  # whole: a review shows every argument the call carried
                console.print(call_display(call.get("name"), call.get("arguments"), console.width, Text("act → ", "bold")))
            if not calls:
                console.print(Text.assemble(("act: ", "bold"), safe((step.text or "")[:300])))
        elif step.role == "rehearse":
            predictions[step.call_id] = step.parsed
            p = step.parsed or {}
            shown = p.get("result") if p.get("status") != "invalid" else f"unusable ({p.get('code')})"
            console.print(Text.assemble("   ", ("rehearsed: ", "cyan"), safe(json.dumps(shown, default=str)[:240])))
        elif step.role == "gate":
            console.print(Text.assemble("   gate: ", safe(f"{step.decision} — {step.reason}")))
        elif step.role == "tool":
            result = step.result or {}
            text = result.get("structured_content") or "".join(str(b.get("text", "")) for b in result.get("content", []))
            label = "simulated" if step.simulated else "real"
            line = Text.assemble("   ", (f"{label}: ", "red" if result.get("is_error") else "green"),
                                 safe(json.dumps(text, default=str)[:240]))
            if step.comparison is not None:
                line.append_text(Text(" (matched)", "green") if step.comparison.score >= 0.999 else Text.assemble(
                    (f" MISMATCH {step.comparison.score:.2f} ", "bold red"), safe(step.comparison.mismatches[:4])))
            console.print(line)
        elif step.role == "critique":
            console.print(Text.assemble("   ", ("critique: ", "magenta"), safe((step.text or "")[:240])))
    console.print(Text.assemble("final answer: ", safe(str(trace.final_answer))))
    for reward in trace.rewards:
        console.print(safe(f"reward {reward.name}: {reward.value}"))
    if trace.error:
        console.print(Text.assemble(("error: ", "red"), safe(str(trace.error))))


@traces_app.command("stats")
def traces_stats(directory: TracesDir, suite: Optional[str] = None) -> None:
    """Counts, success rate, the world model on executed calls, tokens, real calls made and avoided."""
    from envace_mcp.eval.metrics import fidelity_summary, rehearsal_fidelity
    from envace_mcp.eval.report import number
    from envace_mcp.traces.schema import STOPPED

    store = _store(directory)
    runs, rewards, fidelity, tokens, real, avoided, generations = 0, [], [], 0, 0, 0, 0
    statuses: dict[str, int] = {}
    for trace in store.read(suite=suite):
        runs += 1
        statuses[trace.status] = statuses.get(trace.status, 0) + 1
        fidelity += rehearsal_fidelity(trace)
        reward = trace.reward("task")
        if reward is not None and reward.value is not None:
            rewards.append(reward.value)
        for step in trace.steps:
            if step.prompt_ids is not None or step.completion_ids is not None:
                generations += 1
                tokens += len(step.prompt_ids or []) + len(step.completion_ids or [])
            if step.ran:
                real += 1
            if step.role == "gate" and (step.decision in STOPPED or step.decision == "simulate"):
                avoided += 1
    table = Table(title=f"{runs} runs in {directory}")
    table.add_column("measure")
    table.add_column("value")
    table.add_row("status", ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) or "-")
    table.add_row("success rate (task reward = 1)", f"{sum(r >= 1.0 for r in rewards) / len(rewards):.1%}" if rewards else "-")
    table.add_row("mean task reward", f"{sum(rewards) / len(rewards):.3f}" if rewards else "-")
    world = fidelity_summary(fidelity)
    table.add_row("rehearsal fidelity (mean match)", f"{world['field_accuracy']:.3f} over {len(fidelity)} executed calls"
                  if fidelity else "-")
    if fidelity:
        table.add_row("  exact / status right", f"{number(world['exact_match'])} / {number(world['error_prediction'])}")
        for kind, what in (("echoed", "echoed from the call"), ("seen", "seen earlier in the run"),
                           ("new", "new (computed, made)")):
            table.add_row(f"  fields {what}", f"{number(world[f'{kind}_field_accuracy'])} of {world[f'{kind}_fields']}")
    table.add_row("tokens (prompt + completion)", f"{tokens} in {generations} generations")
    table.add_row("real calls made", str(real))
    table.add_row("real calls avoided by the gate", str(avoided))
    console.print(table)
    _report_problems(store)


@traces_app.command("reference")
def traces_reference(
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
    rehearsed: Annotated[int, typer.Option(min=0, help="start each run with the rehearsal memory of this many imagined attempts (right, mistyped, cut short, falling into the task's trap), as test-time rehearsal (`envace eval --rehearse N`) would: SFT data for an act role that will see one")] = 0,
    seed: Annotated[int, typer.Option(help="with --rehearsed: which attempts are drawn")] = 0,
) -> None:
    """Record the suite's reference solutions through the graph (teacher forcing): SFT data."""
    from envace_mcp._progress import Progress
    from envace_mcp.policy import load_policy
    from envace_mcp.train.reference import record_reference_traces

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


@traces_app.command("sample")
def traces_sample(
    out: Annotated[Path, typer.Argument(file_okay=False, help="trace folder to write (new, or without traces)")],
    sources: Annotated[list[str], typer.Argument(help="trace folders, each DIR (every run) or DIR:N (N runs drawn from it)")],
    seed: Annotated[int, typer.Option(help="which runs are drawn")] = 0,
) -> None:
    """A seeded training mix: runs drawn from several trace folders into one (`envace train sft --traces OUT`).
    From each `DIR:N`, N runs without replacement; attached rewards travel with their runs; the same
    folders and seed draw the same runs."""
    import random

    from envace_mcp.traces import TraceStore

    picks: list[tuple[Path, int | None]] = []
    for source in sources:
        folder, _, count = source.rpartition(":")
        if not (folder and count.isdigit()):
            folder, count = source, ""
        if count == "0":
            _fail(ValueError(f"{source}: N must be at least 1"))
        path = Path(folder)
        if not path.is_dir():
            _fail(ValueError(f"trace folder {folder!r} does not exist"))
        picks.append((path, int(count) if count else None))
    if TraceStore(out).files():
        _fail(ValueError(f"{out} already holds traces; a sample goes into a new folder"))
    rng, drawn = random.Random(seed), []
    for path, count in picks:  # every source drawn before anything is written: a bad one leaves no half mix
        store = TraceStore(path)
        runs = list(store.read())
        _report_problems(store)
        if count is not None and count > len(runs):
            _fail(ValueError(f"{path} holds {len(runs)} runs, fewer than the {count} asked for"))
        drawn.append((path, runs if count is None else rng.sample(runs, count), len(runs)))
    with _holding(out):
        target = TraceStore(out)
        if target.files():  # written meanwhile
            _fail(ValueError(f"{out} already holds traces; a sample goes into a new folder"))
        for _, chosen, _ in drawn:
            for trace in chosen:
                target.append(trace)
    console.print(f"wrote {sum(len(chosen) for _, chosen, _ in drawn)} runs to {out}: "
                  + ", ".join(f"{len(chosen)} of {total} from {path}" for path, chosen, total in drawn))


@traces_app.command("probe")
def traces_probe(
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
    from envace_mcp.eval.suites import require_sandbox
    from envace_mcp.train.probes import check_kinds

    try:
        kinds = check_kinds([k.strip() for k in mutations.split(",") if k.strip()] if mutations is not None else None)
    except EnvaceError as exc:
        _fail(EnvaceError(f"--mutations: {exc}"))
    try:
        total = len(require_sandbox(_suite(suite)).split(split))  # before anything heavy is imported
    except EnvaceError as exc:
        _fail(exc)
    from envace_mcp._progress import Progress
    from envace_mcp._files import write_atomic
    from envace_mcp.policy import SamplingParams, load_policy
    from envace_mcp.train.probes import record_probe_traces

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

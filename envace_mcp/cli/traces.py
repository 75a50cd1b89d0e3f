"""`envace traces ls|show|stats|import|export`."""

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
    TracesDir,
    _fail,
    _holding,
    _report_problems,
    _servers_file,
    _store,
    console,
    traces_app,
)
from envace_mcp.errors import EnvaceError, UserError
from envace_mcp.traces.exporting import BUILT_IN, ExportConfig, get_exporter

SuiteFilter = Annotated[Optional[str], typer.Option(help="only the runs of this suite, e.g. bank")]
TaskFilter = Annotated[Optional[str], typer.Option(help="only the runs of this task id, e.g. bank/test/0004")]
StatusFilter = Annotated[Optional[Literal["finished", "interrupted", "failed"]], typer.Option(
    help="only the runs that ended this way")]


@traces_app.command("ls")
def traces_ls(
    directory: TracesDir,
    suite: SuiteFilter = None,
    task: TaskFilter = None,
    status: StatusFilter = None,
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
            if step.approved is not None:  # what the person said when the call was put to them
                said = ("approved", "green") if step.approved else ("denied", "red")
                edit = (f" as {step.edited.get('name')}({json.dumps(step.edited.get('args'), default=str)[:200]})"
                        if step.edited else "")
                console.print(Text.assemble("   ", said, safe(edit)))
            for asked in step.asked or []:  # what the server asked mid-call, and what it was told
                for question in asked.get("questions") or []:
                    console.print(Text.assemble("   ", (f"tool asks (round {asked.get('round')}): ", "magenta"),
                                                safe(question.get("message")), " ", safe(question.get("url") or "")))
                answers = asked.get("answers")
                console.print(Text.assemble("   ", ("answered: ", "magenta"), safe(json.dumps(answers, default=str)[:240])
                                            if answers is not None else safe(f"nothing ({asked.get('why')})", "red")))
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
def traces_stats(directory: TracesDir, suite: SuiteFilter = None) -> None:
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
        for kind, what in (("echoed", "echoed from the call"), ("seen", "read earlier in the run"),
                           ("new", "computed (or made) by the server")):
            table.add_row(f"  fields {what}", f"{number(world[f'{kind}_field_accuracy'])} of {world[f'{kind}_fields']}")
    table.add_row("tokens (prompt + completion)", f"{tokens} in {generations} generations")
    table.add_row("real calls made", str(real))
    table.add_row("real calls avoided by the gate", str(avoided))
    console.print(table)
    _report_problems(store)


@traces_app.command("import")
def traces_import(
    log: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL tool-call log, one episode a line "
                                                                          "(or, with --format, examples or trajectories)")],
    out: Annotated[Path, typer.Option(file_okay=False, help="trace folder to write (runs are appended)")],
    format: Annotated[Literal["log", "langsmith", "atif"], typer.Option(
        "--format", help="log: your agents' tool-call log; langsmith: runs written by `envace traces export "
                         "--format langsmith` (LangSmith dataset examples); atif: ATIF trajectories, a .json file "
                         "holding one or a list, or JSONL, one a line (extra `atif`)")] = "log",
    servers: Annotated[Optional[Path], typer.Option(
        "--servers", "-s", exists=True, dir_okay=False, callback=_servers_file,
        help="mcpServers JSON file of the servers the log's tools are on (their catalog; --mutate replays on them)")] = None,
    catalog: Annotated[Optional[Path], typer.Option(
        exists=True, dir_okay=False, help="a saved catalog instead of live servers (`envace servers ls --json`, or "
                                          "tools/list's tools)")] = None,
    mutate: Annotated[int, typer.Option(
        min=0, metavar="N", help="per episode, up to N calls replayed with one argument changed against servers marked "
                                 "\"sandbox\": true")] = 0,
    seed: Annotated[int, typer.Option(help="with --mutate: which calls and changes are drawn")] = 0,
) -> None:
    """Your agents' tool-call logs as traces: every real call a world-model example (docs/traces.md)."""
    from envace_mcp.traces import TraceStore
    from envace_mcp.traces.importing import load_catalog, read_log
    from envace_mcp.traces.mutating import mutate_calls

    if format != "log":
        _import_runs(log, out, format, given=[name for name, value in (("--servers", servers), ("--catalog", catalog),
                                                                      ("--mutate", mutate)) if value])
        return
    if (servers is None) == (catalog is None):
        _fail(UserError("give the tools' catalog one way: --servers CONFIG.json (live servers) or --catalog FILE "
                        "(a saved one)"))
    if mutate and servers is None:
        _fail(UserError("--mutate replays calls against live servers: it needs --servers (entries marked "
                        "\"sandbox\": true), not --catalog"))
    try:
        specs = load_catalog(catalog) if catalog is not None else None
    except EnvaceError as exc:
        _fail(exc)
    store = TraceStore(out)

    async def from_servers() -> tuple[Any, Any]:
        from envace_mcp.toolbox import Toolbox

        async with Toolbox(servers) as toolbox:  # type: ignore[arg-type]
            for problem in toolbox.problems:
                console.print(Text.assemble(("warning: ", "yellow"), safe(problem, newlines=True)))
            traces, summary = read_log(log, toolbox.catalog)
            for trace in traces:
                store.append(trace)
            if not mutate:
                return summary, None
            variants, changed = await mutate_calls(traces, toolbox, per_episode=mutate, seed=seed)
            for variant in variants:
                store.append(variant)
            return summary, changed

    with _holding(out):
        try:
            if specs is not None:
                traces, summary = read_log(log, specs)
                for trace in traces:
                    store.append(trace)
                changed = None
            else:
                summary, changed = anyio.run(from_servers)
        except EnvaceError as exc:
            _fail(exc)
    for line in [*summary.report(), *(changed.report() if changed is not None else []), f"wrote to {out}"]:
        console.print(safe(line), soft_wrap=True)  # one line each, however long: the terminal folds it


def _import_runs(path: Path, out: Path, format: str, given: list[str]) -> None:
    """`envace traces import FILE --format langsmith|atif`: the runs of a LangSmith examples file or of ATIF
    trajectories, appended to `out`."""
    from envace_mcp.traces import TraceStore
    from envace_mcp.traces.atif import read_atif
    from envace_mcp.traces.langsmith import read_examples

    if given:
        where = "inputs.tools" if format == "langsmith" else "agent.tool_definitions"
        _fail(UserError(f"{', '.join(given)}: a {format} file carries its own catalog ({where}); import it with "
                        f"--format {format} and --out alone"))
    try:
        traces, summary = (read_examples if format == "langsmith" else read_atif)(path)
    except EnvaceError as exc:
        _fail(exc)
    store = TraceStore(out)
    with _holding(out):
        for trace in traces:
            store.append(trace)
    for line in [*summary.report(), f"wrote to {out}"]:
        console.print(safe(line), soft_wrap=True)


@traces_app.command("export")
def traces_export(
    directory: TracesDir,
    format: Annotated[str, typer.Option(
        "--format", metavar="FORMAT",
        help="where the runs go: " + "; ".join(f"{name}: {text}" for name, (_, text) in BUILT_IN.items())
             + "; or any exporter registered by that name (docs/traces.md)")] = "otel",
    otlp: Annotated[Optional[str], typer.Option(
        metavar="URL", help="OTLP/HTTP endpoint: a collector's http://HOST:4318 (/v1/traces is added) or its full "
                            "traces URL; default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT "
                            "(headers from OTEL_EXPORTER_OTLP_HEADERS)")] = None,
    out: Annotated[Optional[Path], typer.Option(dir_okay=False, help="--format langsmith, atif or trl: the JSONL "
                                                                     "file to write")] = None,
    content: Annotated[bool, typer.Option(
        "--content", help="otel: also export prompts, completions, tool arguments and results, the gate's reasons "
                          "(opt-in content, as the GenAI conventions have it)")] = False,
    tokens: Annotated[bool, typer.Option(
        "--tokens", help="langsmith, atif: keep the generations' token ids and logprobs (atif: the act turns'; "
                         "trl rows always hold the act turns' where recorded)")] = False,
    suite: SuiteFilter = None,
    task: TaskFilter = None,
    status: StatusFilter = None,
) -> None:
    """Recorded runs to an observability backend (OpenTelemetry), a LangSmith dataset file, ATIF
    trajectories, TRL dataset rows, or any registered exporter (docs/traces.md)."""
    try:  # the exporter refuses options it does not take before any run is read
        exporter = get_exporter(format)(ExportConfig(out=out, endpoint=otlp, content=content, tokens=tokens))
    except EnvaceError as exc:
        _fail(exc)
    store = _store(directory)
    traces = list(store.read(suite=suite, task=task, status=status))
    _report_problems(store)
    if not traces:
        _fail(UserError(f"no runs to export in {directory}" + (" that match the filters" if suite or task or status
                                                               else "")))
    try:
        summary = exporter.export(traces)
    except EnvaceError as exc:
        _fail(exc)
    for why in summary.left_out:
        console.print(Text.assemble(("warning: ", "yellow"), safe(why)), soft_wrap=True)
    console.print(safe(summary.done), soft_wrap=True)

"""The `envace` command.

    envace demo                          # list the bundled servers' tools, solve a test task over stdio
    envace servers ls [--servers mcp.json] [--json]
    envace servers config                # an mcpServers JSON for the bundled servers
    envace servers serve bank --transport http --port 8001
    envace tasks ls bank --split test
    envace tasks show bank/test/0004
    envace call get_balance '{"account_id": "CHK-1"}' --servers mcp.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import anyio
import typer
from rich.console import Console
from rich.table import Table

from envace_mcp.errors import EnvaceError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Agents that rehearse before they act (EnvACE) for LangGraph + MCP.")
servers_app = typer.Typer(no_args_is_help=True, help="MCP servers: list tools, print configs, serve the bundled ones.")
tasks_app = typer.Typer(no_args_is_help=True, help="The bundled task suites.")
policy_app = typer.Typer(no_args_is_help=True, help="The policy model: try its roles against real tools.")
traces_app = typer.Typer(no_args_is_help=True, help="Recorded runs: list, show, summarise.")
app.add_typer(traces_app, name="traces")
train_app = typer.Typer(no_args_is_help=True, help="Training from recorded runs: SFT warm start, offline GRPO.")
app.add_typer(train_app, name="train")
app.add_typer(servers_app, name="servers")
app.add_typer(tasks_app, name="tasks")
app.add_typer(policy_app, name="policy")

console = Console()

ServersOpt = Annotated[Optional[Path], typer.Option("--servers", "-s", help="mcpServers JSON file (default: the bundled servers over stdio)")]


def _bundled_config() -> dict[str, Any]:
    from envace_mcp.eval import get_suite, suites

    return {"mcpServers": {name: get_suite(name).stdio_config() for name in suites()}}


def _flags(spec: Any) -> str:
    a = spec.annotations
    if a.read_only:
        return "[green]read-only[/]"
    return ", ".join(x for x, on in (("[red]destructive[/]", a.destructive), ("idempotent", a.idempotent)) if on) or "write"


def _params(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    parts = []
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") or "|".join(p.get("type", "?") for p in prop.get("anyOf", [])) or ("enum" if "enum" in prop else "object")
        parts.append(f"{name}{'' if name in required else '?'}: {kind}")
    return ", ".join(parts)


def _catalog_table(catalog: Any) -> Table:
    table = Table(title="Tool catalog", show_lines=False)
    for col in ("tool", "server", "parameters", "returns", "annotations"):
        table.add_column(col)
    for spec in catalog:
        returns = spec.output_schema.get("title", "object") if spec.output_schema else "-"
        table.add_row(spec.name, spec.server, _params(spec.input_schema), returns, _flags(spec))
    return table


def _fail(exc: Exception) -> None:
    console.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(2)


def _suite(domain: str, seed: int = 0) -> Any:
    from envace_mcp.eval import get_suite

    try:
        return get_suite(domain, seed)
    except EnvaceError as exc:
        _fail(exc)


@servers_app.command("ls")
def servers_ls(servers: ServersOpt = None, as_json: Annotated[bool, typer.Option("--json", help="print the catalog as JSON")] = False) -> None:
    """List every tool of the configured servers with schemas and annotations."""
    from envace_mcp.toolbox import Toolbox

    async def main() -> None:
        async with Toolbox(servers or _bundled_config()) as toolbox:
            if as_json:
                print(json.dumps(toolbox.catalog.to_dicts(), indent=2))
            else:
                console.print(_catalog_table(toolbox.catalog))

    try:
        anyio.run(main)
    except EnvaceError as exc:
        _fail(exc)


@servers_app.command("config")
def servers_config() -> None:
    """Print an `mcpServers` JSON that launches the bundled servers over stdio."""
    print(json.dumps(_bundled_config(), indent=2))


@servers_app.command("serve")
def servers_serve(
    domain: Annotated[str, typer.Argument(help="bank or retail")],
    transport: Annotated[str, typer.Option(help="stdio or http")] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    seed: int = 0,
) -> None:
    """Run a bundled server in the foreground."""
    _suite(domain, seed).server_module.main(["--transport", transport, "--host", host, "--port", str(port), "--seed", str(seed)])


@tasks_app.command("ls")
def tasks_ls(
    domain: Annotated[str, typer.Argument(help="bank or retail")],
    split: Annotated[Optional[str], typer.Option(help="train or test")] = None,
    limit: int = 20,
    seed: int = 0,
) -> None:
    """List tasks of a bundled suite."""
    suite = _suite(domain, seed)
    tasks = [t for t in suite.tasks if split is None or t.split == split]
    table = Table(title=f"{domain}: {len(tasks)} tasks" + (f" ({split})" if split else ""))
    for col in ("id", "kind", "outcome", "calls", "instruction"):
        table.add_column(col)
    for task in tasks[:limit]:
        table.add_row(task.id, task.kind, task.outcome, str(len(task.actions)), task.instruction)
    console.print(table)


@tasks_app.command("show")
def tasks_show(task_id: str, seed: int = 0) -> None:
    """Show one task: instruction, reference actions, expected answer."""
    try:
        task = _suite(task_id.split("/")[0], seed).task(task_id)
    except EnvaceError as exc:
        _fail(exc)
    console.print(f"[bold]{task.id}[/] ({task.kind}, {task.outcome})\n{task.instruction}\n")
    for i, action in enumerate(task.actions, 1):
        console.print(f"  {i}. {action.tool}({json.dumps(action.arguments)})")
    if task.trap:
        console.print(f"  [red]trap:[/] {task.trap.tool}({json.dumps(task.trap.arguments)})")
    console.print(f"\nanswer: {task.answer}")


@app.command("call")
def call(
    tool: str,
    arguments: Annotated[str, typer.Argument(help="JSON object of arguments")] = "{}",
    servers: ServersOpt = None,
    timeout: float = 60.0,
) -> None:
    """Call one tool and print its result (errors are printed as data, exit code 1)."""
    from envace_mcp.toolbox import Toolbox

    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        _fail(ValueError(f"arguments are not JSON: {exc}"))

    async def main() -> Any:
        async with Toolbox(servers or _bundled_config(), timeout=timeout) as toolbox:
            return await toolbox.call(tool, args)

    try:
        result = anyio.run(main)
    except EnvaceError as exc:
        _fail(exc)
    print(json.dumps(result.model_dump(mode="json"), indent=2))
    raise typer.Exit(1 if result.is_error else 0)


def _gate(spec: str | None, **overrides: Any) -> Any:
    """`rehearse=all,require_approval=destructive,max_steps=6` as a GateConfig."""
    import dataclasses

    from envace_mcp.graph import GateConfig

    values: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(GateConfig)}
    for item in filter(None, (spec or "").split(",")):
        key, _, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in fields:
            _fail(ValueError(f"unknown gate setting {key!r}; known: {', '.join(fields)}"))
        default = getattr(GateConfig(), key)
        raw = raw.strip()
        if isinstance(default, bool):
            values[key] = raw.lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int) or key.startswith("max_"):
            values[key] = None if raw.lower() in ("none", "") else int(raw)
        else:
            values[key] = raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return GateConfig(**values)
    except TypeError as exc:
        _fail(ValueError(f"bad gate settings: {exc}"))


def _sampling(max_new_tokens: int, temperature: float, seed: int) -> dict[str, Any]:
    from envace_mcp.policy import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    return {"act": params, "rehearse": params, "critique": params}


@app.command("demo")
def demo(
    domain: Annotated[str, typer.Option(help="bank or retail")] = "bank",
    task_id: Annotated[Optional[str], typer.Option("--task", help="a task id (default: a simple test task)")] = None,
    transport: Annotated[str, typer.Option(help="stdio or http")] = "stdio",
    model: Annotated[Optional[str], typer.Option(help="Hugging Face id or folder (default: embedded SmolLM2)")] = None,
    adapter: Annotated[Optional[str], typer.Option(help="a LoRA adapter folder")] = None,
    reference: Annotated[bool, typer.Option("--reference", help="replay the reference solution instead of the agent")] = False,
    rehearse: Annotated[int, typer.Option(help="imagined runs before the real one (test-time rehearsal)")] = 0,
    max_steps: int = 4,
    max_new_tokens: int = 96,
    traces: Annotated[Optional[Path], typer.Option(help="record the run into this trace folder")] = None,
) -> None:
    """The main job: the agent (embedded model by default) solves a bundled server's test task over a
    real MCP transport, with every call's rehearsal, gate decision and real result shown, then the
    checker's score. `--reference` replays the reference solution instead."""
    from envace_mcp.eval import run_reference, run_task
    from envace_mcp.toolbox import Toolbox

    suite = _suite(domain)
    try:
        if task_id:
            task = suite.task(task_id)
        elif reference:
            task = max(suite.split("test"), key=lambda t: (len(t.write_actions), len(t.actions)))
        else:
            task = suite.split("test")[0]
    except EnvaceError as exc:
        _fail(exc)

    async def main(config: dict[str, Any]) -> None:
        async with Toolbox(config) as toolbox:
            console.print(_catalog_table(toolbox.catalog))
            console.print(f"\n[bold]Task {task.id}[/] ({task.kind}) over {transport}\n[italic]{task.instruction}[/]\n")
            if reference:
                episode, verdict = await run_reference(toolbox, suite, task, server=domain)
                for i, result in enumerate(episode.results, 1):
                    colour = "red" if result.is_error else "green"
                    console.print(f"  {i}. [bold]{result.tool}[/]({json.dumps(result.arguments)})  "
                                  f"[dim]{result.latency_s * 1000:.1f} ms[/]")
                    console.print(f"     [{colour}]→ {json.dumps(result.value)[:300]}[/]")
                console.print(f"\nanswer: {task.answer}")
            else:
                from envace_mcp._transcript import Transcript
                from envace_mcp.policy import load_policy

                with console.status(f"loading {model or 'the embedded SmolLM2-135M-Instruct'} …"):
                    try:
                        policy = load_policy(model, adapter=adapter)
                    except EnvaceError as exc:
                        _fail(exc)
                from envace_mcp.traces import TraceStore

                run = await run_task(suite, task, policy=policy, toolbox=toolbox, gate=_gate(None, max_steps=max_steps),
                                     rehearse_n=rehearse, on_update=Transcript(console).update,
                                     sampling=_sampling(max_new_tokens, 0.0, 0),
                                     store=TraceStore(traces) if traces else None)
                verdict = run.verdict
                if traces:
                    console.print(f"[dim]recorded run {run.trace.run_id} in {traces}[/]")
                console.print(f"\nreference answer: {task.answer}")
            for check in verdict.checks:
                console.print(f"  {'[green]✓' if check.passed else '[red]✗'}[/] {check.name} {check.detail}")
            console.print(f"[bold]checker score: {verdict.score:.2f}[/]")

    try:
        if transport == "http":
            with suite.serve_http() as url:
                anyio.run(main, {"mcpServers": {domain: {"url": url}}})
        else:
            anyio.run(main, {"mcpServers": {domain: suite.stdio_config()}})
    except EnvaceError as exc:
        _fail(exc)


@app.command("run")
def run_command(
    task: Annotated[str, typer.Argument(help="what the agent should do")],
    servers: ServersOpt = None,
    model: Annotated[Optional[str], typer.Option(help="Hugging Face id or folder (default: embedded SmolLM2)")] = None,
    adapter: Annotated[Optional[str], typer.Option(help="a LoRA adapter folder")] = None,
    mode: Annotated[str, typer.Option(help="real, simulated or mixed")] = "real",
    rehearse: Annotated[int, typer.Option(help="imagined runs before the real one (test-time rehearsal)")] = 0,
    strategy: Annotated[str, typer.Option(help="parallel or sequential test-time rehearsal")] = "parallel",
    gate: Annotated[Optional[str], typer.Option(help="e.g. rehearse=all,require_approval=destructive,max_steps=8")] = None,
    max_new_tokens: int = 160,
    temperature: float = 0.0,
    seed: int = 0,
    traces: Annotated[Optional[Path], typer.Option(help="record the run into this trace folder")] = None,
) -> None:
    """Run the EnvACE agent on a task: each proposed call, its rehearsal, the gate's decision and the
    real result, mismatches highlighted. Approvals are asked on the terminal."""
    if mode not in ("real", "simulated", "mixed") or strategy not in ("parallel", "sequential"):
        _fail(ValueError("--mode must be real, simulated or mixed; --strategy parallel or sequential"))
    gate_config = _gate(gate)
    anyio.run(_run, task, servers or _bundled_config(), model, adapter, mode, rehearse, strategy, gate_config,
              _sampling(max_new_tokens, temperature, seed), traces)


async def _run(task, servers, model, adapter, mode, rehearse, strategy, gate_config, sampling, traces) -> None:  # noqa: ANN001
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    from envace_mcp._transcript import Transcript
    from envace_mcp.graph import EnvaceContext, create_envace_graph
    from envace_mcp.graph.tts import condense, imagine
    from envace_mcp.policy import load_policy
    from envace_mcp.toolbox import Toolbox

    with console.status(f"loading {model or 'the embedded SmolLM2-135M-Instruct'} …"):
        try:
            policy = load_policy(model, adapter=adapter)
        except EnvaceError as exc:
            _fail(exc)
    try:
        async with Toolbox(servers) as toolbox:
            context = EnvaceContext(policy=policy, toolbox=toolbox, gate=gate_config, mode=mode, sampling=sampling)
            graph = create_envace_graph().compile(checkpointer=InMemorySaver())
            config = {"configurable": {"thread_id": "cli"}}
            notes = None
            if rehearse > 0:
                console.print(f"[dim]rehearsing {rehearse} imagined run(s) ({strategy}) …[/]")
                notes = condense(await imagine(create_envace_graph(), task, context, n=rehearse, strategy=strategy))
                console.print(notes)
            from envace_mcp.traces import TraceRecorder, TraceStore

            transcript = Transcript(console)
            recorder = TraceRecorder(context=context, rehearsal={"n": rehearse, "strategy": strategy} if rehearse else {})
            payload: Any = {"messages": [HumanMessage(content=task)], **({"notes": notes} if notes else {})}
            while True:
                async for kind, chunk in graph.astream(payload, config, context=context,
                                                       stream_mode=["updates", "custom", "values"]):
                    recorder.observe(kind, chunk)
                    if kind != "updates":
                        continue
                    for node, update in chunk.items():
                        if node != "__interrupt__":
                            transcript.update(node, update)
                snapshot = await graph.aget_state(config)
                pending = [i for t in snapshot.tasks for i in t.interrupts]
                if not pending:
                    break
                answers = {}
                for item in pending:
                    value = item.value
                    console.print(f"[magenta]approval needed:[/] {value['call']['name']}({json.dumps(value['call']['arguments'])})"
                                  f"\n   rehearsal: {json.dumps(value.get('rehearsal'))[:300]}\n   {value.get('reason')}")
                    answers[item.id] = sys.stdin.isatty() and typer.confirm("run it?", default=False)
                payload = Command(resume=answers)
            final = snapshot.values
            trace = recorder.finish(final, status="finished")
            if traces:
                TraceStore(traces).append(trace)
                console.print(f"[dim]recorded run {trace.run_id} in {traces}[/]")
    except EnvaceError as exc:
        _fail(exc)
    console.print(f"\n[bold]final answer:[/] {final.get('final_answer')}  [dim]({final.get('status')}, "
                  f"{final.get('real_calls', 0)} real call(s), {final.get('rehearsal_count', 0)} rehearsal(s))[/]")


@policy_app.command("try")
def policy_try(
    role: Annotated[str, typer.Option(help="rehearse or act")] = "rehearse",
    server: Annotated[str, typer.Option(help="a bundled server: bank or retail")] = "bank",
    tool: Annotated[Optional[str], typer.Option(help="the tool to rehearse (default: from the task)")] = None,
    args: Annotated[Optional[str], typer.Option(help="JSON arguments (default: the task's reference call)")] = None,
    task_id: Annotated[Optional[str], typer.Option("--task", help="task whose world and history to use")] = None,
    model: Annotated[Optional[str], typer.Option(help="Hugging Face id or local folder (default: embedded SmolLM2)")] = None,
    adapter: Annotated[Optional[str], typer.Option(help="a LoRA adapter folder to stack on the model")] = None,
    max_new_tokens: int = 160,
    temperature: float = 0.0,
    seed: int = 0,
) -> None:
    """Show the model's rehearsed prediction beside the real result (or its act turn for a task)."""
    if role not in ("rehearse", "act"):
        _fail(ValueError("--role must be rehearse or act"))
    suite = _suite(server)
    try:
        arguments = json.loads(args) if args else None
    except json.JSONDecodeError as exc:
        _fail(ValueError(f"--args is not JSON: {exc}"))
    try:
        task = suite.task(task_id) if task_id else next(
            (t for t in suite.split("test") if tool is None or any(a.tool == tool for a in t.actions)), None)
    except EnvaceError as exc:
        _fail(exc)
    if task is None:
        _fail(ValueError(f"no test task of {server!r} calls {tool!r}; pass --task"))
    anyio.run(_policy_try, role, suite, task, tool, arguments, model, adapter,
              {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed})


async def _policy_try(role, suite, task, tool, arguments, model, adapter, sampling) -> None:  # noqa: ANN001
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from rich.columns import Columns
    from rich.panel import Panel

    from envace_mcp.eval import Episode
    from envace_mcp.policy import ActRequest, Example, RehearseRequest, SamplingParams, ToolCall, load_policy
    from envace_mcp.policy.fidelity import compare
    from envace_mcp.policy.prompts import tool_call_text
    from envace_mcp.toolbox import Toolbox

    with console.status(f"loading {model or 'the embedded SmolLM2-135M-Instruct'} …"):
        try:
            policy = load_policy(model, adapter=adapter)
        except EnvaceError as exc:
            _fail(exc)
    params = SamplingParams(**sampling)
    config = {"mcpServers": {suite.name: suite.stdio_config()}}
    async with Toolbox(config) as toolbox:
        catalog = list(toolbox.catalog)
        console.print(f"[bold]{task.id}[/]: [italic]{task.instruction}[/]")
        if role == "act":
            gen = await policy.act(ActRequest(task=task.instruction, tools=catalog, instructions=suite.server_module.POLICY),
                                   params)
            calls = "\n".join(tool_call_text(c.name, c.arguments) for c in gen.parsed.tool_calls) or "(no tool call)"
            issues = ", ".join(i.code for i in gen.parsed.issues) or "none"
            reference = tool_call_text(task.actions[0].tool, task.actions[0].arguments)
            console.print(Columns([Panel(f"{calls}\n\nanswer: {gen.parsed.final_answer}\nissues: {issues}",
                                         title=f"act turn of {policy.name}"),
                                   Panel(reference, title="reference first call")]))
            return
        episode = Episode(task, suite.name)
        scope = toolbox.scoped(episode.meta)
        index = next((i for i, a in enumerate(task.actions) if tool is None or a.tool == tool), 0)
        target = task.actions[index]
        name, call_args = tool or target.tool, arguments if arguments is not None else target.arguments
        history = [HumanMessage(content=task.instruction)]
        examples = []
        for i, action in enumerate(task.actions[:index]):  # earlier steps happen for real first
            result = await scope.call(action.tool, action.arguments)
            history += [AIMessage(content="", tool_calls=[{"name": action.tool, "args": action.arguments, "id": f"h{i}"}]),
                        ToolMessage(content=result.text, tool_call_id=f"h{i}", name=action.tool)]
            examples.append(Example(action.tool, action.arguments, result.text))
        call = ToolCall(id="try", name=name, arguments=call_args)
        spec = toolbox.catalog.get(name)
        gen = await policy.rehearse(RehearseRequest(call=call, tool=spec, allowed=catalog, history=history,
                                                    act_message=tool_call_text(name, call_args), examples=examples),
                                    params)
        real = await scope.call(name, call_args)
    p = gen.parsed
    shown = json.dumps(p.result, indent=2) if p.result is not None else gen.text
    head = f"status: {p.status}" + (f" ({p.code})" if p.code else "") + (f"\n{p.message}" if p.message else "")
    real_head = f"status: {'error (' + str(real.error_kind) + ')' if real.is_error else 'result'}"
    console.print(f"call: {tool_call_text(name, call_args)}")
    console.print(Columns([Panel(f"{head}\n\n{shown[:1500]}", title=f"rehearsed by {policy.name}"),
                           Panel(f"{real_head}\n\n{json.dumps(real.value, indent=2)[:1500]}",
                                 title=f"real result from {suite.name}")]))
    match = compare(p, real)
    console.print(f"fidelity: {match.score:.2f} ({match.matched}/{match.fields} fields, status match: {match.status_match})"
                  f"  tokens: {len(gen.prompt_ids or [])} prompt + {len(gen.completion_ids or [])} generated")


TracesDir = Annotated[Path, typer.Argument(help="a trace folder")]


def _store(directory: Path) -> Any:
    from envace_mcp.traces import TraceStore

    if not directory.exists():
        _fail(ValueError(f"trace folder {str(directory)!r} does not exist"))
    return TraceStore(directory)


def _report_problems(store: Any) -> None:
    for problem in store.problems:
        console.print(f"[yellow]warning:[/] {problem}")


@traces_app.command("ls")
def traces_ls(
    directory: TracesDir,
    suite: Optional[str] = None,
    task: Optional[str] = None,
    status: Optional[str] = None,
    limit: int = 50,
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
        real = sum(1 for s in trace.steps if s.role == "tool" and not s.simulated and s.result and s.decision != "simulate")
        when = datetime.datetime.fromtimestamp(trace.started_at).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(trace.run_id[:12], trace.task_id or "-", trace.group_id or "-", trace.mode, trace.status,
                      "-" if reward is None or reward.value is None else f"{reward.value:.2f}", str(len(trace.steps)),
                      str(real), when)
    console.print(table)
    _report_problems(store)


@traces_app.command("show")
def traces_show(run: Annotated[str, typer.Argument(help="run id (a prefix is enough)")],
                directory: Annotated[Path, typer.Option("--dir", help="trace folder")] = Path("traces")) -> None:
    """One run as a transcript: each call's rehearsal beside what really happened."""
    store = _store(directory)
    try:
        trace = store.get(run)
    except EnvaceError as exc:
        _fail(exc)
    console.print(f"[bold]{trace.run_id}[/] {trace.task_id or ''} ({trace.mode}, {trace.status}, model {trace.model})")
    if trace.task:
        console.print(f"[italic]{trace.task}[/]")
    predictions: dict[str, Any] = {}
    for step in trace.steps:
        if step.role == "act":
            calls = (step.parsed or {}).get("tool_calls") or []
            for call in calls:
                console.print(f"[bold]act →[/] {call['name']}({json.dumps(call.get('arguments'))[:200]})")
            if not calls:
                console.print(f"[bold]act:[/] {(step.text or '')[:300]}")
        elif step.role == "rehearse":
            predictions[step.call_id] = step.parsed
            p = step.parsed or {}
            shown = p.get("result") if p.get("status") != "invalid" else f"unusable ({p.get('code')})"
            console.print(f"   [cyan]rehearsed:[/] {json.dumps(shown)[:240]}")
        elif step.role == "gate":
            console.print(f"   gate: {step.decision} — {step.reason}")
        elif step.role == "tool":
            result = step.result or {}
            text = result.get("structured_content") or "".join(b.get("text", "") for b in result.get("content", []))
            label = "simulated" if step.simulated else "real"
            line = f"   [{'red' if result.get('is_error') else 'green'}]{label}:[/] {json.dumps(text)[:240]}"
            if step.comparison is not None:
                line += (" [green](matched)[/]" if step.comparison.score >= 0.999 else
                         f" [bold red]MISMATCH {step.comparison.score:.2f}[/] {step.comparison.mismatches[:4]}")
            console.print(line)
        elif step.role == "critique":
            console.print(f"   [magenta]critique:[/] {(step.text or '')[:240]}")
    console.print(f"final answer: {trace.final_answer}")
    for reward in trace.rewards:
        console.print(f"reward {reward.name}: {reward.value}")
    if trace.error:
        console.print(f"[red]error:[/] {trace.error}")


@traces_app.command("stats")
def traces_stats(directory: TracesDir, suite: Optional[str] = None) -> None:
    """Counts, success rate, rehearsal fidelity, tokens, real calls made and avoided."""
    store = _store(directory)
    runs, rewards, fidelity, tokens, real, avoided, generations = 0, [], [], 0, 0, 0, 0
    statuses: dict[str, int] = {}
    for trace in store.read(suite=suite):
        runs += 1
        statuses[trace.status] = statuses.get(trace.status, 0) + 1
        reward = trace.reward("task")
        if reward is not None and reward.value is not None:
            rewards.append(reward.value)
        for step in trace.steps:
            if step.prompt_ids is not None or step.completion_ids is not None:
                generations += 1
                tokens += len(step.prompt_ids or []) + len(step.completion_ids or [])
            if step.role == "tool" and step.comparison is not None:
                fidelity.append(step.comparison.score)
            if step.role == "tool" and not step.simulated and step.decision not in ("feedback", "block", "reject", "budget", "rejected_by_human"):
                real += 1
            if step.role == "gate" and step.decision in ("feedback", "block", "reject", "budget", "simulate", "rejected_by_human"):
                avoided += 1
    table = Table(title=f"{runs} runs in {directory}")
    table.add_column("measure")
    table.add_column("value")
    table.add_row("status", ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) or "-")
    table.add_row("success rate (task reward = 1)", f"{sum(r >= 1.0 for r in rewards) / len(rewards):.1%}" if rewards else "-")
    table.add_row("mean task reward", f"{sum(rewards) / len(rewards):.3f}" if rewards else "-")
    table.add_row("rehearsal fidelity (mean match)", f"{sum(fidelity) / len(fidelity):.3f} over {len(fidelity)} calls" if fidelity else "-")
    table.add_row("tokens (prompt + completion)", f"{tokens} in {generations} generations")
    table.add_row("real calls made", str(real))
    table.add_row("real calls avoided by the gate", str(avoided))
    console.print(table)
    _report_problems(store)


@traces_app.command("reference")
def traces_reference(
    out: Annotated[Path, typer.Argument(help="trace folder to write")],
    suite: Annotated[str, typer.Option(help="bank or retail")] = "bank",
    split: Annotated[str, typer.Option(help="train or test")] = "train",
    limit: Annotated[Optional[int], typer.Option(help="only the first N tasks")] = None,
    model: Annotated[Optional[str], typer.Option(help="tokenizer/model for token ids and logprobs")] = None,
) -> None:
    """Record the suite's reference solutions through the graph (teacher forcing): SFT data."""
    from rich.progress import Progress

    from envace_mcp.policy import load_policy
    from envace_mcp.train.reference import record_reference_traces

    _suite(suite)
    policy = load_policy(model)
    with Progress(console=console) as progress:
        bar = progress.add_task(f"{suite} {split} references", total=limit or len(_suite(suite).split(split)))
        written = anyio.run(lambda: record_reference_traces(policy, suite, out, split=split, limit=limit,
                                                            on_task=lambda *_: progress.advance(bar)))
    console.print(f"wrote {written} runs to {out}")


@train_app.command("sft")
def train_sft_command(
    traces: Annotated[Path, typer.Option(help="trace folder (e.g. from `envace traces reference`)")],
    out: Annotated[Path, typer.Option(help="where the adapter (or model) is saved")],
    model: Annotated[Optional[str], typer.Option(help="base model (default: embedded SmolLM2)")] = None,
    full: Annotated[bool, typer.Option("--full", help="full fine-tune instead of LoRA")] = False,
    epochs: int = 2,
    lr: Optional[float] = None,
    batch_size: int = 4,
    min_reward: float = 1.0,
) -> None:
    """Behaviour cloning: act turns of successful runs, rehearse turns aimed at the real results."""
    from rich.progress import Progress
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.policy.embedded import embedded_model_dir
    from envace_mcp.train.sft import SFTConfig, sft_rows, train_sft

    name = model or str(embedded_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(name)
    lm = AutoModelForCausalLM.from_pretrained(name)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = sft_rows(_store(traces).read(), encode, end if isinstance(end, int) else tokenizer.eos_token_id,
                    min_reward=min_reward)
    if not rows:
        _fail(ValueError(f"no SFT rows in {traces}: need successful runs with token ids"))
    config = SFTConfig(epochs=epochs, batch_size=batch_size, lora=not full, lr=lr or (2e-4 if not full else 1e-5))
    out.mkdir(parents=True, exist_ok=True)
    with Progress(console=console) as progress, open(out / "metrics.jsonl", "w") as log:
        bar = progress.add_task("SFT", total=config.epochs * ((len(rows) + batch_size - 1) // batch_size))

        def on_step(m: dict[str, float]) -> None:
            log.write(json.dumps(m) + "\n")
            progress.update(bar, advance=1, description=f"SFT loss {m['loss']:.3f}")

        train_sft(lm, rows, tokenizer.pad_token_id or 0, config, out=out, on_step=on_step)
    tokenizer.save_pretrained(out)
    console.print(f"trained on {len(rows)} rows; saved to {out}")


@train_app.command("grpo")
def train_grpo_command(
    out: Annotated[Path, typer.Option(help="checkpoints, metrics.jsonl and metrics.png go here")],
    traces: Annotated[Optional[Path], typer.Option(help="offline: a trace folder of grouped, rewarded runs")] = None,
    suite: Annotated[Optional[str], typer.Option(help="online: roll out this bundled suite's train tasks")] = None,
    k: Annotated[int, typer.Option(help="online: runs per task (GRPO group size)")] = 4,
    mode: Annotated[str, typer.Option(help="online: simulated (EnvACE), real or mixed")] = "simulated",
    max_new_tokens: int = 128,
    config: Annotated[Optional[Path], typer.Option(help="GRPOConfig as JSON (every field optional)")] = None,
    steps: Optional[int] = None,
) -> None:
    """EnvACE role-wise GRPO, from recorded runs (--traces) or fresh rollouts (--suite); the same --out resumes."""
    from pydantic import ValidationError

    from envace_mcp.train.trainer import GRPOConfig, OfflineGRPO, OnlineGRPO

    if (traces is None) == (suite is None):
        _fail(ValueError("give exactly one of --traces (offline) or --suite (online rollouts)"))
    if mode not in ("simulated", "real", "mixed"):
        _fail(ValueError("--mode must be simulated, real or mixed"))

    try:
        settings = GRPOConfig(**(json.loads(config.read_text()) if config else {}))
    except (ValidationError, ValueError, OSError) as exc:
        _fail(ValueError(f"bad GRPO config: {exc}"))
    if steps is not None:
        settings.steps = steps
    try:
        if traces is not None:
            trainer: Any = OfflineGRPO(settings, _store(traces).directory, out)
        else:
            trainer = _online_trainer(settings, suite, out, k, mode, max_new_tokens)
        records = trainer.run(progress=True)
    except EnvaceError as exc:
        _fail(exc)
    if records:
        console.print(f"step {records[-1]['step']}: loss {records[-1]['loss']:.4f}, reward {records[-1]['reward']:.3f}; "
                      f"metrics in {out / 'metrics.jsonl'}, plot {out / 'metrics.png'}")


def _online_trainer(settings: Any, suite_name: str, out: Path, k: int, mode: str, max_new_tokens: int) -> Any:
    from envace_mcp.policy import SamplingParams
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.train.trainer import OnlineGRPO

    if mode != "simulated":
        _fail(ValueError("online rollouts in real/mixed mode from the CLI are not wired yet; use --mode simulated"))
    suite = _suite(suite_name)

    async def catalog() -> list[Any]:
        async with Toolbox({suite.name: suite.build_server()}) as toolbox:
            return list(toolbox.catalog)

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    return OnlineGRPO(settings, suite, out, k=k, mode=mode, tools=anyio.run(catalog),
                      sampling={"act": params, "rehearse": params})


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())

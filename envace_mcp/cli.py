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


@app.command("demo")
def demo(
    domain: Annotated[str, typer.Option(help="bank or retail")] = "bank",
    task_id: Annotated[Optional[str], typer.Option("--task", help="a task id (default: a multi-step test task)")] = None,
    transport: Annotated[str, typer.Option(help="stdio or http")] = "stdio",
) -> None:
    """List the bundled servers' tools, then solve a test task with its reference actions over a
    real transport, showing every call and the checker's score."""
    from envace_mcp.eval import get_suite, run_reference
    from envace_mcp.toolbox import Toolbox

    try:
        suite = get_suite(domain)
        task = suite.task(task_id) if task_id else max(suite.split("test"), key=lambda t: (len(t.write_actions), len(t.actions)))
    except EnvaceError as exc:
        _fail(exc)

    async def main(config: dict[str, Any]) -> None:
        async with Toolbox(config) as toolbox:
            console.print(_catalog_table(toolbox.catalog))
            console.print(f"\n[bold]Task {task.id}[/] ({task.kind}) over {transport}\n[italic]{task.instruction}[/]\n")
            episode, verdict = await run_reference(toolbox, suite, task, server=domain)
            for i, result in enumerate(episode.results, 1):
                colour = "red" if result.is_error else "green"
                console.print(f"  {i}. [bold]{result.tool}[/]({json.dumps(result.arguments)})  "
                              f"[dim]{result.latency_s * 1000:.1f} ms[/]")
                console.print(f"     [{colour}]→ {json.dumps(result.value)[:300]}[/]")
            console.print(f"\nanswer: {task.answer}")
            for check in verdict.checks:
                console.print(f"  {'[green]✓' if check.passed else '[red]✗'}[/] {check.name} {check.detail}")
            console.print(f"[bold]checker score: {verdict.score:.2f}[/]")

    try:
        if transport == "http":
            with suite.serve_http() as url:
                config = {"mcpServers": {domain: {"url": url}}}
                anyio.run(main, config)
        else:
            others = {name: entry for name, entry in _bundled_config()["mcpServers"].items()}
            anyio.run(main, {"mcpServers": others})
    except EnvaceError as exc:
        _fail(exc)


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


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())

"""`envace policy try`: the world model's prediction of one call beside the real result, on a bundled
suite's task or on a server of your own (`--servers`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import anyio
import typer
from rich.text import Text

from envace_mcp._terminal import discard_typed_ahead, inline_call, safe
from envace_mcp.cli._common import AdapterOpt, ModelOpt, _fail, _flags, _servers_file, _suite, console, loading, policy_app
from envace_mcp.errors import EnvaceError

OwnServersOpt = Annotated[Optional[Path], typer.Option(
    "--servers", "-s", exists=True, dir_okay=False, callback=_servers_file,
    help='an mcpServers JSON file: rehearse --tool with --args on your own servers (instead of --server). The real '
         'call runs if the tool is read-only, its server is marked "sandbox": true, or you confirm it on a terminal')]


@policy_app.command("try")
def policy_try(
    role: Annotated[Literal["rehearse", "act"], typer.Option(help="which role to try")] = "rehearse",
    server: Annotated[Optional[str], typer.Option(help="a bundled server: bank or retail (default: bank)")] = None,
    servers: OwnServersOpt = None,
    tool: Annotated[Optional[str], typer.Option(help="the tool to rehearse (default: from the task)")] = None,
    args: Annotated[Optional[str], typer.Option(help="JSON arguments (default: the task's reference call)")] = None,
    task_id: Annotated[Optional[str], typer.Option("--task", help="task whose world and history to use")] = None,
    model: ModelOpt = None,
    adapter: AdapterOpt = None,
) -> None:
    """Show the model's rehearsed prediction beside the real result (or its act turn for a task).

    On a bundled server (--server) the call is one of a test task's, with the task's earlier steps run
    first. On your own (--servers mcp.json, with --tool and --args) the call is rehearsed with no
    conversation; a tool that is not read-only runs for real only on a server marked "sandbox": true, or
    when you confirm it (off a terminal: never), and otherwise the prediction is shown alone. --adapter is
    the rehearse role's adapter. Sampled as every run is (greedy; 160 tokens for an act turn, 400 for a
    rehearsal)."""
    try:
        arguments = json.loads(args) if args else None
    except json.JSONDecodeError as exc:
        _fail(ValueError(f"--args is not JSON: {exc}"))
    if arguments is not None and not isinstance(arguments, dict):
        _fail(ValueError(f"--args must be a JSON object, not {type(arguments).__name__}"))
    if servers is not None:
        clash = "--server" if server is not None else "--task" if task_id else "--role act" if role == "act" else None
        if clash:
            _fail(ValueError(f"{clash} is for the bundled suites and --servers for your own: give one (with --servers, "
                             "--tool and --args name the call to rehearse)"))
        if tool is None or arguments is None:
            _fail(ValueError("--servers needs --tool NAME and --args JSON: the call to rehearse"))
        anyio.run(_try_own, servers, tool, arguments, model, adapter)
        return
    server = server or "bank"
    suite = _suite(server)
    try:
        task = suite.task(task_id) if task_id else next(
            (t for t in suite.split("test") if tool is None or any(a.tool == tool for a in t.actions)), None)
    except EnvaceError as exc:
        _fail(exc)
    if task is None:
        _fail(ValueError(f"no test task of {server!r} calls {tool!r}; pass --task"))
    anyio.run(_policy_try, role, suite, task, tool, arguments, model, adapter)


async def _policy_try(role, suite, task, tool, arguments, model, adapter) -> None:  # noqa: ANN001
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from rich.columns import Columns
    from rich.panel import Panel

    from envace_mcp.eval import Episode
    from envace_mcp.policy import ActRequest, Example, RehearseRequest, ToolCall
    from envace_mcp.policy.prompts import tool_call_text
    from envace_mcp.policy.types import run_sampling
    from envace_mcp.toolbox import Toolbox

    policy = _load(model, adapter)

    sampling = run_sampling()
    config = {"mcpServers": {suite.name: suite.stdio_config()}}
    async with Toolbox(config) as toolbox:
        catalog = list(toolbox.catalog)
        console.print(Text.assemble(safe(task.id, "bold"), ": ", safe(task.instruction, "italic")))
        if role == "act":
            gen = await policy.act(ActRequest(task=task.instruction, tools=catalog, instructions=suite.server_module.POLICY),
                                   sampling["act"])
            calls = "\n".join(tool_call_text(c.name, c.arguments) for c in gen.parsed.tool_calls) or "(no tool call)"
            issues = ", ".join(i.code for i in gen.parsed.issues) or "none"
            reference = tool_call_text(task.actions[0].tool, task.actions[0].arguments)
            console.print(Columns([Panel(safe(f"{calls}\n\nanswer: {gen.parsed.final_answer}\nissues: {issues}", newlines=True),
                                         title=f"act turn of {policy.name}"),
                                   Panel(safe(reference, newlines=True), title="reference first call")]))
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
        with console.status(Text.assemble("rehearsing ", safe(name), " …")):
            gen = await policy.rehearse(RehearseRequest(call=call, tool=spec, allowed=catalog, history=history,
                                                        act_message=tool_call_text(name, call_args), examples=examples),
                                        sampling["rehearse"])
        real = await scope.call(name, call_args)
    console.print(Text.assemble("call: ", safe(tool_call_text(name, call_args), newlines=True)))
    console.print(Columns([_predicted(gen, policy), _observed(real, suite.name)]))
    _fidelity(gen, real)


def _load(model: str | None, adapter: str | None) -> Any:
    from envace_mcp.policy import load_policy
    from envace_mcp.policy.embedded import default_adapter

    try:
        folder = default_adapter(model, adapter)
    except EnvaceError as exc:
        _fail(exc)
    with loading(model, folder):
        try:
            return load_policy(model, adapter=folder)
        except EnvaceError as exc:
            _fail(exc)


def _predicted(gen: Any, policy: Any) -> Any:
    """The rehearsal's panel: its status, code and message, and the predicted result (or its raw text)."""
    from rich.panel import Panel

    p = gen.parsed
    shown = json.dumps(p.result, indent=2) if p.result is not None else (gen.text or "").strip()
    head = f"status: {p.status}" + (f" ({p.code})" if p.code else "") + (f"\n{p.message}" if p.message else "")
    folder = getattr(policy, "adapter_folder", None)
    by = f"rehearsed by {policy.name}" + (f" with adapter {Path(folder).name}" if folder else "")
    return Panel(safe(f"{head}\n\n{shown[:1500]}", newlines=True), title=safe(by))


def _observed(real: Any, source: str) -> Any:
    from rich.panel import Panel

    head = f"status: {'error (' + str(real.error_kind) + ')' if real.is_error else 'result'}"
    return Panel(safe(f"{head}\n\n{json.dumps(real.value, indent=2)[:1500]}", newlines=True),
                 title=safe(f"real result from {source}"))


def _fidelity(gen: Any, real: Any) -> None:
    from envace_mcp.policy.fidelity import compare

    match = compare(gen.parsed, real)
    console.print(f"fidelity: {match.score:.2f} ({match.matched}/{match.fields} fields, status match: {match.status_match})"
                  f"  tokens: {len(gen.prompt_ids or [])} prompt + {len(gen.completion_ids or [])} generated")


async def _try_own(servers: Path, name: str, arguments: dict[str, Any], model: str | None, adapter: str | None) -> None:
    """`--servers`: rehearse `name(arguments)` with no conversation, then run it for real where that is safe."""
    from rich.columns import Columns

    from envace_mcp.policy import RehearseRequest, ToolCall
    from envace_mcp.policy.prompts import tool_call_text
    from envace_mcp.policy.types import run_sampling
    from envace_mcp.toolbox import Toolbox

    try:
        async with Toolbox(servers) as toolbox:
            spec = toolbox.catalog.get(name)
            if spec is None:  # before any model loads
                _fail(ValueError(_unknown_tool(name, toolbox.catalog.names)))
            policy = _load(model, adapter)
            call = ToolCall(id="try", name=name, arguments=arguments)
            with console.status(Text.assemble("rehearsing ", safe(name), " (up to 400 tokens: minutes on a CPU for a tool "
                                              "it never saw) …")):
                gen = await policy.rehearse(RehearseRequest(call=call, tool=spec, allowed=list(toolbox.catalog),
                                                            act_message=tool_call_text(name, arguments)),
                                            run_sampling()["rehearse"])
            console.print(Text.assemble("call: ", inline_call(name, arguments), "  on ", safe(spec.server, "bold"),
                                        " (", _flags(spec), ")"))
            # `sandbox` read so: a config without the field (older envace) counts as no sandbox
            unasked = spec.annotations.read_only or getattr(toolbox.specs.get(spec.server), "sandbox", False)
            if not unasked:
                console.print(Columns([_predicted(gen, policy)]))
                why = await _not_confirmed(name, spec.server)
                if why is not None:
                    console.print(Text.assemble(("not run: ", "yellow"), safe(why)))
                    return
            real = await toolbox.call(name, arguments, expect=spec)
            console.print(Columns([_predicted(gen, policy), _observed(real, spec.server)] if unasked
                                  else [_observed(real, spec.server)]))
            _fidelity(gen, real)
    except EnvaceError as exc:
        _fail(exc)


async def _not_confirmed(name: str, server: str) -> str | None:
    """Why a call to a tool that writes, on a server not marked as a sandbox, is not run (None: the person
    at the terminal said to run it)."""
    from envace_mcp._text import visible

    where = f"{name} is not read-only and server {server!r} is not marked \"sandbox\": true"
    if not sys.stdin.isatty():
        return f"{where}, and there is no terminal to confirm on"
    question = visible(f"{where}. Run it for real?")

    def ask() -> bool:  # a `y` typed while the model loaded is not an answer to a question not yet shown
        discard_typed_ahead(sys.stdin)
        return typer.confirm(question, default=False)

    if await anyio.to_thread.run_sync(ask):
        return None
    return f"{where}, and you said no"


def _unknown_tool(name: str, names: list[str]) -> str:
    """One line: the tool is not offered, and the names closest to it (or, with none close, what is)."""
    import difflib

    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    if close:
        return f"unknown tool {name!r} on the configured servers; did you mean {', '.join(map(repr, close))}?"
    offered = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    return f"unknown tool {name!r} on the configured servers; they offer: {offered or 'no tools'}"

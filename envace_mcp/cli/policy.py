"""`envace policy try`."""

from __future__ import annotations

import json
from typing import Annotated, Literal, Optional

import anyio
import typer
from rich.text import Text

from envace_mcp._terminal import safe
from envace_mcp.cli._common import AdapterOpt, ModelOpt, _fail, _suite, console, policy_app
from envace_mcp.errors import EnvaceError


@policy_app.command("try")
def policy_try(
    role: Annotated[Literal["rehearse", "act"], typer.Option(help="which role to try")] = "rehearse",
    server: Annotated[str, typer.Option(help="a bundled server: bank or retail")] = "bank",
    tool: Annotated[Optional[str], typer.Option(help="the tool to rehearse (default: from the task)")] = None,
    args: Annotated[Optional[str], typer.Option(help="JSON arguments (default: the task's reference call)")] = None,
    task_id: Annotated[Optional[str], typer.Option("--task", help="task whose world and history to use")] = None,
    model: ModelOpt = None,
    adapter: AdapterOpt = None,
) -> None:
    """Show the model's rehearsed prediction beside the real result (or its act turn for a task).

    Sampled as every run is (greedy; 160 tokens for an act turn, 400 for a rehearsal)."""
    suite = _suite(server)
    try:
        arguments = json.loads(args) if args else None
    except json.JSONDecodeError as exc:
        _fail(ValueError(f"--args is not JSON: {exc}"))
    if arguments is not None and not isinstance(arguments, dict):
        _fail(ValueError(f"--args must be a JSON object, not {type(arguments).__name__}"))
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
    from envace_mcp.policy import (
        ActRequest,
        Example,
        RehearseRequest,
        ToolCall,
        load_policy,
    )
    from envace_mcp.policy.embedded import default_adapter
    from envace_mcp.policy.fidelity import compare
    from envace_mcp.policy.prompts import tool_call_text
    from envace_mcp.toolbox import Toolbox

    with console.status(f"loading {model or 'the embedded SmolLM2-135M-Instruct'} …"):
        try:
            policy = load_policy(model, adapter=default_adapter(model, adapter))
        except EnvaceError as exc:
            _fail(exc)
    from envace_mcp.policy.types import run_sampling

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
        gen = await policy.rehearse(RehearseRequest(call=call, tool=spec, allowed=catalog, history=history,
                                                    act_message=tool_call_text(name, call_args), examples=examples),
                                    sampling["rehearse"])
        real = await scope.call(name, call_args)
    p = gen.parsed
    shown = json.dumps(p.result, indent=2) if p.result is not None else gen.text
    head = f"status: {p.status}" + (f" ({p.code})" if p.code else "") + (f"\n{p.message}" if p.message else "")
    real_head = f"status: {'error (' + str(real.error_kind) + ')' if real.is_error else 'result'}"
    console.print(Text.assemble("call: ", safe(tool_call_text(name, call_args), newlines=True)))
    console.print(Columns([Panel(safe(f"{head}\n\n{shown[:1500]}", newlines=True), title=f"rehearsed by {policy.name}"),
                           Panel(safe(f"{real_head}\n\n{json.dumps(real.value, indent=2)[:1500]}", newlines=True),
                                 title=f"real result from {suite.name}")]))
    match = compare(p, real)
    console.print(f"fidelity: {match.score:.2f} ({match.matched}/{match.fields} fields, status match: {match.status_match})"
                  f"  tokens: {len(gen.prompt_ids or [])} prompt + {len(gen.completion_ids or [])} generated")

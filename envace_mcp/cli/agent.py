"""The agent: `envace demo` and `envace run`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import anyio
import typer

from envace_mcp.cli._common import (
    AdapterOpt,
    ServersOpt,
    _adapter,
    _bundled_config,
    _catalog_table,
    _fail,
    _gate,
    _sampling,
    _suite,
    app,
    console,
)
from envace_mcp.errors import EnvaceError


@app.command("demo")
def demo(
    domain: Annotated[str, typer.Option(help="bank or retail")] = "bank",
    task_id: Annotated[Optional[str], typer.Option("--task", help="a task id (default: a simple test task)")] = None,
    transport: Annotated[str, typer.Option(help="stdio or http")] = "stdio",
    model: Annotated[Optional[str], typer.Option(help="Hugging Face id or folder (default: embedded SmolLM2)")] = None,
    adapter: AdapterOpt = None,
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
                        policy = load_policy(model, adapter=_adapter(model, adapter))
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
    adapter: AdapterOpt = None,
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
            policy = load_policy(model, adapter=_adapter(model, adapter))
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

"""The agent: `envace demo` and `envace run`."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional

import anyio
import typer
from pydantic import Field
from rich.text import Text

from envace_mcp._terminal import inline_call, safe
from envace_mcp.cli._common import (
    AdapterOpt,
    GateOpt,
    LimitsOpt,
    ModelOpt,
    RehearseAdapterOpt,
    ServersOpt,
    TracesOut,
    YesOpt,
    _agent_gate,
    announce_trust,
    _bundled_config,
    _catalog_table,
    _config_layers,
    _fail,
    _limits,
    _sampling,
    _suite,
    app,
    console,
    loading,
)
from envace_mcp.config import Settings
from envace_mcp.errors import EnvaceError


DEMO_LIMITS = {"max_steps": 4}
"""`envace demo`'s run limits under `--limits`: a short run to watch."""


class RunConfig(Settings):
    """`envace run -c key=value`: research switches, off by default, under the names `envace eval -c` gives
    them. Neither ships on (docs/evidence.md): test-time rehearsal lowered bank validation scores, and
    constrained calls, better where a call is wanted, turn malformed calls into valid wrong ones and let
    more harmful writes run (bank test: 30 → 69)."""

    rehearse: int = Field(default=0, ge=0)
    """Test-time rehearsal: N imagined runs (simulated, in parallel) before the real one, condensed into
    notes it starts from (`graph.tts`)."""
    constrain_calls: bool = False
    """Decode the act role's tool calls under the tools' schemas (`policy.constrained`; transformers models
    only)."""


@app.command("demo")
def demo(
    domain: Annotated[str, typer.Option(help="bank or retail")] = "bank",
    task_id: Annotated[Optional[str], typer.Option("--task", help="a task id (default: a simple test task)")] = None,
    transport: Annotated[Literal["stdio", "http"], typer.Option(help="MCP transport to the server")] = "stdio",
    model: ModelOpt = None,
    adapter: AdapterOpt = None,
    reference: Annotated[bool, typer.Option("--reference", help="replay the reference solution instead of the agent")] = False,
    gate: GateOpt = None,
    limits: Annotated[Optional[str], typer.Option(help="run limits, e.g. max_steps=8 (the demo's default: 4 turns)")] = None,
    yes: YesOpt = False,
    traces: TracesOut = None,
) -> None:
    """The main job: the agent works a bundled server's test task over a real MCP transport.

    The embedded model (with its shipped adapter) by default. Every proposed call is shown with its
    rehearsal and the gate's decision; a destructive call waits for your approval (denied when stdin is
    no terminal; --yes approves); the run ends with a summary and the checker's score. `--reference`
    replays the reference solution instead."""
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
    run_limits = _limits(limits, DEMO_LIMITS)  # every check of the command line before the gate is announced
    gate_config, adapter_folder = _agent_gate(gate, model, adapter, announce=not reference)

    async def main(config: dict[str, Any]) -> None:
        async with Toolbox(config) as toolbox:
            console.print(_catalog_table(toolbox.catalog))
            console.print(Text.assemble("\n", (f"Task {task.id}", "bold"), f" ({task.kind}) over {transport}\n",
                                        safe(task.instruction, "italic"), "\n"))
            if reference:
                episode, verdict = await run_reference(toolbox, suite, task, server=domain)
                for i, result in enumerate(episode.results, 1):
                    colour = "red" if result.is_error else "green"
                    console.print(Text.assemble(f"  {i}. ", inline_call(result.tool, result.arguments),
                                                (f"  {result.latency_s * 1000:.1f} ms", "dim")))
                    console.print(Text.assemble("     ", safe("→ " + json.dumps(result.value)[:300], colour)))
                console.print(Text.assemble("\nanswer: ", safe(task.answer)))
            else:
                from envace_mcp._transcript import (
                    TerminalApprover,
                    Transcript,
                    print_summary,
                )
                from envace_mcp.policy import load_policy

                with loading(model, adapter_folder):
                    try:
                        policy = load_policy(model, adapter=adapter_folder)
                    except EnvaceError as exc:
                        _fail(exc)
                announce_trust(policy)
                from envace_mcp.traces import TraceStore

                approver = TerminalApprover(console, assume_yes=yes)
                run = await run_task(suite, task, policy=policy, toolbox=toolbox, gate=gate_config, limits=run_limits,
                                     on_update=Transcript(console, approver).update, sampling=_sampling(160),
                                     approve=approver,
                                     store=TraceStore(traces) if traces else None)
                verdict = run.verdict
                if traces:
                    console.print(f"[dim]recorded run {run.trace.run_id} in {traces}[/]")
                console.print(Text.assemble("\nfinal answer: ", _answer(run.state)))
                console.print(Text.assemble("reference answer: ", safe(task.answer)))
            for check in verdict.checks:
                console.print(Text.assemble("  ", ("✓", "green") if check.passed else ("✗", "red"), " ",
                                            safe(f"{check.name} {check.detail}")))
            if reference:
                console.print(f"[bold]checker score: {verdict.score:.2f}[/]")
            else:
                print_summary(console, run.state.get("rehearsals", []), verdict.score)

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
    model: ModelOpt = None,
    adapter: AdapterOpt = None,
    rehearse_adapter: RehearseAdapterOpt = None,
    mode: Annotated[Literal["real", "simulated", "mixed"], typer.Option(help="where tool results come from")] = "real",
    gate: GateOpt = None,
    limits: LimitsOpt = None,
    yes: YesOpt = False,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="tokens per turn of the agent (a rehearsal has its own 400)")] = 160,
    traces: TracesOut = None,
    config: Annotated[Optional[list[str]], typer.Option(
        "--config", "-c", help="research settings (repeatable), off by default: a JSON file of RunConfig fields, or "
                               "key=value pairs: rehearse=N (test-time rehearsal), constrain_calls=true (docs/cli.md)")] = None,
) -> None:
    """Run the EnvACE agent on a task of your own against your MCP servers.

    Each proposed call, its rehearsal, the gate's decision and the real result are shown, mismatches
    highlighted. Destructive calls wait for approval on the terminal (denied when stdin is no
    terminal; --yes approves); the run ends with a summary. A run that ends without an answer (its
    turns spent, or the same call stopped three times) says why and exits with code 1."""
    run_limits = _limits(limits)  # every check of the command line before the gate is announced
    from envace_mcp.config import build

    try:
        research = build(RunConfig, *_config_layers(config, RunConfig), where="envace run")
    except EnvaceError as exc:
        _fail(exc)
    if rehearse_adapter is not None:
        from envace_mcp.policy.trust import require_report

        try:
            require_report(rehearse_adapter)  # your agent reads a world model only as far as it was measured
        except EnvaceError as exc:
            _fail(exc)
    gate_config, adapter_folder = _agent_gate(gate, model, adapter, rehearse_adapter=rehearse_adapter)
    anyio.run(_run, task, servers or _bundled_config(), model, adapter_folder, mode, research.rehearse, gate_config,
              run_limits, _sampling(max_new_tokens), traces, yes, research.constrain_calls, rehearse_adapter)


async def _run(task, servers, model, adapter, mode, rehearse, gate_config, limits, sampling, traces, yes,  # noqa: ANN001
               constrain_calls, rehearse_adapter) -> None:
    with loading(model, adapter, rehearse_adapter):  # said first: these imports are part of the wait
        from langchain_core.messages import HumanMessage

        from envace_mcp._transcript import TerminalApprover, Transcript, print_summary
        from envace_mcp.graph import EnvaceContext, create_envace_graph
        from envace_mcp.graph.tts import condense, imagine
        from envace_mcp.policy import load_policy
        from envace_mcp.toolbox import Toolbox

        try:
            policy = load_policy(model, adapter=adapter, rehearse_adapter=rehearse_adapter, constrain_calls=constrain_calls)
        except EnvaceError as exc:
            _fail(exc)
    announce_trust(policy)
    try:
        async with Toolbox(servers) as toolbox:
            approver = TerminalApprover(console, assume_yes=yes)
            context = EnvaceContext(policy=policy, toolbox=toolbox, gate=gate_config, limits=limits, mode=mode,
                                    sampling=sampling, approve=approver)
            graph = create_envace_graph().compile()
            notes = None
            if rehearse > 0:
                console.print(f"[dim]rehearsing {rehearse} imagined run(s) …[/]")
                notes = condense(await imagine(create_envace_graph(), task, context, n=rehearse))
                console.print(safe(notes, newlines=True))
            from envace_mcp.traces import TraceStore, record_run

            payload: Any = {"messages": [HumanMessage(content=task)], **({"notes": notes} if notes else {})}
            final, trace = await record_run(graph, payload, context=context, store=TraceStore(traces) if traces else None,
                                            on_update=Transcript(console, approver).update,
                                            rehearsal={"n": rehearse, "strategy": "parallel"} if rehearse else {})
            if traces:
                console.print(f"[dim]recorded run {trace.run_id} in {traces}[/]")
    except EnvaceError as exc:
        _fail(exc)
    console.print(Text.assemble(("\nfinal answer: ", "bold"), _answer(final),
                                (f"  ({final.get('status')}, {final.get('real_calls', 0)} real call(s), "
                                 f"{final.get('rehearsal_count', 0)} rehearsal(s))", "dim")))
    print_summary(console, final.get("rehearsals", []))
    if final.get("final_answer") is None:  # a script or CI reading the exit code learns the task was not done
        raise typer.Exit(1)


def _answer(state: dict[str, Any]) -> Text:
    """The run's answer, or why there is none: the turns ran out, the same call kept being stopped (the
    graph's `stop_reason`), or the run ended some other way before the agent answered."""
    answer = state.get("final_answer")
    if answer is not None:
        return safe(str(answer))
    if state.get("status") == "max_steps":
        steps = state.get("steps", 0)
        return Text(f"none: the agent used its {steps} turn{'s' if steps != 1 else ''} without answering "
                    "(--limits max_steps=N)",
                    "yellow")
    if state.get("stop_reason"):  # it quotes the model's arguments and the gate's reason: shown, never obeyed
        return Text.assemble(("none — ", "yellow"), safe(str(state["stop_reason"]), "yellow"))
    return Text("none: the run ended before the agent answered", "yellow")

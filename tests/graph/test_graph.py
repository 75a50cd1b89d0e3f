"""The EnvACE graph with scripted policies against a real (in-process) bank server."""

import json
import os
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from envace_mcp.envs import Episode
from envace_mcp.graph import EnvaceContext, GateConfig, RunLimits, create_envace_graph
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox
from probe_server import build as build_probe

pytestmark = pytest.mark.anyio
SNAPSHOT = Path(__file__).parent / "snapshots" / "envace_graph.mmd"


def call(name, **arguments):
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def result(**fields):
    return f"<execution_result>{json.dumps(fields)}</execution_result>"


def ids(task):
    accounts = task.initial_state["accounts"]
    me = task.initial_state["customer_id"]
    return {a["type"]: a["id"] for a in accounts.values() if a["owner"] == me}


async def run(policy, toolbox, task, **context):
    graph = create_envace_graph().compile()
    return await graph.ainvoke({"messages": [HumanMessage(content=task.instruction)]},
                               context=EnvaceContext(policy=policy, toolbox=toolbox, **context))


def test_the_graph_topology_matches_its_snapshot():
    drawing = create_envace_graph().compile().get_graph().draw_mermaid()
    if os.environ.get("ENVACE_UPDATE_SNAPSHOTS") == "1":  # a deliberate change: rewrite, review the diff, commit
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(drawing)
    assert SNAPSHOT.exists(), (f"{SNAPSHOT} is missing: it is committed with the tests; to write it again, run "
                               "ENVACE_UPDATE_SNAPSHOTS=1 pytest tests/graph/test_graph.py -k snapshot and commit it")
    assert drawing == SNAPSHOT.read_text(), ("the graph's drawing changed; if on purpose, rewrite the snapshot with "
                                             "ENVACE_UPDATE_SNAPSHOTS=1 and commit it")


async def test_a_read_only_call_runs_unrehearsed_and_the_answer_ends_the_run(bank):
    suite, task = bank
    a = ids(task)
    policy = ScriptedPolicy(act=[call("get_balance", account_id=a["savings"]), "You have some money."])
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        out = await run(policy, toolbox.scoped(Episode(task, "bank").meta), task)
    policy.assert_complete()
    assert out["final_answer"] == "You have some money." and out["status"] == "finished"
    [record] = out["rehearsals"]
    assert record["prediction"] is None and record["decision"] == "execute" and not record["real"]["is_error"]
    assert out["real_calls"] == 1 and out.get("rehearsal_count", 0) == 0
    tool_reply = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert '"balance"' in tool_reply.content


async def test_a_destructive_call_predicted_to_fail_is_blocked_and_never_reaches_the_server(bank):
    suite, task = bank
    a = ids(task)
    trap = task.trap.arguments
    policy = ScriptedPolicy(
        act=[call("transfer", **trap), "I can't do that: savings must keep $500."],
        rehearse=['<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", '
                  '"message": "policy: savings would drop below the $500 minimum"}}</execution_result>'],
    )
    server = suite.build_server()
    episode = Episode(task, "bank")
    async with Toolbox({"bank": server}) as toolbox:
        out = await run(policy, toolbox.scoped(episode.meta), task)
        final = await episode.final_state(toolbox)
    policy.assert_complete()
    record = out["rehearsals"][0]
    assert record["decision"] == "block" and "below the $500 minimum" in record["reason"] and record.get("real") is None
    assert final["accounts"][a["savings"]]["balance"] == task.initial_state["accounts"][a["savings"]]["balance"]
    assert suite.check(task, final, out["final_answer"]).score == 1.0
    blocked = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert blocked.status == "error" and "Not executed (block)" in blocked.content
    # the act role's second turn saw the rehearsal in its memory
    memory = policy.calls[-1][1].memory
    assert "predicted error EXECUTION_ERROR" in memory and "gate: block" in memory


async def test_an_unsure_predicted_failure_lets_a_requested_write_reach_the_server(bank):
    """`min_failure_confidence`: the same rehearsed failure, once too unsure to block (the transfer runs on
    the real server), once sure enough (it does not)."""
    from envace_mcp.policy import Prediction

    from envace_mcp.traces import record_run

    suite, task = bank
    trap = task.trap.arguments
    moved, gates = [], []
    for confidence in (0.55, 0.95):
        unsure = Prediction(tool="transfer", arguments=trap, status="tool_error", code="EXECUTION_ERROR",
                            message="Insufficient funds", confidence=confidence)
        policy = ScriptedPolicy(act=[call("transfer", **trap), "Done."], rehearse=[unsure])
        episode = Episode(task, "bank")
        async with Toolbox({"bank": suite.build_server()}) as toolbox:
            context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta),
                                    gate=GateConfig(min_failure_confidence=0.9, require_approval="never"))
            out, trace = await record_run(create_envace_graph().compile(),
                                          {"messages": [HumanMessage(content=task.instruction)]}, context=context)
            final = await episode.final_state(toolbox)
        policy.assert_complete()
        assert out["rehearsals"][0]["prediction"]["confidence"] == confidence
        moved.append((out["rehearsals"][0]["decision"], final != task.initial_state))
        gates += [(s.decision, s.confidence, s.reason) for s in trace.steps if s.role == "gate"]
    assert moved == [("execute", True), ("block", False)]
    # the trace says how sure the rehearsal was, and the reason says why an objection did or did not count
    assert gates == [("execute", 0.55, "rehearsal predicts EXECUTION_ERROR at confidence 0.55, under min_failure_confidence 0.9"),
                     ("block", 0.95, "destructive call blocked: rehearsal predicts EXECUTION_ERROR (confidence 0.95): "
                                     "Insufficient funds")]


async def test_a_gate_that_fails_closed_keeps_a_write_with_an_unusable_rehearsal_off_the_server(bank):
    """`on_unusable="block"`: a rehearsal that broke the tool's output schema lets the
    transfer run by default, and blocks it when the gate fails closed; the trace says why."""
    from envace_mcp.policy import Prediction
    from envace_mcp.traces import record_run

    suite, task = bank
    trap = task.trap.arguments
    outcomes, reasons = [], []
    for closed in (False, True):
        garbled = Prediction(tool="transfer", arguments=trap, status="invalid", code="OUTPUT_SCHEMA_MISMATCH",
                             message="the reply lacks 'transfer_id'")
        policy = ScriptedPolicy(act=[call("transfer", **trap), "Done."], rehearse=[garbled])
        episode = Episode(task, "bank")
        async with Toolbox({"bank": suite.build_server()}) as toolbox:
            context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta),
                                    gate=GateConfig(on_unusable="block" if closed else "allow",
                                                    require_approval="never"))
            out, trace = await record_run(create_envace_graph().compile(),
                                          {"messages": [HumanMessage(content=task.instruction)]}, context=context)
            tried = await episode.final_state(toolbox) != task.initial_state
        policy.assert_complete()
        outcomes.append((out["rehearsals"][0]["decision"], tried))
        reasons += [s.reason for s in trace.steps if s.role == "gate"]
    assert outcomes == [("execute", True), ("block", False)]
    assert reasons == ["rehearsal unusable (OUTPUT_SCHEMA_MISMATCH), so it predicts nothing; run without a prediction "
                       "(on_unusable=block fails closed)",
                       "destructive call blocked: rehearsal unusable (OUTPUT_SCHEMA_MISMATCH), failing closed "
                       "(on_unusable=block; with on_unusable=allow approval decides)"]


async def test_a_retried_call_is_rehearsed_without_the_gates_refusal_so_the_world_model_cannot_copy_it(bank):
    from envace_mcp.policy.prompts import render_inline, render_rehearse

    suite, task = bank
    trap = task.trap.arguments
    error = ('<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", '
             '"message": "policy: savings would drop below the $500 minimum"}}</execution_result>')
    policy = ScriptedPolicy(act=[call("transfer", **trap), call("transfer", **trap), "I can't do that."],
                            rehearse=[error, error])
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        out = await run(policy, toolbox.scoped(Episode(task, "bank").meta), task)
    policy.assert_complete()
    assert [r["decision"] for r in out["rehearsals"]] == ["block", "block"]
    acts = [request for role, request in policy.calls if role == "act"]
    assert any("Not executed (block)" in str(m.content) for m in acts[1].messages)  # the agent is told
    retry = [request for role, request in policy.calls if role == "rehearse"][1]
    assert any("Not executed (block)" in str(m.content) for m in retry.history)   # it is in the history...
    simulator = "\n".join(m["content"] for m in render_rehearse(retry))
    chat = render_inline(retry)[0]
    inline = "\n".join(str(m.get("content")) for m in chat)
    for prompt in (simulator, inline):                                               # ...not in what rehearses
        assert "Not executed" not in prompt and task.instruction in prompt
    assert simulator.count("transfer(") + simulator.count('"transfer"') >= 1
    assert [m["role"] for m in chat if m["role"] in ("assistant", "tool")] == ["assistant", "tool"]  # only the retry:
    assert [c["id"] for c in chat[-2]["tool_calls"]] == [retry.call.id]                              # the refused call is gone


async def test_mismatches_between_rehearsal_and_reality_are_scored_and_shown_to_the_agent(bank):
    suite, task = bank
    a = ids(task)
    policy = ScriptedPolicy(
        act=[call("transfer", from_account_id=a["checking"], to_account_id=a["savings"], amount=10), "Done."],
        rehearse=[result(transfer_id="TXN-1", from_account_id=a["checking"], to_account_id=a["savings"], amount=10,
                         from_balance=1.0, to_balance=2.0)],
    )
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        out = await run(policy, toolbox.scoped(Episode(task, "bank").meta), task, gate=GateConfig(require_approval="never"))
    record = out["rehearsals"][0]
    assert record["decision"] == "execute" and 0 < record["match"] < 1
    assert {"from_balance", "to_balance", "transfer_id"} <= set(record["mismatches"])
    assert "MISMATCH" in policy.calls[-1][1].memory


def two_transfers(a, also=""):
    """A policy that proposes two transfers (10 and 20) in one turn, rehearsed as successes, then answers."""
    first = dict(from_account_id=a["checking"], to_account_id=a["savings"], amount=10)
    second = dict(from_account_id=a["checking"], to_account_id=a["savings"], amount=20)
    return ScriptedPolicy(
        act=[call("transfer", **first) + call("transfer", **second) + also, "Done."],
        rehearse=[result(transfer_id="T1", **first, from_balance=0, to_balance=0),
                  result(transfer_id="T2", **second, from_balance=0, to_balance=0)],
    )


async def test_approvals_for_two_parallel_calls_are_both_shown_and_resuming_runs_nothing_twice(bank):
    suite, task = bank
    a = ids(task)
    policy = two_transfers(a, also=call("echo", text="read"))
    probe = build_probe()
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server(), "probe": probe}) as toolbox:
        graph = create_envace_graph().compile(checkpointer=InMemorySaver())
        context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta),
                                gate=GateConfig(require_approval="destructive"))
        config = {"configurable": {"thread_id": "t1"}}
        paused = await graph.ainvoke({"messages": [HumanMessage(content=task.instruction)]}, config, context=context)
        interrupts = paused["__interrupt__"]
        assert len(interrupts) == 2
        shown = sorted(i.value["args"]["amount"] for i in interrupts)
        assert shown == [10, 20] and all(i.value["rehearsal"]["status"] == "result" for i in interrupts)
        answers = {i.id: i.value["args"]["amount"] == 10 for i in interrupts}
        out = await graph.ainvoke(Command(resume=answers), config, context=context)
        final = await episode.final_state(toolbox)
    policy.assert_complete()  # two rehearsals only: resuming did not rehearse again
    assert len(probe.calls) == 1  # the read ran once, before the pause
    start = task.initial_state["accounts"][a["checking"]]["balance"]
    assert round(start - final["accounts"][a["checking"]]["balance"], 2) == 10.0
    decisions = {r["arguments"].get("amount"): r.get("decision") for r in out["rehearsals"]}
    assert decisions == {10: "ask", 20: "rejected_by_human", None: "execute"}
    assert out["real_calls"] == 2 and out["final_answer"] == "Done."


async def test_an_approver_in_the_context_answers_asks_inside_the_run_without_a_checkpointer(bank):
    from envace_mcp.graph.memory import summarize

    suite, task = bank
    a = ids(task)
    policy = two_transfers(a)
    asked = []

    async def approve(request):
        asked.append(request)
        return request["args"]["amount"] == 10

    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        out = await run(policy, toolbox.scoped(episode.meta), task, approve=approve,
                        gate=GateConfig(require_approval="destructive"))
        final = await episode.final_state(toolbox)
    policy.assert_complete()
    assert sorted(r["args"]["amount"] for r in asked) == [10, 20]
    assert all(r["rehearsal"]["status"] == "result" and "approval required" in r["reason"] for r in asked)
    start = task.initial_state["accounts"][a["checking"]]["balance"]
    assert round(start - final["accounts"][a["checking"]]["balance"], 2) == 10.0
    assert summarize(out["rehearsals"]) == {
        "proposed": 2, "rehearsed": 2, "predicted_to_fail": 0, "stopped": {}, "approved": 1, "denied": 1,
        "executed": 1, "simulated": 0, "compared": 1, "matched": 0}


async def test_evaluation_counts_a_call_a_human_approved_as_one_that_ran(bank):
    """An approved `ask` keeps that decision on its tool step and it ran: `envace eval` counts it as a real,
    made and rehearsed-and-compared call, as the graph does; the denied one is none of these."""
    from envace_mcp.envs.rewards import made_calls
    from envace_mcp.eval.metrics import run_record
    from envace_mcp.traces import record_run

    suite, task = bank
    a = ids(task)
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        context = EnvaceContext(policy=two_transfers(a), toolbox=toolbox.scoped(episode.meta),
                                approve=lambda request: request["args"]["amount"] == 10,
                                gate=GateConfig(require_approval="destructive"))
        out, trace = await record_run(create_envace_graph().compile(),
                                      {"messages": [HumanMessage(content=task.instruction)]}, context=context)
    ran = {s.arguments["amount"]: (s.decision, s.ran) for s in trace.steps if s.role == "tool"}
    assert ran == {10: ("ask", True), 20: ("rejected_by_human", False)}
    record = run_record(trace, task, score=None)
    assert record["real_calls"] == out["real_calls"] == 1 and record["stopped_calls"] == 1
    assert [args["amount"] for _, args in made_calls(trace)] == [10]
    [compared] = record["fidelity"]
    assert compared["error_ok"] and compared["fields"]["echoed"] > 0


async def test_a_world_model_apart_from_the_agent_rehearses_and_the_gate_acts_on_its_prediction(bank):
    """`RolePolicies`: the agent proposes, a second policy rehearses; its predicted failure blocks the
    transfer below the savings minimum on the real server, and the trace names both."""
    from envace_mcp.policy import RolePolicies
    from envace_mcp.traces import record_run

    suite, task = bank
    trap = task.trap.arguments
    agent = ScriptedPolicy(act=[call("transfer", **trap), "I can't do that."])
    world = ScriptedPolicy(rehearse=['<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", '
                                     '"message": "savings would drop below the minimum"}}</execution_result>'])
    agent.name, world.name = "agent", "world"
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        context = EnvaceContext(policy=RolePolicies(agent, world), toolbox=toolbox.scoped(episode.meta),
                                gate=GateConfig(require_approval="never"))
        out, trace = await record_run(create_envace_graph().compile(),
                                      {"messages": [HumanMessage(content=task.instruction)]}, context=context)
        final = await episode.final_state(toolbox)
    agent.assert_complete()
    world.assert_complete()
    assert out["rehearsals"][0]["decision"] == "block" and final == task.initial_state
    assert trace.model == "agent + rehearse: world"


async def test_simulated_mode_needs_no_server(bank, bank_catalog):
    suite, task = bank
    a = ids(task)
    policy = ScriptedPolicy(act=[call("get_balance", account_id=a["savings"]), "It is 42."],
                            rehearse=[result(account_id=a["savings"], type="savings", balance=42.0, currency="USD")])
    out = await run(policy, None, task, tools=bank_catalog, mode="simulated")
    policy.assert_complete()
    reply = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert json.loads(reply.content)["balance"] == 42.0 and out.get("real_calls", 0) == 0
    assert out["rehearsals"][0]["decision"] == "simulate"


async def test_mixed_mode_reads_for_real_and_simulates_writes(bank):
    suite, task = bank
    a = ids(task)
    policy = ScriptedPolicy(
        act=[call("get_balance", account_id=a["checking"]) + call("transfer", from_account_id=a["checking"],
                                                                  to_account_id=a["savings"], amount=5), "ok"],
        rehearse=[result(transfer_id="T", from_account_id=a["checking"], to_account_id=a["savings"], amount=5,
                         from_balance=0, to_balance=0)],
    )
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        out = await run(policy, toolbox.scoped(episode.meta), task, mode="mixed")
        final = await episode.final_state(toolbox)
    decisions = {r["tool"]: r["decision"] for r in out["rehearsals"]}
    assert decisions == {"get_balance": "execute", "transfer": "simulate"} and out["real_calls"] == 1
    assert final["accounts"][a["checking"]]["balance"] == task.initial_state["accounts"][a["checking"]]["balance"]


async def test_step_budget_ends_a_run_that_never_answers(bank):
    suite, task = bank
    a = ids(task)
    policy = ScriptedPolicy(act=[call("get_balance", account_id=a["savings"])] * 3)
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        out = await run(policy, toolbox.scoped(Episode(task, "bank").meta), task, limits=RunLimits(max_steps=3))
    assert out["status"] == "max_steps" and out["final_answer"] is None and out["real_calls"] == 3


async def test_an_unreadable_tool_call_gets_a_format_reminder_and_another_turn(bank):
    suite, task = bank
    policy = ScriptedPolicy(act=["<tool_call>{get_balance: oops</tool_call>", "Fine, no tools."])
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        out = await run(policy, toolbox.scoped(Episode(task, "bank").meta), task)
    assert out["final_answer"] == "Fine, no tools."
    assert any(isinstance(m, HumanMessage) and "could not be read" in m.content for m in out["messages"])


async def test_the_runs_own_evidence_blocks_made_up_ids_and_a_refused_call_sent_again(bank):
    """The evidence rules `ungrounded_arguments` and `repeated_failures`: an account nobody wrote and a transfer
    the server already refused are blocked before the server, even though every rehearsal raised no
    objection; with the default gate all three calls reach it."""
    from envace_mcp.policy import Prediction
    from envace_mcp.traces import record_run

    suite, task = bank
    mine = ids(task)
    made_up = {"from_account_id": "CHK-0000", "to_account_id": mine["savings"], "amount": 5.0}
    too_much = {"from_account_id": mine["checking"], "to_account_id": mine["savings"], "amount": 10_000_000.0}
    assert mine["checking"] in task.instruction and "CHK-0000" not in task.instruction
    runs = []
    for on in (False, True):
        fine = [Prediction(tool="transfer", status="result", result={"ok": True}) for _ in range(3)]
        policy = ScriptedPolicy(act=[call("transfer", **made_up), call("transfer", **too_much),
                                     call("transfer", **too_much), "Done."], rehearse=fine)
        gate = GateConfig(evidence=["ungrounded_arguments", "repeated_failures"] if on else [], require_approval="never")
        async with Toolbox({"bank": suite.build_server()}) as toolbox:
            episode = Episode(task, "bank")
            context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta), gate=gate)
            out, trace = await record_run(create_envace_graph().compile(),
                                          {"messages": [HumanMessage(content=task.instruction)]}, context=context)
            assert await episode.final_state(toolbox) == task.initial_state  # nothing ran that changed anything
        policy.assert_complete()
        runs.append(([r["decision"] for r in out["rehearsals"]], [s.reason for s in trace.steps if s.role == "gate"],
                     out["real_calls"]))
    assert runs[0][0] == ["execute", "execute", "execute"] and runs[0][2] == 3
    decisions, reasons, real = runs[1]
    assert decisions == ["block", "execute", "block"] and real == 1
    assert reasons[0] == "destructive call blocked: from_account_id='CHK-0000' appears nowhere in the user's messages or in any tool's reply"
    assert reasons[2] == ("destructive call blocked: the server refused this exact call earlier in this run, "
                          "and no write has succeeded since")


async def test_a_write_that_already_ran_is_not_sent_again_until_the_user_asks_again(bank):
    """The evidence rule `repeated_writes`: the same transfer twice in one turn moves the money once (with the rule
    off, twice); a new user message in the same thread asks again, and the same call then runs."""
    from envace_mcp.policy import Prediction

    suite, task = bank
    a = ids(task)
    move = {"from_account_id": a["checking"], "to_account_id": a["savings"], "amount": 7.0}
    start = task.initial_state["accounts"][a["checking"]]["balance"]
    moved = {}
    for on in (False, True):
        fine = [Prediction(tool="transfer", status="result", result={"ok": True}) for _ in range(3)]
        policy = ScriptedPolicy(act=[call("transfer", **move), call("transfer", **move), "Done.",
                                     call("transfer", **move), "Sent again."], rehearse=fine)
        episode = Episode(task, "bank")
        async with Toolbox({"bank": suite.build_server()}) as toolbox:
            graph = create_envace_graph().compile(checkpointer=InMemorySaver())
            context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta),
                                    gate=GateConfig(evidence=["repeated_writes"] if on else [], require_approval="never"))
            config = {"configurable": {"thread_id": "t"}}
            first = await graph.ainvoke({"messages": [HumanMessage(content=task.instruction)]}, config, context=context)
            after_first = (await episode.final_state(toolbox))["accounts"][a["checking"]]["balance"]
            second = await graph.ainvoke({"messages": [HumanMessage(content="Send the same again, please.")]}, config,
                                         context=context)
            after_second = (await episode.final_state(toolbox))["accounts"][a["checking"]]["balance"]
        policy.assert_complete()
        moved[on] = (round(start - after_first, 2), round(after_first - after_second, 2),
                     [r["decision"] for r in first["rehearsals"]], second["final_answer"])
    assert moved[False][:3] == (14.0, 7.0, ["execute", "execute"])
    assert moved[True] == (7.0, 7.0, ["execute", "block"], "Sent again.")

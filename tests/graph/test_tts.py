"""Test-time rehearsal: imagined runs, critiques, memory, one committed real run."""

import json

import pytest

from envace_mcp.envs import Episode
from envace_mcp.graph import EnvaceContext, create_envace_graph
from envace_mcp.graph.tts import rehearse_then_act
from envace_mcp.testing import FunctionPolicy, ScriptedPolicy
from envace_mcp.toolbox import Toolbox

pytestmark = pytest.mark.anyio


def call(name, **arguments):
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def savings_trap(task):
    return call("transfer", **task.trap.arguments)


async def test_parallel_rehearsal_critiques_each_attempt_and_the_real_run_avoids_the_pitfall(bank):
    suite, task = bank
    predicted_failure = ('<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", '
                         '"message": "savings would drop below $500"}}</execution_result>')
    seen_memory = []

    def act(request):
        seen_memory.append(request.memory or "")
        if "pitfalls: moving money out of savings" in (request.memory or ""):
            return "I can't: savings must keep at least $500."
        return savings_trap(task) if not request.messages else "Tried; it failed."

    policy = FunctionPolicy(
        act=act,
        rehearse=lambda r: predicted_failure,
        critique=lambda r: "VERDICT: failure\nPITFALLS: moving money out of savings below $500\nADVICE: refuse",
    )
    server = suite.build_server()
    episode = Episode(task, "bank")
    async with Toolbox({"bank": server}) as toolbox:
        context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta),
                                instructions=suite.server_module.POLICY)
        final, attempts = await rehearse_then_act(create_envace_graph(), task.instruction, context, n=2)
        state = await episode.final_state(toolbox)
    assert len(attempts) == 2 and all(a.critique.success is False for a in attempts)
    assert all(a.state["rehearsals"][0]["decision"] == "simulate" for a in attempts)
    assert final.get("real_calls", 0) == 0 and "at least $500" in final["final_answer"]
    assert "Attempt 1 (failure)" in final["notes"] and "Attempt 2 (failure)" in final["notes"]
    assert suite.check(task, state, final["final_answer"]).score == 1.0
    roles = [role for role, _ in policy.calls]
    assert roles.count("critique") == 2


async def test_sequential_rehearsal_shows_each_attempt_the_earlier_ones(bank, bank_catalog):
    suite, task = bank
    policy = ScriptedPolicy(
        act=["First idea.", "Second idea.", "Final answer."],
        critique=["VERDICT: failure\nPITFALLS: too vague\nADVICE: be specific",
                  "VERDICT: success\nPITFALLS: none\nADVICE: keep it"],
    )
    context = EnvaceContext(policy=policy, tools=bank_catalog, mode="simulated")
    final, attempts = await rehearse_then_act(create_envace_graph(), task.instruction, context, n=2,
                                              strategy="sequential")
    policy.assert_complete()
    act_requests = [req for role, req in policy.calls if role == "act"]
    assert act_requests[0].memory is None
    assert "Attempt 1 (failure)" in act_requests[1].memory and "too vague" in act_requests[1].memory
    assert "Attempt 2 (success)" in act_requests[2].memory
    critiques = [req for role, req in policy.calls if role == "critique"]
    assert critiques[1].earlier == [attempts[0].critique.text]
    assert final["final_answer"] == "Final answer."


async def test_test_time_rehearsal_runs_with_the_real_embedded_model(bank):
    from envace_mcp.policy import SamplingParams, load_policy

    suite, task = bank
    short = SamplingParams(max_new_tokens=16, temperature=0)
    policy = load_policy(role_sampling={"act": short, "rehearse": short, "critique": short})
    from envace_mcp.graph import RunLimits

    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(Episode(task, "bank").meta),
                                limits=RunLimits(max_steps=2))
        final, attempts = await rehearse_then_act(create_envace_graph(), task.instruction, context, n=2)
    assert len(attempts) == 2 and all(a.critique.text is not None for a in attempts)
    assert final["notes"].startswith("Before acting you rehearsed this task 2 time(s)")
    assert final["status"] in {"finished", "max_steps"}


def test_memory_shows_paths_and_simulated_errors_never_simulated_values_or_imagined_answers():
    """An imagined balance quoted as fact was how test-time rehearsal hurt on bank validation."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from envace_mcp.graph.tts import Attempt, condense
    from envace_mcp.policy.prompts import NOT_EXECUTED
    from envace_mcp.policy.types import Critique

    def attempt(index, balance, critique):
        messages = [HumanMessage(content="What is my checking balance? Then move $900 from savings."),
                    AIMessage(content="", tool_calls=[{"name": "get_balance", "args": {"account_id": "CHK-3050"},
                                                       "id": "a"},
                                                      {"name": "transfer", "args": {"amount": 900}, "id": "b"}]),
                    ToolMessage(content=json.dumps({"balance": balance}), tool_call_id="a", status="success"),
                    ToolMessage(content="savings would drop below $500", tool_call_id="b", status="error"),
                    AIMessage(content="", tool_calls=[{"name": "place_order", "args": {"qty": 1}, "id": "c"}]),
                    ToolMessage(content="Not executed (reject): invalid arguments for 'place_order': field 'symbol'"
                                " is required. Rehearsed outcome: {\"id\": \"ORD-101\"}", tool_call_id="c",
                                status="error", additional_kwargs={NOT_EXECUTED: "reject"}),
                    AIMessage(content=f"Your balance is ${balance:,.2f}.")]
        return Attempt(index=index, state={"messages": messages, "final_answer": messages[-1].content},
                       critique=critique)

    silent = Critique(success=None, pitfalls="", advice="", text="<none>")
    notes = condense([attempt(1, 1550.0, silent),
                      attempt(2, 1550.0, Critique(success=False, pitfalls="", advice="refuse the transfer", text=""))])
    assert "1550" not in notes and "1,550" not in notes  # neither the simulated value nor the imagined answer
    assert "ORD-101" not in notes  # nor the rehearsed outcome a gate's refusal quotes
    assert "place_order({\"qty\": 1}) -> Not executed (reject): invalid arguments for 'place_order'" in notes
    assert 'get_balance({"account_id": "CHK-3050"}) -> simulated ok' in notes
    assert "transfer" in notes and "-> simulated error: savings would drop below $500" in notes
    assert "Attempt 2 (failure):\n  the same calls as attempt 1\n  advice: refuse the transfer" in notes
    assert "take every value from the real tools" in notes
    different = condense([attempt(1, 1550.0, silent), Attempt(index=2, state={"messages": []}, critique=silent)])
    assert "Attempt 2 (no verdict):\n  no tool calls" in different
    assert condense([]) == ""

"""Test doubles for every other test, and the LangChain chat-model backend."""

from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from envace_mcp.errors import UserError
from envace_mcp.policy import ActRequest, CritiqueRequest, Prediction, RehearseRequest, ToolCall
from envace_mcp.policy.chat_backend import ChatModelPolicy
from envace_mcp.testing import FunctionPolicy, ScriptedPolicy

pytestmark = pytest.mark.anyio
CALL = ToolCall(id="c1", name="get_balance", arguments={"account_id": "CHK-1"})


async def test_a_scripted_policy_answers_in_order_records_calls_and_checks_completeness():
    policy = ScriptedPolicy(
        act=['<tool_call>{"name": "get_balance", "arguments": {"account_id": "CHK-1"}}</tool_call>', "It is $3."],
        rehearse=['<execution_result>{"balance": 3}</execution_result>'],
    )
    first = await policy.act(ActRequest(task="balance?"))
    prediction = await policy.rehearse(RehearseRequest(call=first.parsed.tool_calls[0], tool=None))
    assert first.parsed.tool_calls[0].name == "get_balance" and prediction.parsed.result == {"balance": 3}
    with pytest.raises(AssertionError, match="unused"):
        policy.assert_complete()
    final = await policy.act(ActRequest(task="balance?"))
    assert final.parsed.final_answer == "It is $3."
    policy.assert_complete()
    assert [role for role, _ in policy.calls] == ["act", "rehearse", "act"]
    with pytest.raises(UserError, match="ran out of act turns"):
        await policy.act(ActRequest(task="again"))


async def test_a_function_policy_computes_turns_from_requests():
    policy = FunctionPolicy(
        rehearse=lambda r: Prediction(tool=r.call.name, arguments=r.call.arguments, status="result",
                                      result={"echo": r.call.arguments}),
        critique=lambda r: f"VERDICT: {'success' if 'ok' in r.task else 'failure'}\nADVICE: none",
    )
    prediction = await policy.rehearse(RehearseRequest(call=CALL, tool=None))
    assert prediction.parsed.result == {"echo": {"account_id": "CHK-1"}}
    assert (await policy.critique(CritiqueRequest(task="ok task"))).parsed.success is True
    with pytest.raises(UserError, match="no function for the act role"):
        await policy.act(ActRequest(task="x"))


class ToolCallingFake(GenericFakeChatModel):
    """A real BaseChatModel whose replies are scripted and which records what it was bound with."""

    bound: list[Any] = []

    def bind_tools(self, tools, **kwargs):
        self.bound.append(tools)
        return self


async def test_a_chat_model_with_native_tool_calling_drives_the_act_role(bank_catalog):
    reply = AIMessage(content="", tool_calls=[{"name": "get_balance", "args": {"account_id": "CHK-1"}, "id": "t1"}])
    model = ToolCallingFake(messages=iter([reply]))
    policy = ChatModelPolicy(model)
    gen = await policy.act(ActRequest(task="balance?", tools=bank_catalog))
    assert gen.parsed.tool_calls == [ToolCall(id="t1", name="get_balance", arguments={"account_id": "CHK-1"})]
    assert model.bound[-1][0]["function"]["name"] == bank_catalog[0].name
    assert gen.prompt_ids is None and gen.logprobs is None


async def test_a_chat_model_without_tool_support_uses_the_text_protocol(bank_catalog):
    model = GenericFakeChatModel(messages=iter([
        AIMessage(content='<tool_call>{"name": "get_quote", "arguments": {"symbol": "ACME"}}</tool_call>'),
        AIMessage(content='<execution_result>{"symbol": "ACME", "price": 10.5, "market_open": true}</execution_result>'),
    ]))
    policy = ChatModelPolicy(model)
    act = await policy.act(ActRequest(task="quote ACME", tools=bank_catalog, messages=[HumanMessage(content="hi")]))
    assert act.parsed.tool_calls[0].arguments == {"symbol": "ACME"}
    quote = next(t for t in bank_catalog if t.name == "get_quote")
    call = act.parsed.tool_calls[0]
    rehearsal = await policy.rehearse(RehearseRequest(call=call, tool=quote, allowed=bank_catalog))
    assert rehearsal.parsed.status == "result" and rehearsal.parsed.result["price"] == 10.5

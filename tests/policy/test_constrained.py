"""Tool calls decoded under the tools' schemas: the scanner on the bank server's real schemas, the engine
honouring its masks on a tiny random Qwen3, and the setting's path from `envace eval` to the policy."""

import json

import pytest

from envace_mcp.engine.types import Job
from envace_mcp.errors import UserError
from envace_mcp.eval.evaluate import EvalConfig
from envace_mcp.policy import ActRequest, RehearseRequest, SamplingParams, ToolCall, load_policy
from envace_mcp.policy.constrained import CallConstraint, TokenText
from envace_mcp.policy.json_prefix import Violation
from envace_mcp.policy.prompts import render_act

pytestmark = pytest.mark.anyio
CALL = '<tool_call>\n{"name": "place_order", "arguments": {'
GOOD = CALL + '"account_id": "BRK-1", "symbol": "ACME", "side": "sell", "quantity": 3, "limit_price": null}}\n</tool_call>'


@pytest.fixture(scope="module")
def policy(tiny_qwen3_dir):
    return load_policy(str(tiny_qwen3_dir), batch_window_s=0.05)


@pytest.fixture(scope="module")
def tools(bank_catalog):
    return render_act(ActRequest(task="t", tools=bank_catalog))[1]


def _check(tools, token_text, text):
    constraint = CallConstraint(tools, token_text)
    constraint.scanner.feed(constraint.state, text)
    return constraint.state


@pytest.mark.parametrize("text, why", [
    ('<tool_call>\n{"name": "place_orders"', "starts none of"),
    (CALL + '"account_id": "BRK-1", "to_account_id"', "'t' starts none of"),  # the transfer's argument
    (CALL + '"account_id": "BRK-1", "symbol": "ACME"}}', "required argument(s) missing: side, quantity"),
    (CALL + '"side": "hold"', "starts none of ['buy', 'sell']"),
    (CALL + '"quantity": "3"', "cannot start with '\"'"),
    (CALL + '"quantity": 3.5', "is not an integer"),
    (CALL + '"quantity": 3x', "is not a number"),
    (CALL + '"side": "buy", "side"', "starts none of"),  # a key twice
    (CALL + '"limit_price": nope', "is not true, false or null"),
    (CALL + '"quantity": -', "'-' is below the minimum 1"),  # ge=1: no sign at all
    (CALL + '"quantity": 0,', "'0' is below the minimum 1"),  # read whole when the number ends
    (CALL + '"limit_price": 0}', "below the exclusive minimum 0"),  # gt=0 inside anyOf [number, null]
    ('<tool_call>\n{"name": "transfer", "arguments": {"amount": -287.17', "below the minimum 0"),  # gt=0
    ('<tool_call>\n{"name": "get_statement", "arguments": {"limit": 51 ', "above the maximum 50"),
    ("<tool_call>\n[", "a call is a JSON object"),
    (GOOD + ' then <tool_call>{"name": "transfer", "arguments": {"memo": "x"}}', "required argument(s) missing"),
])
def test_the_scanner_refuses_what_the_schema_refuses(tools, policy, text, why):
    with pytest.raises(Violation) as caught:
        _check(tools, TokenText(policy.tokenizer), text)
    assert why in str(caught.value)


def test_the_scanner_passes_valid_calls_and_free_text(tools, policy):
    token_text = TokenText(policy.tokenizer)
    assert _check(tools, token_text, "The balance is $12.50 {not a call}.").mode == "text"
    assert _check(tools, token_text, GOOD + "\nDone.").mode == "text"
    state = _check(tools, token_text, CALL + '"account_id": "BRK-1", "quantity": 1')  # mid-call: keys so far
    assert state.mode == "json" and state.stack[-1].keys == ["account_id", "quantity"]
    # every declared key written: a ',' has nothing left to introduce
    full = CALL + '"account_id": "A", "symbol": "B", "side": "buy", "quantity": 1, "order_type": "limit", "limit_price": 2.5'
    with pytest.raises(Violation, match="every argument"):
        _check(tools, token_text, full + ",")
    assert _check(tools, token_text, full + "}}\n</tool_call>").mode == "text"
    # inside the bounds: a fraction above an exclusive 0, the maximum itself, and digits still being read
    for ok in ('"limit_price": 0.5, ', '"quantity": 1, '):
        _check(tools, token_text, CALL + ok)
    _check(tools, token_text, '<tool_call>\n{"name": "get_statement", "arguments": {"limit": 50, ')
    _check(tools, token_text, CALL + '"limit_price": 0')  # may still become 0.01


def test_token_text_reassembles_decoded_text(policy):
    token_text = TokenText(policy.tokenizer)
    text = 'Hello <tool_call>\n{"name": "get_balance", "arguments": {"account_id": "CHK-1"}}'
    ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert "".join(token_text(i) for i in ids) == policy.tokenizer.decode(ids)


def test_the_engine_decodes_only_tokens_the_constraint_allows(policy, tools):
    """A random model inside a call's arguments: unconstrained it writes what no schema accepts; under
    the constraint every key it writes is one place_order declares, and the logprobs are the masked
    distribution's (finite, and at least the unmasked ones)."""
    token_text = TokenText(policy.tokenizer)
    prompt = policy.encode("Buy 3 ACME for BRK-1.\n" + CALL)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=40)
    plain, = policy.engine.generate([Job(prompt, sampling, 0)])
    with pytest.raises(Violation):
        _check(tools, token_text, CALL + plain.text)
    constraint = CallConstraint(tools, token_text, prefix=CALL)
    constrained, = policy.engine.generate([Job(prompt, sampling, 0, restrict=constraint.restrict)])
    state = _check(tools, token_text, CALL + constrained.text)  # raises if any token broke the schema
    written = state.stack[-1].keys if state.mode == "json" and len(state.stack) > 1 else []
    declared = tools[[t["function"]["name"] for t in tools].index("place_order")]["function"]["parameters"]["properties"]
    assert set(written) <= set(declared) and len(written) == len(set(written))
    assert constraint.stats["masked"] > 0
    assert all(lp <= 0 and lp > float("-inf") for lp in constrained.logprobs)
    unmasked = policy.score(prompt, constrained.completion_ids, temperature=1.0)
    assert all(c >= u - 1e-4 for c, u in zip(constrained.logprobs, unmasked))


async def test_the_policy_constrains_the_act_role_only(tiny_qwen3_dir, bank_catalog):
    policy = load_policy(str(tiny_qwen3_dir), constrain_calls=True)
    jobs = []
    submit = policy.engine.submit

    async def spy(job):
        jobs.append(job)
        return await submit(job)

    policy.engine.submit = spy
    short = SamplingParams(max_new_tokens=8, seed=1)
    await policy.act(ActRequest(task="What is my balance?", tools=bank_catalog), short)
    call = ToolCall(id="c", name="get_balance", arguments={"account_id": "CHK-1"})
    await policy.rehearse(RehearseRequest(call=call, tool=bank_catalog[1], allowed=bank_catalog), short)
    assert jobs[0].restrict is not None and jobs[1].restrict is None


def test_eval_settings_carry_the_switch():
    base = EvalConfig(suite="bank")
    on = base.overridden("constrain_calls=true")
    assert on.constrain_calls and not base.constrain_calls and on.label().endswith("constrained")
    assert "constrained" not in base.label()
    with pytest.raises(UserError, match="constrain_calls must be a valid boolean"):
        base.overridden("constrain_calls=maybe")
    with pytest.raises(UserError, match="transformers backend"):
        load_policy("vllm:http://127.0.0.1:9/v1", constrain_calls=True)
    assert json.dumps(on.model_dump(mode="json"))  # results.json stores the settings as JSON

"""Parsers for every role: formats, repairs, and a fuzz of thousands of malformed outputs."""

import json
import random

import pytest

from envace_mcp.policy import ActOutput, Prediction, ToolCall, parse_act, parse_critique, parse_prediction
from envace_mcp.policy.parsing import loads_lenient
from envace_mcp.policy.types import REHEARSAL_ERROR_CODES
from envace_mcp.toolbox import ToolAnnotations, ToolSpec

CALL = ToolCall(id="c1", name="get_balance", arguments={"account_id": "CHK-1"})
BALANCE = ToolSpec.create(remote_name="get_balance", server="bank", description="", annotations=ToolAnnotations(),
                          input_schema={"type": "object", "properties": {"account_id": {"type": "string"}}},
                          output_schema={"type": "object", "properties": {"balance": {"type": "number"}},
                                         "required": ["balance"]})


def test_several_calls_with_trailing_text_and_thinking():
    out = parse_act('<think>check first</think>Let me look.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n'
                    '</tool_call>\n<tool_call>{"name": "b", "arguments": {}}</tool_call> then done')
    assert [c.name for c in out.tool_calls] == ["a", "b"] and out.tool_calls[0].arguments == {"x": 1}
    assert out.thinking == "check first" and out.content == "Let me look.\n\n then done" and out.final_answer is None


@pytest.mark.parametrize(
    ("text", "arguments", "code"),
    [
        ('<tool_call>{"name": "a", "arguments": {"x": 1,}}</tool_call>', {"x": 1}, "repaired_json"),
        ('<tool_call>{"name": "a", "arguments": {"x": True, "y": None}}</tool_call>', {"x": True, "y": None}, "repaired_json"),
        ("<tool_call>{'name': 'a', 'arguments': {'x': 'v'}}</tool_call>", {"x": "v"}, "repaired_json"),
        ('<tool_call>{"name": "a", "arguments": {"x": 1}', {"x": 1}, "unterminated_tool_call"),
        ('<tool_call>{"name": "a", "arguments": {"x": 1}}} junk</tool_call>', {"x": 1}, "repaired_json"),
        ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 2}"}</tool_call>', {"x": 2}, None),
        ('```json\n{"name": "a", "arguments": {"x": 3}}\n```', {"x": 3}, "untagged_tool_call"),
    ],
)
def test_minor_json_damage_is_repaired_and_reported(text, arguments, code):
    out = parse_act(text)
    assert len(out.tool_calls) == 1 and out.tool_calls[0].arguments == arguments
    if code:
        assert code in {i.code for i in out.issues}


def test_unrecoverable_calls_are_reported_not_raised():
    out = parse_act("<tool_call>not json at all</tool_call>")
    assert out.tool_calls == [] and out.malformed
    assert parse_act('<tool_call>{"arguments": {}}</tool_call>').malformed
    assert parse_act("").issues[0].code == "empty_output"


def test_a_plain_reply_is_the_final_answer():
    out = parse_act("Your balance is $12.50.")
    assert out.final_answer == "Your balance is $12.50." and not out.issues


@pytest.mark.parametrize(
    ("text", "status", "code"),
    [
        ('<execution_result>{"balance": 3.5}</execution_result>', "result", None),
        ('<execution_result>{"error_tool_call": {"code": "INVALID_PARAMETERS", "details": "x"}}</execution_result>',
         "tool_error", "INVALID_PARAMETERS"),
        ('<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", "message": "Insufficient funds"}}'
         "</execution_result>", "tool_error", "EXECUTION_ERROR"),
        ("", "invalid", "EMPTY_OUTPUT"),
        ('{"balance": 1}', "invalid", "MISSING_TAG"),
        ('<execution_result>{"balance": 1}', "invalid", "MALFORMED_TAG"),
        ("<execution_result></execution_result>", "invalid", "EMPTY_OUTPUT"),
        ("<execution_result>balance is one</execution_result>", "invalid", "INVALID_JSON"),
        ("<execution_result>42</execution_result>", "invalid", "WRONG_TYPE"),
        ("<execution_result>{}</execution_result>", "invalid", "WRONG_TYPE"),
        ("<execution_result>null</execution_result>", "invalid", "WRONG_TYPE"),
        ('<execution_result>{"balance": "lots"}</execution_result>', "invalid", "OUTPUT_SCHEMA_MISMATCH"),
    ],
)
def test_rehearsals_become_typed_predictions(text, status, code):
    prediction = parse_prediction(text, CALL, BALANCE)
    assert prediction.status == status and prediction.code == code
    assert prediction.tool == "get_balance" and prediction.arguments == {"account_id": "CHK-1"}


def test_a_schema_mismatch_keeps_what_was_predicted():
    prediction = parse_prediction('<execution_result>{"balance": "lots"}</execution_result>', CALL, BALANCE)
    assert prediction.result == {"balance": "lots"} and "balance" in prediction.message


def test_critiques_are_split_into_verdict_pitfalls_and_advice():
    c = parse_critique("VERDICT: failure\nPITFALLS: moved money from savings\nADVICE: check the $500 minimum")
    assert c.success is False and "savings" in c.pitfalls and "$500" in c.advice
    assert parse_critique("looks fine").success is None


def _mutate(rng: random.Random, text: str) -> str:
    ops = rng.randrange(1, 4)
    for _ in range(ops):
        kind = rng.randrange(6)
        pos = rng.randrange(len(text) + 1)
        if kind == 0:
            text = text[:pos]
        elif kind == 1:
            text = text[:pos] + rng.choice(['"', "{", "}", "[", "]", ",", ":", "\\", "<", ">", "\x00", "\ud800", "é"]) + text[pos:]
        elif kind == 2 and text:
            end = min(len(text), pos + rng.randrange(1, 8))
            text = text[:pos] + text[end:]
        elif kind == 3:
            text = text[:pos] + rng.choice(["<tool_call>", "</tool_call>", "<think>", "</think>", "<execution_result>",
                                            "</execution_result>", "```", "True", "None", "'"]) + text[pos:]
        elif kind == 4:
            text = text[pos:] + text[:pos]
        else:
            text = text + "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(1, 10)))
    return text


def test_fuzzing_the_parsers_never_raises_and_always_types_the_failure():
    rng = random.Random(1234)
    act_seeds = ['<tool_call>\n{"name": "transfer", "arguments": {"from_account_id": "A", "amount": 5.5}}\n</tool_call>',
                 'Sure.<tool_call>{"name": "a", "arguments": {"l": [1, {"b": null}]}}</tool_call><tool_call>'
                 '{"name": "b", "arguments": {}}</tool_call>', "<think>hmm</think>Done: $5.00 moved."]
    rehearse_seeds = ['<execution_result>{"balance": 12.5, "rows": [{"id": "T1"}]}</execution_result>',
                      '<execution_result>{"error_tool_call": {"code": "INVALID_PARAMETERS", "details": "amount"}}'
                      "</execution_result>"]
    act_codes = {"repaired_json", "unterminated_tool_call", "invalid_tool_call", "invalid_arguments_json",
                 "untagged_tool_call", "unterminated_thinking", "empty_output"}
    for i in range(6000):
        text = _mutate(rng, rng.choice(act_seeds))
        out = parse_act(text)
        assert isinstance(out, ActOutput)
        assert {issue.code for issue in out.issues} <= act_codes
        assert all(isinstance(c.name, str) and c.name for c in out.tool_calls)
        json.dumps([c.arguments for c in out.tool_calls])
    for i in range(6000):
        prediction = parse_prediction(_mutate(rng, rng.choice(rehearse_seeds)), CALL, BALANCE)
        assert isinstance(prediction, Prediction)
        if prediction.status == "invalid":
            assert prediction.code in REHEARSAL_ERROR_CODES
        elif prediction.status == "tool_error":
            assert prediction.code
        else:
            assert isinstance(prediction.result, (dict, list)) and prediction.result


def test_lenient_json_rejects_what_it_cannot_repair():
    with pytest.raises(ValueError):
        loads_lenient("no json here")
    assert loads_lenient('{"a": [1, 2') == ({"a": [1, 2]}, True)


def test_prompt_schemas_drop_titles_but_keep_properties_named_title():
    from envace_mcp.policy.prompts import compact_schema

    schema = {"title": "Args", "type": "object", "properties": {"title": {"title": "Title", "type": "string"},
                                                                "n": {"title": "N", "type": "integer", "minimum": 1}},
              "$defs": {"Line": {"title": "Line", "type": "object"}}}
    assert compact_schema(schema) == {"type": "object", "properties": {"title": {"type": "string"},
                                                                        "n": {"type": "integer", "minimum": 1}},
                                      "$defs": {"Line": {"type": "object"}}}


@pytest.mark.parametrize("payload,value", [('"Transfer successful"', "Transfer successful"), ("2.0", 2.0), ("[]", [])])
def test_tools_without_an_output_schema_may_be_predicted_to_return_any_json(payload, value):
    untyped = ToolSpec.create(remote_name="calculate", server="s", description="", input_schema=None,
                              output_schema=None, annotations=ToolAnnotations())
    prediction = parse_prediction(f"<execution_result>{payload}</execution_result>", CALL, untyped)
    assert prediction.status == "result" and prediction.result == value

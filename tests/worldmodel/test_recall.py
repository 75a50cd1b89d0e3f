"""A world model recalls the user's logged calls: the ones most like the call it predicts, never from the
call's own run, read from its folder as untrusted input."""

import json

import pytest

from envace_mcp.policy.prompts import LOGGED_HEADER, render_inline, render_rehearse
from envace_mcp.policy.recall import MAX_BYTES, RECALL_FILE, REPLY_CHARS, CallLog, Logged
from envace_mcp.policy.types import Example, RehearseRequest, ToolCall
from envace_mcp.toolbox import ToolSpec

RESERVE = ToolSpec.from_dict({"name": "reserve", "description": "Reserve units of an item.", "server": "inventory",
                              "input_schema": {"type": "object", "properties": {"sku": {"type": "string"},
                                                                                "quantity": {"type": "integer"}}}})


def _log() -> CallLog:
    return CallLog([
        Logged("reserve", {"sku": "KIT-10", "quantity": 1}, "Error executing tool reserve: No item with SKU 'KIT-10'",
               True, "inventory", "run-a"),
        Logged("reserve", {"sku": "KIT-101", "quantity": 2}, '{"id": "RSV-1"}', False, "inventory", "run-b"),
        Logged("reserve", {"sku": "KIT-101", "quantity": 1}, '{"id": "RSV-2"}', False, "inventory", "run-c"),
        Logged("reserve", {"sku": "KIT-101", "quantity": 1}, '{"id": "RSV-2"}', False, "inventory", "run-d"),
        Logged("reserve", {"sku": "KIT-101", "quantity": 1}, '{"id": "RSV-9"}', False, "elsewhere", "run-e"),
        Logged("get_item", {"sku": "KIT-101"}, '{"sku": "KIT-101"}', False, "inventory", "run-c"),
    ])


def test_the_most_alike_calls_of_the_same_tool_and_server_come_first_never_the_calls_own_run():
    log = _log()
    call = ToolCall(id="c", name="reserve", arguments={"sku": "KIT-101", "quantity": 1})
    nearest = log.nearest(call, "inventory", k=3)
    # same sku and quantity first (the later of two identical calls once), then same sku, then the rest
    assert [e.episode for e in nearest] == ["run-d", "run-b", "run-a"]
    assert [e.episode for e in log.nearest(call, "inventory", k=3, exclude="run-d")] == ["run-c", "run-b", "run-a"]
    assert log.nearest(call, "elsewhere", k=1)[0].reply == '{"id": "RSV-9"}'  # another server's calls are its own
    assert log.nearest(ToolCall(id="c", name="ship", arguments={}), "inventory") == []
    examples = log.similar(call, RESERVE, k=1)
    assert examples == [Example("reserve", {"sku": "KIT-101", "quantity": 1}, '{"id": "RSV-2"}')]


def test_the_rehearse_prompt_shows_the_recalled_calls_just_before_the_call_in_either_format():
    call = ToolCall(id="c", name="reserve", arguments={"sku": "KIT-10", "quantity": 1})
    plain = RehearseRequest(call=call, tool=RESERVE, allowed=[RESERVE])
    recalled = RehearseRequest(call=call, tool=RESERVE, allowed=[RESERVE], similar=_log().similar(call, RESERVE, k=2))
    chat, _ = render_inline(recalled)
    assert chat[:-2] == render_inline(plain)[0][:-2] + [chat[-3]]  # one message more, just before the call's turn
    assert chat[-3]["role"] == "user" and chat[-3]["content"].startswith(LOGGED_HEADER.format(tool="reserve"))
    assert "No item with SKU 'KIT-10'" in chat[-3]["content"] and chat[-3]["content"].count("<tool_response>") == 2
    text = render_rehearse(recalled)[1]["content"]
    assert "## Logged calls of reserve" in text and "No item with SKU 'KIT-10'" in text
    assert "## Logged calls" not in render_rehearse(plain)[1]["content"]


def test_a_recall_file_is_read_as_untrusted_input(tmp_path):
    _log().write(tmp_path)
    path = tmp_path / RECALL_FILE
    lines = path.read_text().splitlines()
    deep = '{"tool": "reserve", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + '}, "reply": "x", "failed": false}'
    torn = lines[0][: len(lines[0]) // 2]
    wrong = json.dumps({"tool": "reserve", "arguments": [], "reply": "x", "failed": False})
    huge = json.dumps({"tool": "reserve", "arguments": {}, "reply": "y" * 50_000, "failed": False})
    path.write_text("\n".join([*lines, deep, torn, wrong, "", huge]) + "\n")
    log = CallLog.read(tmp_path)
    assert log is not None and len(log) == len(lines) + 1 and log.skipped == 3
    assert max(len(e.reply) for e in log.entries()) == REPLY_CHARS  # a reply is clipped, never a prompt's worth
    path.write_bytes(b" " * (MAX_BYTES + 1))
    assert CallLog.read(tmp_path) is None and CallLog.read(tmp_path / "none") is None and CallLog.read(None) is None


@pytest.mark.anyio
async def test_a_policy_rehearses_with_what_it_recalls_unless_the_request_brings_its_own(tiny_qwen3_dir):
    from envace_mcp.policy import load_policy
    from envace_mcp.policy.types import SamplingParams

    policy = load_policy(str(tiny_qwen3_dir), tool_format="compact", rehearse_format="inline")
    call = ToolCall(id="c", name="reserve", arguments={"sku": "KIT-10", "quantity": 1})
    request = RehearseRequest(call=call, tool=RESERVE, allowed=[RESERVE])
    short = SamplingParams(max_new_tokens=4, temperature=0.0)
    header = LOGGED_HEADER.format(tool="reserve")
    assert header not in (await policy.rehearse(request, short)).prompt_text
    policy.recall = _log()
    recalled = (await policy.rehearse(request, short)).prompt_text
    assert header in recalled and "No item with SKU 'KIT-10'" in recalled
    prompt_ids, _ = policy.rehearse_prompt(request)  # what a fit trains on is what a rehearsal sees
    assert prompt_ids == policy.encode(recalled)
    own = [Example("reserve", {"sku": "X"}, "their own")]
    assert "their own" in (await policy.rehearse(RehearseRequest(call=call, tool=RESERVE, similar=own), short)).prompt_text

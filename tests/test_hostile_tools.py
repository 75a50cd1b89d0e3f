"""Hostile tools and hostile inputs: fuzzed arguments, 10 MB outputs, bytes that are not UTF-8, odd
tool names, prompt injection. Each run ends cleanly, nothing invalid reaches a server, nothing is lost."""

from __future__ import annotations

import json
import random
import sys

import anyio
import jsonschema
import pytest
from helpers import PROBE
from langchain_core.messages import HumanMessage, ToolMessage
from probe_server import build

from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.policy.prompts import TOOL_OUTPUT_CHARS, render_act, tool_call_text
from envace_mcp.testing import FunctionPolicy
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import TraceStore, record_run
from envace_mcp.traces.schema import RESULT_CHARS

pytestmark = pytest.mark.anyio


def _junk(rng: random.Random, depth: int = 0):
    kind = rng.randrange(10 if depth < 2 else 7)
    if kind == 7:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(3))]
    if kind >= 8:
        return {rng.choice(["sku", "qty", "lines", "customer", "text", "count", "z"]): _junk(rng, depth + 1)
                for _ in range(rng.randrange(4))}
    return [None, True, rng.randint(-10, 10), rng.random() * 1e6, "", "x" * rng.randrange(0, 5), {}][kind]


def _arguments(rng: random.Random):
    """Argument sets near and far from the schemas: valid ones, wrong types, missing, extra, nested junk."""
    roll = rng.random()
    if roll < 0.05:
        return rng.choice([None, [], "text", 3])  # not even an object
    if roll < 0.5:
        return {"text": _junk(rng), "count": rng.choice([1, 3, 5, 0, 6, "2", 2.5, None])} | (
            {"extra": 1} if rng.random() < 0.2 else {})
    return {"basket": {"customer": rng.choice(["c1", 7, None]),
                       "lines": [{"sku": rng.choice(["A", "", 5]), "qty": rng.choice([1, 2, 0, -1, "1"])}
                                 for _ in range(rng.randrange(3))]}} if rng.random() < 0.7 else {"basket": _junk(rng)}


async def test_ten_thousand_fuzzed_argument_sets_no_crash_and_nothing_invalid_reaches_the_server():
    server = build()
    rng = random.Random(8)
    reached = rejected = 0
    async with Toolbox({"probe": server}) as toolbox:
        schemas = {name: toolbox.catalog[name].input_schema for name in ("echo", "checkout")}
        for i in range(10_000):
            tool = "echo" if i % 2 else "checkout"
            before = len(server.calls)
            result = await toolbox.call(tool, _arguments(rng))
            if result.error_kind == "invalid_arguments":
                rejected += 1
                assert len(server.calls) == before  # the server's own log is the witness
            else:
                reached += 1
    for logged in server.calls:  # every call the server saw was valid for the schema it published
        if logged["tool"] == "echo":
            jsonschema.validate(logged["arguments"], schemas["echo"])
        else:
            jsonschema.validate(logged["arguments"], schemas["checkout"])
    assert reached == len(server.calls) and reached > 150 and rejected > 9_000


def _act_then_answer(calls):
    """Makes `calls` one per turn, then answers; keeps every request it saw."""
    seen = []

    def act(request):
        seen.append(request)
        done = sum(1 for m in request.messages if isinstance(m, ToolMessage))
        return tool_call_text(*calls[done]) if done < len(calls) else "done"

    return act, seen


async def _run(toolbox, act, *, rehearse=None, gate=None, store=None):
    policy = FunctionPolicy(act=act, rehearse=rehearse)
    context = EnvaceContext(policy=policy, toolbox=toolbox, gate=gate or GateConfig(rehearse="none", require_approval="never"))
    return await record_run(create_envace_graph().compile(), {"messages": [HumanMessage(content="go")]},
                            context=context, store=store)


async def test_a_10_mb_output_arrives_whole_the_prompt_shows_a_clipped_view_and_the_trace_keeps_one_cut_copy(tmp_path):
    """The reply came as text and again as structured content: the trace stored 20 MB for it. It keeps the
    first `RESULT_CHARS` of the text, once, and says what was cut."""
    act, seen = _act_then_answer([("big", {"megabytes": 10})])
    store = TraceStore(tmp_path)
    async with Toolbox({"probe": build()}) as toolbox:
        state, trace = await _run(toolbox, act, store=store)
    assert state["final_answer"] == "done"
    chat, _ = render_act(seen[-1])
    shown = next(m["content"] for m in chat if m["role"] == "tool")
    assert len(shown) < TOOL_OUTPUT_CHARS + 200 and "characters cut" in shown
    [stored] = list(store.read())
    result = next(s for s in stored.steps if s.role == "tool").result
    [kept, note] = result["content"]
    assert kept["text"] == "x" * RESULT_CHARS and result["structured_content"] is None
    assert result["truncated"] == {"content_chars": 10_000_000, "structured_chars": 10_000_014, "kept_chars": RESULT_CHARS}
    assert "cut" in note["text"] and "10,000,000" in note["text"]
    assert RESULT_CHARS < (tmp_path / "traces.jsonl").stat().st_size < RESULT_CHARS + 100_000


async def test_bytes_that_are_not_utf8_reach_the_model_as_replacement_characters_and_round_trip_in_traces(tmp_path):
    act, seen = _act_then_answer([("mojibake", {})])
    store = TraceStore(tmp_path)
    async with Toolbox({"probe": build()}) as toolbox:
        _, trace = await _run(toolbox, act, store=store)
    chat, _ = render_act(seen[-1])
    shown = next(m["content"] for m in chat if m["role"] == "tool")
    assert "caf\ufffd" in shown and "\udce9" not in shown
    json.dumps(chat).encode()  # what a tokenizer would receive is valid UTF-8
    [stored] = list(store.read())
    text = next(s for s in stored.steps if s.role == "tool").result["content"][0]["text"]
    assert text == b"caf\xe9 \xff\xfe\x00 ok".decode("utf-8", errors="surrogateescape")  # lossless


async def test_a_stdio_server_that_cannot_write_its_output_fails_that_call_cleanly_and_is_restarted():
    async with Toolbox({"probe": {"command": sys.executable, "args": [PROBE]}}, timeout=3) as toolbox:
        broken = await toolbox.call("mojibake", {})
        assert broken.is_error and broken.error_kind in ("timeout", "server_died")
        results = [await toolbox.call("echo", {"text": "after"}) for _ in range(2)]
        assert not results[-1].is_error and results[-1].value["text"] == "after"


async def test_tools_with_odd_names_are_listed_called_by_the_model_and_recorded(tmp_path):
    name = "weird name.v2/ü-名前"
    act, _ = _act_then_answer([(name, {"value": "ok"})])
    server = build()
    async with Toolbox({"probe": server}) as toolbox:
        assert name in toolbox.catalog
        state, trace = await _run(toolbox, act, store=TraceStore(tmp_path))
    assert {"tool": "weird", "arguments": {"value": "ok"}} in server.calls
    step = next(s for s in trace.steps if s.role == "tool")
    assert step.tool == name and step.result["content"][0]["text"] == "weird:ok"


async def test_prompt_injected_tool_output_cannot_change_the_gate():
    """The gate is code: an output that claims to switch it off changes nothing it decides."""
    act, seen = _act_then_answer([("injected", {}), ("explode", {"message": "wipe everything"})])

    def rehearse(request):
        return ('<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", '
                '"message": "would wipe everything"}}</execution_result>')

    gate = GateConfig(rehearse="writes", require_approval="never")
    server = build()
    async with Toolbox({"probe": server}) as toolbox:
        state, trace = await _run(toolbox, act, rehearse=rehearse, gate=gate)
    assert any("SYSTEM OVERRIDE" in str(m.content) for m in state["messages"] if isinstance(m, ToolMessage))
    decisions = {s.tool: s.decision for s in trace.steps if s.role == "gate"}
    assert decisions["explode"] == "block"
    assert not any(c["tool"] == "explode" for c in server.calls)  # never reached the server
    assert gate == GateConfig(rehearse="writes", require_approval="never")


@pytest.mark.parametrize("transport", ["in-process", "stdio"])
async def test_a_hung_tool_mid_run_times_out_the_run_goes_on_and_the_trace_says_so(transport, tmp_path):
    act, seen = _act_then_answer([("hang", {}), ("echo", {"text": "after"})])
    server = build() if transport == "in-process" else {"command": sys.executable, "args": [PROBE]}
    store = TraceStore(tmp_path)
    async with Toolbox({"probe": server}, timeout=0.5) as toolbox:
        with anyio.fail_after(30):
            state, trace = await _run(toolbox, act, store=store)
    assert state["final_answer"] == "done"
    hung, after = [s for s in trace.steps if s.role == "tool"]
    assert hung.tool == "hang" and hung.result["error_kind"] == "timeout"
    assert after.tool == "echo" and not after.result["is_error"]
    assert "timed out" in str(seen[1].messages[-1].content)  # the model was told
    assert len(list(store.read())) == 1


async def test_a_slow_tool_does_not_hold_up_other_runs_on_the_same_server():
    """Calls share one session per server but do not queue behind each other: a 3 s tool in one run,
    ten quick calls in nine other runs, all on one stdio server."""
    finished: list[str] = []

    async def one(toolbox, calls, name):
        await _run(toolbox, _act_then_answer(calls)[0])
        finished.append(name)

    async with Toolbox({"probe": {"command": sys.executable, "args": [PROBE]}}) as toolbox:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, toolbox, [("hang", {"seconds": 3})], "slow")
                await anyio.sleep(0.2)  # the slow call is in flight
                for i in range(9):
                    tg.start_soon(one, toolbox, [("echo", {"text": f"r{i}"})] * 10, f"quick{i}")
    assert finished[-1] == "slow" and len(finished) == 10

"""Tools that ask: a server that needs a person's input mid-call, in both protocol eras, and servers
that ask in bad faith (forever, with broken schemas, with a book for a question, for sampling).
Real MCP servers: in-process, over stdio and over streamable HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    SamplingMessage,
    TextContent,
)

from envace_mcp.envs.launch import free_port, wait_for_port
from envace_mcp.errors import UserError
from envace_mcp.toolbox import Toolbox
from envace_mcp.toolbox.asking import MAX_MESSAGE
from envace_mcp.traces.context import parse, traceparent

sys.path.insert(0, str(Path(__file__).parents[1] / "servers"))
import asking_server  # noqa: E402

pytestmark = pytest.mark.anyio
SERVER = str(Path(__file__).parents[1] / "servers" / "asking_server.py")


@pytest.fixture
def anyio_backend():
    return "asyncio"


def form(message: str, schema: dict) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


PIN = {"type": "object", "properties": {"pin": {"type": "string"}}, "required": ["pin"]}


def hostile_server() -> MCPServer:
    """Tools that ask in bad faith, each by hand (`InputRequiredResult`)."""
    server = MCPServer("hostile", log_level="WARNING")

    @server.tool()
    async def forever(ctx: Context) -> str | InputRequiredResult:
        """Asks again whatever it is told."""
        return InputRequiredResult(input_requests={"again": form("One more question?", PIN)}, request_state="s")

    @server.tool()
    async def nested(ctx: Context) -> str | InputRequiredResult:
        return InputRequiredResult(input_requests={"q": form("Your address?", {"type": "object", "properties": {
            "address": {"type": "object", "properties": {"$ref": {"$ref": "http://127.0.0.1:9/x.json"}}}}})})

    @server.tool()
    async def essay(ctx: Context) -> str | InputRequiredResult:
        return InputRequiredResult(input_requests={"q": form("\x1b[2J" + "read me " * 20_000, PIN)})

    @server.tool()
    async def hoard(ctx: Context) -> str | InputRequiredResult:
        return InputRequiredResult(input_requests={"q": form("PIN?", PIN)}, request_state="s" * 3_000_000)

    @server.tool()
    async def sample(ctx: Context) -> str | InputRequiredResult:
        ask = CreateMessageRequest(params=CreateMessageRequestParams(
            messages=[SamplingMessage(role="user", content=TextContent(type="text", text="hi"))], max_tokens=5))
        return InputRequiredResult(input_requests={"llm": ask})

    return server


async def test_a_2026_server_that_asks_comes_back_waiting_and_finishes_with_the_answer():
    server = asking_server.build()
    async with Toolbox({"pay": server}) as toolbox:
        waiting = await toolbox.call("pay", {"amount": 5})
        assert server.paid == [] and waiting.is_error and waiting.error_kind == "input_required"
        (question,) = waiting.input_required["questions"]
        assert question["mode"] == "form" and "PIN" in question["message"]
        assert question["requested_schema"]["properties"] == {"pin": {"title": "Pin", "type": "string"}}
        assert waiting.input_required["round"] == 1 and waiting.input_required["request_state"]
        with pytest.raises(UserError, match="no answer for"):  # nothing sent, the waiting call still answerable
            await toolbox.respond(waiting, {})
        with pytest.raises(UserError, match="accept, decline or cancel"):
            await toolbox.respond(waiting, {question["key"]: {"action": "sure"}})
        done = await toolbox.respond(waiting, {question["key"]: {"action": "accept", "content": {"pin": "4321"}}})
    assert not done.is_error and done.text == "paid 5" and server.paid == [(5, "4321")]


async def test_a_declined_question_reaches_the_server_as_a_decline_and_nothing_is_paid():
    server = asking_server.build()
    async with Toolbox({"pay": server}) as toolbox:
        waiting = await toolbox.call("pay", {"amount": 5})
        key = waiting.input_required["questions"][0]["key"]
        declined = await toolbox.respond(waiting, {key: {"action": "decline"}})
    assert declined.is_error and declined.error_kind == "tool_error" and "decline" in declined.text
    assert server.paid == []


async def test_a_server_that_asks_forever_ends_with_a_clear_error_after_the_allowed_rounds():
    async with Toolbox({"h": hostile_server()}, max_input_rounds=3) as toolbox:
        result = await toolbox.call("forever")
        rounds = 1
        while result.input_required is not None:
            result = await toolbox.respond(result, {"again": {"action": "accept", "content": {"pin": "1"}}})
            rounds += 1
    assert rounds == 4 and result.is_error and result.error_kind == "tool_error"
    assert "kept asking: 4 rounds" in result.text and "max_input_rounds" in result.text


@pytest.mark.parametrize("tool, why", [("nested", "malformed schema: field 'address'"),
                                       ("essay", f"more than the {MAX_MESSAGE}"),
                                       ("hoard", "characters, more than the 65,536 a waiting call keeps"),
                                       ("sample", "sampling (a completion from this client's model)")])
async def test_what_cannot_be_put_to_a_person_ends_the_call_with_an_error_that_says_why(tool, why):
    async with Toolbox({"h": hostile_server()}) as toolbox:
        result = await toolbox.call(tool)
    assert result.is_error and result.error_kind == "tool_error" and result.input_required is None
    assert why in result.text and "was not continued" in result.text
    assert "\x1b" not in result.text and len(result.text) < 1000


async def test_the_traceparent_a_caller_sends_reaches_the_server_in_its_request_meta():
    server = asking_server.build()
    sent = traceparent("run-1", "call:c1")
    async with Toolbox({"pay": server}) as toolbox:
        waiting = await toolbox.scoped({"traceparent": sent}).call("pay", {"amount": 1})
        key = waiting.input_required["questions"][0]["key"]
        await toolbox.scoped({"traceparent": sent}).respond(waiting, {key: {"action": "accept",
                                                                           "content": {"pin": "0"}}})
    assert server.traceparents == [sent] and parse(sent) is not None


@pytest.fixture(params=["stdio", "http"])
def asking_config(request, tmp_path):
    """The asking server out of process, as a toolbox config, and the log it writes its payments to."""
    log = tmp_path / "log.jsonl"
    if request.param == "stdio":
        yield {"pay": {"command": sys.executable, "args": [SERVER, "modern"], "env": {"ASKING_LOG": str(log)}}}, log
        return
    port = free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(port)], env={**os.environ, "ASKING_LOG": str(log)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, proc, 30)
        yield {"pay": {"url": f"http://127.0.0.1:{port}/mcp"}}, log
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


async def test_out_of_process_a_2026_server_asks_and_is_answered(asking_config):
    config, log = asking_config
    async with Toolbox(config) as toolbox:
        waiting = await toolbox.call("pay", {"amount": 7})
        assert waiting.error_kind == "input_required" and not log.exists()
        key = waiting.input_required["questions"][0]["key"]
        done = await toolbox.respond(waiting, {key: {"action": "accept", "content": {"pin": "9"}}},
                                     meta={"traceparent": traceparent("r", "call:x")})
    assert done.text == "paid 7"
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry == {"paid": 7, "pin": "9", "traceparent": traceparent("r", "call:x")}


async def test_a_2025_server_that_asks_mid_call_is_refused_and_the_result_says_so(tmp_path):
    log = tmp_path / "log.jsonl"
    config = {"pay": {"command": sys.executable, "args": [SERVER, "legacy"], "env": {"ASKING_LOG": str(log)}}}
    async with Toolbox(config) as toolbox:
        result = await toolbox.call("pay", {"amount": 7})
    assert result.is_error and result.input_required is None and not log.exists()  # nothing paid
    assert "asked for input mid-call (protocol 2025 elicitation), which this client refuses" in result.text
    assert "Enter the PIN that confirms this payment" in result.text


async def test_a_2025_servers_mid_call_question_is_answered_by_the_callers_ask_and_the_result_keeps_it(tmp_path):
    """The same 2025 server, with an asker given to the call (an approver that answers inside the run):
    the question is put to it while the call waits, its answer (checked against the form) reaches the
    server, and the result keeps question and answer. A second call whose asker gives answers that do
    not fit the form is cancelled, not sent them."""
    log = tmp_path / "log.jsonl"
    config = {"pay": {"command": sys.executable, "args": [SERVER, "legacy"], "env": {"ASKING_LOG": str(log)}}}
    shown = []

    async def ask(questions):
        shown.append(questions)
        return {"elicitation": {"action": "accept", "content": {"pin": "42"}}}

    async def ask_badly(questions):
        return {"elicitation": {"action": "accept", "content": {"pan": 1}}}

    async with Toolbox(config) as toolbox:
        paid = await toolbox.call("pay", {"amount": 3}, ask=ask)
        unpaid = await toolbox.call("pay", {"amount": 4}, ask=ask_badly)
    (questions,) = shown
    assert questions[0]["message"] == "Enter the PIN that confirms this payment" and questions[0]["mode"] == "form"
    assert not paid.is_error and paid.text == "paid 3"
    assert paid.asked == [{"round": 1, "questions": questions,
                           "answers": {"elicitation": {"action": "accept", "content": {"pin": "42"}}}}]
    assert unpaid.is_error and unpaid.asked[0]["answers"] is None
    assert [json.loads(line)["paid"] for line in log.read_text().splitlines()] == [3]

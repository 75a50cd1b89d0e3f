"""The inline rehearse format: the rehearse role continues the act context with the tool's reply.

Through the real graph, the real bank server and a real transformers model (the tiny Qwen3 under a
plain ChatML template, as the embedded SmolLM2 has: tools written into the prompt, tool replies as
`<tool_response>` user turns)."""

import json
import shutil

import pytest
from langchain_core.messages import HumanMessage

from envace_mcp.policy.parsing import parse_tool_turn
from envace_mcp.policy.types import ToolCall
from envace_mcp.traces import TraceStore

pytestmark = pytest.mark.anyio

PLAIN_CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def plain_dir(tiny_qwen3_dir, tmp_path_factory):
    """The tiny model with a template that renders no `tools=` (SmolLM2's case)."""
    target = tmp_path_factory.mktemp("plain") / "m"
    shutil.copytree(tiny_qwen3_dir, target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = PLAIN_CHATML
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    (target / "chat_template.jinja").unlink(missing_ok=True)
    return target


def _policy(path, **kwargs):
    from envace_mcp.policy import load_policy

    return load_policy(str(path), tool_format="compact", rehearse_format="inline", **kwargs)


async def test_reference_rehearsals_continue_the_act_turn_and_read_like_the_real_server(plain_dir, tmp_path):
    from envace_mcp.lab.reference import record_reference_traces
    from envace_mcp.train.rows import collate
    from envace_mcp.train.sft import sft_rows, target_encoding

    policy = _policy(plain_dir)
    assert not policy.template_has_tools
    await record_reference_traces(policy, "bank", tmp_path, limit=8, score=False)
    runs = list(TraceStore(tmp_path))
    assert {r.rehearse_format for r in runs} == {"inline"} and all(r.reward("task").value == 1.0 for r in runs)
    opening = policy.encode("\n<|im_start|>user\n<tool_response>\n")  # after the turn's <|im_end|>
    checked = nested = 0
    for run in runs:
        generated = [s for s in run.steps if s.prompt_ids]
        real = {s.call_id: s for s in run.steps if s.role == "tool"}
        for before, step in zip(generated, generated[1:]):
            if step.role != "rehearse":
                continue
            assert before.role == "act" and step.format == "inline" and step.close == "\n</tool_response>"
            # the prompt is the act turn's prompt and completion (in the prefix cache), then the tool turn opens
            assert step.prompt_ids == before.prompt_ids + before.completion_ids + opening
            tool = real[step.call_id]
            reply = "".join(b["text"] for b in tool.result["content"] if b["type"] == "text")
            assert step.parsed["text"] == reply  # the reference rehearsal reads like the server's own reply
            assert tool.comparison.score == 1.0 and not tool.comparison.mismatches
            checked += 1
        encode, end = target_encoding(policy.tokenizer)
        rows = sft_rows([run], encode, end)
        batch = collate(rows, share_prefix=True)
        nested += len(rows) - len(batch.spans)  # rows read inside a longer row of the same run
        acts = [s for s in run.steps if s.role == "act"]
        first = next(r for r in rows if r.role == "rehearse")  # its target is the real reply the next turn shows
        assert acts[1].prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == first.prompt_ids + first.completion_ids
    assert checked >= 8 and nested >= len(runs)


async def test_a_generated_inline_rehearsal_reuses_the_act_prompt_and_parses(plain_dir, bank_catalog):
    from envace_mcp.policy import SamplingParams
    from envace_mcp.policy.base import decided
    from envace_mcp.policy.types import ActRequest, RehearseRequest

    policy = _policy(plain_dir, sampling=SamplingParams(max_new_tokens=12, temperature=0.0))
    context = ActRequest(task="What is the balance of CHK-1001?", tools=list(bank_catalog))
    act = await policy.act(context)
    call = ToolCall(id="c1", name="get_balance", arguments={"account_id": "CHK-1001"})
    spec = next(s for s in bank_catalog if s.name == "get_balance")
    reused = policy.engine.stats["reused_tokens"]
    generation = await policy.rehearse(RehearseRequest(
        call=call, tool=spec, allowed=list(bank_catalog), history=[HumanMessage(content=context.task)],
        act_message='<tool_call>\n{"name": "get_balance", "arguments": {"account_id": "CHK-1001"}}\n</tool_call>',
        context=context), SamplingParams(max_new_tokens=12, temperature=1.0, seed=3))
    assert generation.prompt_format == "inline" and generation.turn_close == "\n</tool_response>"
    assert generation.prompt_ids[: len(act.prompt_ids)] == act.prompt_ids
    assert policy.engine.stats["reused_tokens"] - reused >= len(act.prompt_ids) - 1  # prefilled once, for both roles
    assert 0 < len(generation.completion_ids) <= 12
    # a random model writes anything; what it wrote is the decoded completion, parsed as the tool's reply
    # up to the template's close of the tool turn
    assert generation.text == policy.engine.decode(generation.completion_ids)
    cut = generation.finish_reason == "length"
    parsed = parse_tool_turn(generation.text, call, spec, "\n</tool_response>", cut=cut)
    if parsed.code in ("UNKNOWN", "OUTPUT_SCHEMA_MISMATCH"):  # a result decided first, then cut or off its schema
        parsed = decided(parsed)
    assert generation.parsed.model_copy(update={"p_error": None, "confidence": None}) == parsed
    assert 0 <= generation.parsed.p_error <= 1  # decoded status first (`reply.ReplyConstraint`)
    assert (generation.parsed.tool, generation.parsed.arguments) == (call.name, call.arguments)


async def test_in_simulated_mode_the_rehearsal_is_the_tool_turn_the_trajectory_continues(plain_dir):
    from envace_mcp.envs import get_suite
    from envace_mcp.envs.reference import reference_roles
    from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
    from envace_mcp.policy.forced import ForcedPolicy
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.traces import record_run

    suite = get_suite("bank")
    task = next(t for t in suite.split("train") if len(t.actions) >= 2)
    base = _policy(plain_dir)
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        tools = list(toolbox.catalog)
    policy = ForcedPolicy(base, **reference_roles(suite, task, rehearse_format="inline"), score=False)
    state, trace = await record_run(create_envace_graph().compile(), {"messages": [HumanMessage(content=task.instruction)]},
                                    context=EnvaceContext(policy=policy, tools=tools, mode="simulated",
                                                          gate=GateConfig(rehearse="all")))
    sims = [s for s in trace.steps if s.role == "tool"]
    assert len(sims) == len(task.actions) and all(s.simulated for s in sims)
    rehearsals = [s for s in trace.steps if s.role == "rehearse"]
    replies = [m for m in state["messages"] if m.type == "tool"]
    assert [m.content for m in replies] == [r.parsed["text"] for r in rehearsals]  # the prediction's own text
    acts = [s for s in trace.steps if s.role == "act"]
    seq = rehearsals[0].prompt_ids + rehearsals[0].completion_ids
    assert acts[1].prompt_ids[: len(seq)] == seq  # the next turn continues the rehearsal's own tokens


@pytest.mark.parametrize("text,status,code", [
    ('{"account_id": "CHK-1", "balance": 10.5, "currency": "USD", "type": "checking"}\n</tool_response>', "result", None),
    ("Error executing tool transfer: Insufficient funds in CHK-1\n</tool_response>", "tool_error", "EXECUTION_ERROR"),
    ("the balance is ten dollars", "tool_error", "EXECUTION_ERROR"),  # prose from a structured tool is a failure
    ('{"account_id": "CHK-1", "balance": "lots"}', "invalid", "OUTPUT_SCHEMA_MISMATCH"),
    ('{"account_id": ', "invalid", "INVALID_JSON"),
    ("\n</tool_response>", "invalid", "EMPTY_OUTPUT"),
    # the model took the next act turn where the reply goes: unusable, not a predicted failure
    ('<tool_call>\n{"name": "get_balance", "arguments": {"account_id": "CHK-1"}}\n</tool_call>', "invalid", "NOT_A_TOOL_REPLY"),
    ("<|im_start|>assistant\nYour balance is", "invalid", "NOT_A_TOOL_REPLY"),
    ('{"error_tool_call": {"code": "INVALID_PARAMETERS", "details": "amount"}}', "tool_error", "INVALID_PARAMETERS"),
])
def test_a_tool_turn_parses_into_a_typed_prediction(bank_catalog, text, status, code):
    spec = next(s for s in bank_catalog if s.name == "get_balance")
    call = ToolCall(id="c", name=spec.name, arguments={"account_id": "CHK-1"})
    prediction = parse_tool_turn(text, call, spec, "\n</tool_response>")
    assert (prediction.status, prediction.code) == (status, code)
    if status != "invalid":
        assert prediction.text == text.split("\n</tool_response>")[0].strip()
    if status == "tool_error" and "Insufficient" in text:
        assert prediction.message == "Insufficient funds in CHK-1"


def test_a_tool_without_an_output_schema_may_answer_in_prose(bank_catalog):
    from dataclasses import replace

    spec = replace(bank_catalog[0], name="transfer_to_human_agents", output_schema=None)
    prediction = parse_tool_turn("Transfer successful", ToolCall(id="c", name=spec.name), spec)
    assert prediction.status == "result" and prediction.result == "Transfer successful"


async def test_a_chat_model_backend_refuses_inline_rehearsal_with_the_way_out(bank_catalog):
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from envace_mcp.errors import UserError
    from envace_mcp.policy.chat_backend import ChatModelPolicy
    from envace_mcp.policy.types import RehearseRequest

    policy = ChatModelPolicy(FakeListChatModel(responses=["{}"]))
    policy.rehearse_format = "inline"
    with pytest.raises(UserError, match="rehearse_format='simulator'"):
        await policy.rehearse(RehearseRequest(call=ToolCall(id="c", name="get_balance"), tool=None))


def test_version_1_traces_read_as_simulator_prompts():
    from envace_mcp.traces.schema import SCHEMA_VERSION, read_trace

    old = {"schema_version": 1, "run_id": "r", "started_at": 0.0,
           "steps": [{"index": 0, "role": "rehearse", "time": 0.0, "text": "<execution_result>{}</execution_result>"},
                     {"index": 1, "role": "act", "time": 0.0}]}
    trace = read_trace(old)
    assert trace.schema_version == SCHEMA_VERSION == 3 and trace.rehearse_format == "simulator"
    assert [s.format for s in trace.steps] == ["simulator", None]
    with pytest.raises(ValueError, match="newer"):
        read_trace({**old, "schema_version": SCHEMA_VERSION + 1})

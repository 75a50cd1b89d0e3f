"""Training from an unchanged `create_agent` agent's runs: the policy as its chat model, its runs
recorded with a user's reward function, one GRPO step whose first update has ratio 1 (the trace
contract holds end to end), and a foreign chat model's runs refused by GRPO with the reason."""

import importlib.util
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from envace_mcp.errors import UserError
from envace_mcp.envs import get_suite
from envace_mcp.graph import GateConfig
from envace_mcp.envs.reference import reference_roles
from envace_mcp.policy import load_policy
from envace_mcp.policy.forced import ForcedPolicy

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_from_your_agent.py"


def example():
    spec = importlib.util.spec_from_file_location("train_from_your_agent", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_policy(tiny_qwen3_dir, tasks):
    """The tiny model saying the reference solutions (real token ids and its own logprobs of them)."""
    roles = {task.instruction: reference_roles(get_suite("bank"), task) for task in tasks}

    def task_of(messages):
        return next(str(m.content) for m in messages if isinstance(m, HumanMessage))

    return ForcedPolicy(load_policy(str(tiny_qwen3_dir)), act=lambda r: roles[r.task]["act"](r),
                        rehearse=lambda r: roles[task_of(r.history)]["rehearse"](r))


def test_the_example_trains_one_grpo_step_from_an_agents_recorded_runs(tiny_qwen3_dir, tmp_path):
    module = example()
    tasks = module.writing_tasks(get_suite("bank"))[:2]
    runs, records = module.main(str(tiny_qwen3_dir), tmp_path, tasks=2, k=2, policy=reference_policy(tiny_qwen3_dir, tasks),
                                   performance={"skip_zero_advantage": False})
    assert len(runs) == 4 and sorted({r.group_id for r in runs}) == sorted(t.id for t in tasks)
    assert all(r.reward("task") is not None and r.reward("task").value == 1.0 for r in runs)  # the user's reward
    roles = {s.role for r in runs for s in r.steps if s.logprobs is not None}
    assert roles == {"act", "rehearse"}  # both roles recorded with their sampling logprobs
    acts = [s for r in runs for s in r.steps if s.role == "act"]
    assert all(s.prompt_ids and s.completion_ids and len(s.logprobs) == len(s.completion_ids) for s in acts)
    assert any(s.role == "tool" and s.result and not s.result["is_error"] for r in runs for s in r.steps)
    (step,) = records
    assert step["segments"] == sum(1 for r in runs for s in r.steps if s.role in ("act", "rehearse"))
    assert step["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # the tokens and logprobs the agent recorded


def test_the_chat_model_binds_tools_and_answers_sync_and_async(tiny_qwen3_dir, bank_catalog):
    import anyio

    model = reference_policy(tiny_qwen3_dir, get_suite("bank").split("train")[:1]).as_chat_model()
    bound = model.bind_tools([{"type": "function", "function": {"name": "get_balance", "parameters": {
        "type": "object", "properties": {"account_id": {"type": "string"}}, "required": ["account_id"]}}}])
    assert [s.name for s in bound.tools] == ["get_balance"] and model.tools == []
    task = get_suite("bank").split("train")[0]
    reply = bound.invoke([HumanMessage(content=task.instruction)])
    again = anyio.run(bound.ainvoke, [HumanMessage(content=task.instruction)])
    calls = [(c["name"], c["args"]) for c in reply.tool_calls]
    assert isinstance(reply, AIMessage) and calls and calls == [(c["name"], c["args"]) for c in again.tool_calls]
    assert reply.tool_calls[0]["name"] == task.actions[0].tool
    assert reply.usage_metadata["output_tokens"] > 0 and reply.response_metadata["finish_reason"] == "stop"


def test_grpo_refuses_runs_whose_act_turns_came_from_a_foreign_chat_model(tiny_qwen3_dir, tmp_path):
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    from envace_mcp import Toolbox
    from envace_mcp.envs import Episode
    from envace_mcp.graph.middleware import RehearsalMiddleware
    from envace_mcp.traces import TraceStore, record_run
    from envace_mcp.train.trainer import GRPOConfig, OfflineGRPO

    class Hosted(GenericFakeChatModel):  # a hosted chat model: text, no token ids, no logprobs
        def bind_tools(self, tools, **kwargs):
            return self

    suite = get_suite("bank")
    task = next(t for t in suite.split("train") if t.kind == "transfer_funds")
    transfer = next(a for a in task.actions if a.tool == "transfer")

    async def go():
        async with Toolbox({"bank": suite.build_server()}) as toolbox:
            episode = Episode(task, "bank")
            tools = toolbox.langchain_tools(meta=episode.meta)
            model = Hosted(messages=iter([AIMessage(content="", tool_calls=[{"name": "transfer", "args": transfer.arguments,
                                                                               "id": "c1"}]), AIMessage(content="Done.")]))
            agent = create_agent(model, tools=tools,
                                 middleware=[RehearsalMiddleware(reference_policy(tiny_qwen3_dir, [task]), tools=tools,
                                                                 gate=GateConfig(require_approval="never"))])  # a sandbox
            await record_run(agent, {"messages": [HumanMessage(content=task.instruction)]}, store=TraceStore(tmp_path / "t"),
                             group_id=task.id, task_id=task.id, model="hosted", rewards=[succeeded])

    def succeeded(trace, state):  # the user's reward, named "succeeded"
        return 1.0, {"why": "scripted"}

    import anyio

    anyio.run(go)
    (trace,) = TraceStore(tmp_path / "t").read()
    assert [s.role for s in trace.steps if s.role in ("act", "rehearse")] == ["act", "rehearse", "act"]
    assert trace.steps[0].text is not None and trace.steps[0].logprobs is None  # recorded, as text
    with pytest.raises(UserError, match="without sampling logprobs.*hosted.*as_chat_model"):
        OfflineGRPO(GRPOConfig(model=str(tiny_qwen3_dir), steps=1), tmp_path / "t", tmp_path / "grpo")

    # SFT may still learn from them: the act turns re-rendered and re-tokenised for the policy
    from envace_mcp.train.retokenize import retokenized_act_rows
    from envace_mcp.train.sft import sft_loss

    policy = load_policy(str(tiny_qwen3_dir))
    specs = [s for s in anyio.run(catalog, suite)]
    assert trace.reward("succeeded").value == 1.0 and trace.reward("succeeded").details == {"why": "scripted"}
    rows = retokenized_act_rows([trace], policy, specs, reward="succeeded")
    assert len(rows) == 2 and all(r.old_logprobs is None for r in rows)
    first, second = (policy.tokenizer.decode(r.prompt_ids) for r in rows)
    assert task.instruction in first and '"transfer"' in first  # the task, and the tools the policy renders
    assert second.startswith(first.split("<|im_start|>assistant")[0][:200]) and "Done" not in second
    assert '"name": "transfer"' in policy.tokenizer.decode(rows[0].completion_ids)
    assert "Done." in policy.tokenizer.decode(rows[1].completion_ids)
    assert float(sft_loss(policy.model, rows, policy.tokenizer.pad_token_id or 0)) > 0


async def catalog(suite):
    from envace_mcp import Toolbox

    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        return list(toolbox.catalog)


def test_record_group_runs_k_concurrent_runs_and_an_unscorable_reward_is_none_not_zero(bank_catalog):
    import anyio

    from envace_mcp.graph import EnvaceContext, create_envace_graph
    from envace_mcp.testing import FunctionPolicy
    from envace_mcp.traces import record_group

    graph = create_envace_graph().compile()
    context = EnvaceContext(policy=FunctionPolicy(act=lambda r: "Nothing to do."), tools=bank_catalog, mode="simulated")
    seen = []

    async def politeness(trace, state):
        seen.append(trace.run_id)
        return (None, {}) if len(seen) == 1 else (0.5, {"said": trace.final_answer})

    traces = anyio.run(lambda: record_group(graph, lambda: {"messages": [HumanMessage(content="hi")]}, k=3,
                                            group_id="g", rewards=[politeness], context=context))
    assert len(traces) == 3 and len({t.run_id for t in traces}) == 3 and {t.group_id for t in traces} == {"g"}
    values = sorted((t.reward("politeness").value for t in traces), key=lambda v: (v is not None, v))
    assert values == [None, 0.5, 0.5]
    assert all(t.final_answer == "Nothing to do." for t in traces)

"""Fresh rollouts: simulated-mode rewards by replay, and an online GRPO loop on the tiny Qwen3."""

import json

import pytest
from langchain_core.messages import HumanMessage

from envace_mcp.envs import get_suite
from envace_mcp.graph import EnvaceContext, GateConfig, RunLimits, create_envace_graph
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
    # kinds: rollouts draw only that kind's tasks (the "middling" tasks of a validation run)
    trainer = OnlineGRPO(GRPOConfig(lr=1e-3, steps=2, groups_per_step=1, experimental={"kinds": ["market_closed"]},
                                    performance={"micro_batch": 4, "skip_zero_advantage": False}),
                         get_suite("bank"),
                         tmp_path / "run", k=3, tools=bank_catalog, limits=RunLimits(max_steps=1),
                         sampling={"act": short, "rehearse": short},
                         model=AutoModelForCausalLM.from_pretrained(folder), tokenizer=AutoTokenizer.from_pretrained(folder))
    records = trainer.run()
    assert [r["step"] for r in records] == [1, 2] and all(r["segments"] >= 3 for r in records)
    traces = list(TraceStore(tmp_path / "run" / "traces").read())
    assert len(traces) == 6 and len({t.group_id for t in traces}) == 2
    kinds = {get_suite("bank").task(t.group_id.split(":")[1]).kind for t in traces}
    pool = [t for t in get_suite("bank").split("train") if t.kind == "market_closed"]
    assert kinds == {"market_closed"} and trainer.source.tasks == pool
    assert all(t.reward("task") is not None and t.mode == "real" for t in traces)  # real by default, as `envace train grpo`
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
    trainer = OnlineGRPO(GRPOConfig(lr=1e-3, steps=1, groups_per_step=1, performance={"micro_batch": 4}), get_suite("bank"),
                         tmp_path / "run", k=2, mode="real", tools=bank_catalog, limits=RunLimits(max_steps=1),
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


def tiny_trainer(tmp_path, config, tasks, bank_catalog, *, max_steps):
    """Online GRPO on the tiny Qwen3 over bank `tasks` (K = 2, simulated, 6-token turns): its policy is
    for the caller to force."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.testing import build_tiny_qwen3
    from envace_mcp.train.trainer import OnlineGRPO

    folder = build_tiny_qwen3(tmp_path / "tiny")
    short = SamplingParams(max_new_tokens=6)
    trainer = OnlineGRPO(config, get_suite("bank"), tmp_path / "run", k=2, tools=bank_catalog,
                         limits=RunLimits(max_steps=max_steps), sampling={"act": short, "rehearse": short},
                         model=AutoModelForCausalLM.from_pretrained(folder), tokenizer=AutoTokenizer.from_pretrained(folder))
    trainer.source.tasks = tasks
    return trainer


@pytest.mark.parametrize("rounds", [0, 3])
def test_dynamic_sampling_replaces_groups_that_scored_alike_with_further_tasks(tmp_path, bank_catalog, rounds):
    """Two of four tasks get groups whose runs differ (the first turn alternates between the reference
    call and an idle "Done."); the other two always run the reference, so their groups score alike.
    With dynamic sampling the step keeps drawing tasks until it has two groups with signal; without it,
    the step keeps its first two groups whatever they scored. Both log the uniform fraction."""

    from envace_mcp.envs.reference import reference_roles
    from envace_mcp.policy.forced import ForcedPolicy
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.sources import SeededOrder
    from envace_mcp.train.trainer import GRPOConfig

    suite = get_suite("bank")
    writes = [t for t in suite.split("fit") if t.outcome == "success" and len(t.actions) == 1 and t.write_actions]
    tasks = writes[:4]
    varied = {tasks[0].instruction, tasks[3].instruction}
    roles = {t.instruction: reference_roles(suite, t) for t in tasks}
    starts: dict[str, int] = {}

    def act(request):
        if not request.messages:  # a run's first turn: alternate within the varied tasks' groups
            starts[request.task] = starts.get(request.task, 0) + 1
            if request.task in varied and starts[request.task] % 2 == 0:
                return "Done."
        return roles[request.task]["act"](request)

    config = GRPOConfig(lr=1e-3, steps=1, groups_per_step=2, experimental={"dynamic_sampling": rounds},
                        performance={"micro_batch": 8})
    trainer = tiny_trainer(tmp_path, config, tasks, bank_catalog, max_steps=2)
    def rehearse(request):
        task = next(m.content for m in request.history if isinstance(m, HumanMessage))
        return roles[task]["rehearse"](request)

    trainer.policy = ForcedPolicy(trainer.policy, act=act, rehearse=rehearse)
    record = trainer.run()[0]

    order = SeededOrder(config.seed)  # the tasks the seeded order hands out, in turn
    drawn = [tasks[i] for i in order.take(4, 4)]
    if rounds:  # draw until two varied groups are in: all four at worst
        last = max(i for i, t in enumerate(drawn) if t.instruction in varied)
        expected = drawn[:last + 1]
    else:
        expected = drawn[:2]
    traces = list(TraceStore(tmp_path / "run" / "traces").read())
    assert len(traces) == 2 * len(expected)  # every group rolled out is recorded, kept or not
    assert sorted({t.task_id for t in traces}) == sorted(t.id for t in expected)
    assert record["rolled_groups"] == len(expected)
    uniform = sum(t.instruction not in varied for t in expected)
    assert record["uniform_groups"] == pytest.approx(uniform / len(expected))
    assert record["rollout_s"] > 0 and record["update_s"] > 0  # where the step's time went
    trained = 2 * (2 if rounds else 2 - uniform)  # runs in the update: kept groups x k
    scores = {t.task_id: t.reward("task") for t in traces}
    assert all(scores[t.id] is not None for t in expected)
    varied_rewards = [sorted(t.reward("task").value for t in traces if t.task_id == task.id) for task in expected
                      if task.instruction in varied]
    assert all(r[0] < r[1] for r in varied_rewards)  # their runs really scored differently
    assert record["segments"] >= trained  # every kept run's act turns at least


def test_a_fidelity_reward_no_rollout_could_earn_is_refused():
    """It scores rehearsals whose call really ran: none do in simulated mode, nor in mixed mode unless the
    gate rehearses reads (writes are simulated there)."""
    from envace_mcp.errors import UserError
    from envace_mcp.train.config import GRPOConfig, check_rollout_mode

    fidelity = GRPOConfig(experimental={"fidelity_weight": 0.5})
    for mode, rehearse in [("simulated", "all"), ("mixed", "writes")]:
        with pytest.raises(UserError, match="fidelity_weight rewards rehearsals whose call really ran"):
            check_rollout_mode(fidelity, mode, GateConfig(rehearse=rehearse))
    check_rollout_mode(fidelity, "mixed", GateConfig(rehearse="all"))
    check_rollout_mode(fidelity, "real")
    check_rollout_mode(GRPOConfig(), "simulated")  # off: nothing to refuse
    with pytest.raises(UserError, match="real_output_ce teaches real tool outputs"):
        check_rollout_mode(GRPOConfig(experimental={"real_output_ce": 0.1}), "simulated")


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_a_call_f1_reward_gives_signal_to_a_group_that_failed_the_task_alike(tmp_path, bank_catalog, weight):
    """Both runs of a sell-all task stop before the order, so both score alike on the task; one made the
    task's first reference call (`get_positions`) and one made none. Every rollout records its tool-call
    F1 (`call_f1`); with `call_f1_weight` the group carries signal (the step trains on it), without it the
    group is uniform."""

    from envace_mcp.envs.reference import reference_roles
    from envace_mcp.policy.forced import ForcedPolicy
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.trainer import GRPOConfig

    suite = get_suite("bank")
    task = next(t for t in suite.split("fit") if t.kind == "sell_all")
    assert [a.tool for a in task.actions] == ["get_positions", "place_order"]
    roles = reference_roles(suite, task)
    starts = []

    def act(request):
        if request.messages:
            return "Done."
        starts.append(1)
        return roles["act"](request) if len(starts) % 2 else "Done."  # the reference read, or nothing

    config = GRPOConfig(lr=1e-3, steps=1, groups_per_step=1, experimental={"call_f1_weight": weight},
                        performance={"micro_batch": 8})
    trainer = tiny_trainer(tmp_path, config, [task], bank_catalog, max_steps=3)
    trainer.policy = ForcedPolicy(trainer.policy, act=act, rehearse=roles["rehearse"])
    record = trainer.run()[0]
    traces = list(TraceStore(tmp_path / "run" / "traces").read())
    assert len({t.reward("task").value for t in traces}) == 1  # alike on the task
    assert sorted(t.reward("call_f1").value for t in traces) == [0.0, pytest.approx(2 / 3)]  # 1 of 2 calls, none made
    assert record["call_f1"] == pytest.approx(1 / 3)
    assert record["uniform_groups"] == (0.0 if weight else 1.0)
    assert (record["scored_tokens"] > 0) == bool(weight)  # only the shaped group's tokens went through the model


def test_call_f1_weight_refuses_runs_that_carry_no_call_f1():
    """Runs recorded without a task's reference calls (a user's own agent, older traces) cannot be shaped."""
    from types import SimpleNamespace

    from envace_mcp.errors import UserError
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.config import GRPOConfig
    from envace_mcp.train.sources import trainable_groups

    fixtures = list(TraceStore(__import__("pathlib").Path(__file__).parent.parent / "fixtures" / "traces").read())
    assert fixtures and all(t.reward("call_f1") is None for t in fixtures)
    assert trainable_groups(fixtures, SimpleNamespace(config=GRPOConfig()))  # off: trained as before
    with pytest.raises(UserError, match=r"call_f1_weight adds each run's tool-call F1 .* have no 'call_f1' reward"):
        trainable_groups(fixtures, SimpleNamespace(config=GRPOConfig(experimental={"call_f1_weight": 0.5})))

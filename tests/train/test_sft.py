"""SFT from recorded runs on the tiny Qwen3: rows, targets from real results, loss going down."""

import json
from pathlib import Path

import pytest

from envace_mcp.traces import TraceStore
from envace_mcp.train.sft import SFTConfig, real_result_text, sft_loss, sft_rows, steps_per_epoch, train_sft

FIXTURES = Path(__file__).parent.parent / "fixtures" / "traces"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.testing import build_tiny_qwen3

    folder = build_tiny_qwen3(tmp_path_factory.mktemp("tiny"))
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder), folder


def test_rows_take_act_turns_of_successful_runs_and_rehearsals_aimed_at_real_results(tiny):
    _, tokenizer, _ = tiny
    traces = list(TraceStore(FIXTURES).read())
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = sft_rows(traces, encode, tokenizer.eos_token_id)
    successful = {t.run_id for t in traces if t.reward("task").value == 1.0}
    assert {r.run_id for r in rows if r.role == "act"} == successful
    rehearse = [r for r in rows if r.role == "rehearse"]
    assert rehearse and all(r.completion_ids[-1] == tokenizer.eos_token_id for r in rehearse)
    tool = next(s for t in traces for s in t.steps if s.role == "tool")
    text = tokenizer.decode(rehearse[0].completion_ids[:-1])
    assert text == real_result_text(tool.result)
    assert json.loads(text.removeprefix("<execution_result>").removesuffix("</execution_result>"))["amount"] == 420.0


def test_error_results_become_execution_error_targets():
    text = real_result_text({"is_error": True, "content": [{"type": "text", "text": "Insufficient funds"}]})
    assert json.loads(text[len("<execution_result>"):-len("</execution_result>")]) == {
        "error_tool_call": {"code": "EXECUTION_ERROR", "message": "Insufficient funds"}}


def test_sft_lowers_the_loss_on_target_tokens(tiny):
    from transformers import AutoModelForCausalLM

    _, tokenizer, folder = tiny
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = sft_rows(TraceStore(FIXTURES).read(), encode, tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_pretrained(folder)
    before = float(sft_loss(model, rows, tokenizer.pad_token_id))
    seen = []
    config = SFTConfig(epochs=12, lr=1e-2, batch_size=2, lora=False)
    trained = train_sft(model, rows, tokenizer.pad_token_id, config, on_step=seen.append)
    after = float(sft_loss(trained, rows, tokenizer.pad_token_id))
    assert after < before * 0.5 and len(seen) == 12 * steps_per_epoch(rows, config)


def _run_rows(sizes):
    """Synthetic rows of runs with `sizes` turns each: one task prompt per run, each turn's prompt
    extending the last (as a trajectory's do)."""
    from envace_mcp.train.rows import Segment

    rows = []
    for run, n in enumerate(sizes):
        prompt = [1] * 20 + [100 + run] * 5
        for turn in range(n):
            rows.append(Segment(run_id=f"r{run}", task_id=f"t{run}", group_id=None, role="act",
                                prompt_ids=list(prompt), completion_ids=[7, 8, 9], old_logprobs=None, reward=1.0))
            prompt = prompt + [7, 8, 9] + [50 + turn] * 4
    return rows


def test_sft_batches_hold_whole_runs_and_cut_only_runs_longer_than_a_batch():
    import random

    from envace_mcp.train.sft import batches

    rows = _run_rows([3, 4, 2, 9, 1, 5])
    chunks = batches(rows, 6, random.Random(0), share_prefix=True)
    assert sorted(i for c in chunks for i in c) == list(range(len(rows)))
    assert all(len(c) <= 6 for c in chunks)
    runs_of = [{rows[i].run_id for i in c} for c in chunks]
    split = {r for r in {row.run_id for row in rows} if sum(r in runs for runs in runs_of) > 1}
    assert split == {"r3"}  # the 9-turn run alone spans two batches
    assert steps_per_epoch(rows, SFTConfig(batch_size=6)) == len(chunks)


def test_micro_batches_close_between_runs_when_a_run_would_not_fit():
    from envace_mcp.train.rows import collate, micro_batches, prefix_order

    rows = _run_rows([3, 3, 3])
    ordered = [rows[i] for i in prefix_order(rows)]
    one_run = collate(ordered[:3], share_prefix=True).input_ids.numel()
    passes = micro_batches(ordered, 0, int(one_run * 1.5))  # one run fits, two do not
    assert [{ordered[i].run_id for i in p} for p in passes] == [{"r0"}, {"r1"}, {"r2"}]
    assert len(micro_batches(ordered, 0, one_run // 2)) > 3  # a run no pass holds is cut row by row


def test_lora_sft_trains_only_the_adapter_and_saves_it(tiny, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    _, tokenizer, folder = tiny
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = sft_rows(TraceStore(FIXTURES).read(), encode, tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_pretrained(folder)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    before = float(sft_loss(model, rows, tokenizer.pad_token_id))
    trained = train_sft(model, rows, tokenizer.pad_token_id, SFTConfig(epochs=2, lr=1e-2, batch_size=2),
                        out=tmp_path / "adapter")
    assert float(sft_loss(trained, rows, tokenizer.pad_token_id)) < before
    frozen = trained.get_base_model()
    assert all(torch.equal(base[n], p) for n, p in frozen.named_parameters() if "lora_" not in n and n in base)
    assert (tmp_path / "adapter" / "adapter_config.json").exists()


def test_reference_runs_with_the_models_own_rehearsals_measure_the_world_model(tiny, tmp_path):
    """Forced reference actions, the model's own rehearsals, every call really run and compared."""
    import anyio

    from envace_mcp.envs import get_suite
    from envace_mcp.policy import SamplingParams, load_policy
    from envace_mcp.lab.reference import record_reference_traces

    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "fund_and_buy")  # two writes
    policy = load_policy(str(tiny[2]))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    written = anyio.run(lambda: record_reference_traces(policy, "bank", tmp_path, split="test", only={task.id},
                                                        score=False, own_rehearsals=True,
                                                        sampling={"act": greedy, "rehearse": greedy}))
    trace = next(TraceStore(tmp_path).read())
    assert written == 1 and trace.reward("task").value == 1.0  # the random model's guesses stopped nothing
    tools = [s for s in trace.steps if s.role == "tool"]
    assert [s.tool for s in tools] == [a.tool for a in task.actions] and not any(s.simulated for s in tools)
    assert all(s.comparison is not None and s.comparison.score == 0.0 for s in tools)  # random model: wrong
    rehearsals = [s for s in trace.steps if s.role == "rehearse"]
    assert all(len(s.completion_ids) <= 8 and s.logprobs for s in rehearsals)  # sampled by the model itself


def test_rehearse_rows_learn_only_what_the_environment_said_never_the_gates_refusals(tiny):
    """A call the gate stopped has a tool step too, holding the gate's message ("Not executed
    (block): ..."); a world model trained on it would learn to predict the gate, not the server."""
    import anyio

    from envace_mcp.envs import get_suite
    from envace_mcp.envs.reference import calls_made, reference_roles
    from envace_mcp.graph import GateConfig, create_envace_graph
    from envace_mcp.policy import load_policy
    from envace_mcp.policy.forced import ForcedPolicy
    from envace_mcp.policy.prompts import tool_call_text
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.train.forced_runs import forced_run

    _, tokenizer, folder = tiny
    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "transfer_funds")
    right = task.actions[0]
    wrong = {**right.arguments, "amount": right.arguments["amount"] * 100}
    reference = reference_roles(suite, task)

    def act(request):
        turns = [tool_call_text("transfer", wrong), tool_call_text("transfer", right.arguments), task.answer]
        return turns[calls_made(request.messages)]

    def rehearse(request):  # the world model foresees the overdraft, so the gate blocks it
        if request.call.arguments["amount"] == wrong["amount"]:
            return '<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", "message": "Insufficient funds"}}</execution_result>'
        return reference["rehearse"](request)

    async def run():
        async with Toolbox({"bank": suite.build_server()}) as toolbox:
            policy = ForcedPolicy(load_policy(str(folder)), act=act, rehearse=rehearse)
            gate = GateConfig(rehearse="all", block_destructive_on_predicted_failure=True)
            return await forced_run(create_envace_graph().compile(), toolbox, suite, task, policy, gate)

    _, _, trace = anyio.run(run)
    tools = trace.steps_of("tool")
    assert [s.decision for s in tools] == ["block", "execute"] and [s.ran for s in tools] == [False, True]
    assert "Not executed" in str(tools[0].result) and len(trace.steps_of("rehearse")) == 2
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = sft_rows([trace], encode, tokenizer.eos_token_id, roles=("rehearse",))
    assert len(rows) == 1
    assert tokenizer.decode(rows[0].completion_ids[:-1]) == real_result_text(tools[1].result)

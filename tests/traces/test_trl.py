"""TRL rows: recorded runs as TRL's conversational dataset with tools. Runs are recorded against the bank
server in-process with a real transformers policy (the tiny Qwen3, its turns forced so they are known), and
the rows are checked the way a trainer reads them: loaded with `datasets`, re-rendered through the model's
chat template, token ids compared with the ones the run recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import datasets
import pytest
from langchain_core.messages import HumanMessage

from envace_mcp.envs import Episode, get_suite
from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.policy import load_policy
from envace_mcp.policy.forced import ForcedPolicy
from envace_mcp.policy.prompts import prompt_text, tool_call_text
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import Reward, Trace, TraceStore, record_run
from envace_mcp.traces.trl import to_trl, write_trl

FAILS = ('<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", '
         '"message": "savings would drop below the $500 minimum"}}</execution_result>')
POLICY = "Never let a savings account drop below $500."
SUITE = get_suite("bank")
TASK = next(t for t in SUITE.split("test") if t.kind == "savings_minimum")
ME = TASK.initial_state["customer_id"]
SAVINGS = next(a["id"] for a in TASK.initial_state["accounts"].values() if a["owner"] == ME and a["type"] == "savings")
READ = tool_call_text("get_balance", {"account_id": SAVINGS})  # as the template writes a call: what Qwen3 writes


@pytest.fixture(scope="module")
def tiny(tiny_qwen3_dir):
    return load_policy(str(tiny_qwen3_dir))


def bank_run(tiny, turns: list[str], instructions: str | None = None) -> Trace:
    """The savings-minimum task with the act turns `turns`, tokenised and scored by the tiny model; writes
    are rehearsed (to fail: the gate blocks them), reads run."""
    script = iter(turns)
    policy = ForcedPolicy(tiny, act=lambda request: next(script), rehearse=lambda request: FAILS)

    async def run() -> Trace:
        async with Toolbox({"bank": SUITE.build_server()}) as toolbox:
            context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(Episode(TASK, "bank").meta),
                                    gate=GateConfig(require_approval="never", rehearse="writes"),
                                    instructions=instructions)
            _, trace = await record_run(create_envace_graph().compile(),
                                        {"messages": [HumanMessage(content=TASK.instruction)]}, context=context,
                                        task_id=TASK.id, suite="bank", group_id="g")
        return trace

    return anyio.run(run)


@pytest.fixture(scope="module")
def clean(tiny) -> Trace:
    """Every call ran: a read, a call the parser cannot read (the graph says so), another read, the answer."""
    trace = bank_run(tiny, [READ, '<tool_call>\n{"name": "get_balance", "arguments": \n</tool_call>',
                            tool_call_text("list_accounts", {"customer_id": ME}), "Savings hold enough."],
                     instructions=POLICY)
    trace.rewards.append(Reward(name="task", value=1.0))
    return trace


@pytest.fixture(scope="module")
def stopped(tiny) -> Trace:
    """A read and the trap transfer in one turn: the transfer is rehearsed to fail and blocked."""
    return bank_run(tiny, [READ + "\n" + tool_call_text("transfer", TASK.trap.arguments), "Savings must keep $500."])


def tokenless(trace: Trace) -> Trace:
    """The run as a model of your own records it (the drop-ins): turns without prompts or tokens."""
    steps = [s.model_copy(update={"prompt_text": None, "prompt_ids": None, "completion_ids": None, "logprobs": None})
             for s in trace.steps]
    return trace.model_copy(update={"run_id": f"{trace.run_id}-bare", "steps": steps})


@pytest.fixture(scope="module")
def loaded(clean, stopped, tmp_path_factory) -> list[dict]:
    """The rows as a trainer reads them: the exported file through `datasets`."""
    path = tmp_path_factory.mktemp("trl") / "runs.jsonl"
    assert write_trl([clean, stopped, tokenless(clean)], path) == 3
    return list(datasets.load_dataset("json", data_files=str(path), split="train"))


def template_turn(tokenizer, messages: list[dict], tools: list[dict]) -> str:
    """The last message of `messages` (an assistant turn) as the chat template writes it after the rest."""
    before = tokenizer.apply_chat_template(messages[:-1], tools=tools, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    assert whole.startswith(before)
    return whole[len(before):]


def test_a_run_is_a_row_of_its_conversation_its_tools_its_rewards_and_ids(clean, loaded):
    row = loaded[0]
    assert (row["run_id"], row["task_id"], row["group_id"], row["mode"]) == (clean.run_id, TASK.id, "g", "real")
    assert row["rewards"] == {"task": 1.0} and row["stopped_calls"] == 0
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant"]
    system, user, call, reply, broken, reminder, *_ = row["messages"]
    assert system["content"].endswith(f"# Policy\n{POLICY}") and user["content"] == TASK.instruction
    [tool_call] = call["tool_calls"]
    assert tool_call["type"] == "function" and tool_call["function"] == {"name": "get_balance",
                                                                         "arguments": {"account_id": SAVINGS}}
    assert (reply["tool_call_id"], reply["name"]) == (tool_call["id"], "get_balance") and "8131.92" in reply["content"]
    assert not broken.get("tool_calls") and "could not be read" in reminder["content"]
    assert row["messages"][-1] == {"role": "assistant", "content": "Savings hold enough."}
    assert [t["function"]["name"] for t in row["tools"]] == [t["name"] for t in clean.tools]
    assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in row["tools"])


def test_every_recorded_prompt_and_completion_is_the_rows_conversation_through_the_chat_template(tiny, clean, loaded):
    row, acts = loaded[0], clean.steps_of("act")
    assert [g["message"] for g in row["generations"]] == [2, 4, 6, 8]
    for generation, act in zip(row["generations"], acts):
        messages, tools = row["messages"][:generation["message"] + 1], row["tools"]
        prompt = tiny.tokenizer.encode(prompt_text(tiny.tokenizer, messages[:-1], tools), add_special_tokens=False)
        assert prompt == generation["prompt_ids"] == act.prompt_ids
        written = tiny.tokenizer.encode(template_turn(tiny.tokenizer, messages, tools), add_special_tokens=False)
        completion = generation["completion_ids"]
        assert completion == act.completion_ids and written[:len(completion)] == completion  # then the template's "\n"
        # `datasets` rewrites rows holding free-form JSON with 10 decimals: far below a float32 logprob's precision
        assert generation["logprobs"] == pytest.approx(act.logprobs, abs=1e-9, rel=0)
        assert generation["temperature"] == act.sampling["temperature"] and generation["finish_reason"] == "stop"


def test_a_call_the_gate_stopped_is_not_in_the_messages_and_is_counted(tiny, stopped, loaded):
    row = loaded[1]
    assert row["stopped_calls"] == 1 and [s.decision for s in stopped.steps_of("gate")] == ["execute", "block"]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert [c["function"]["name"] for c in row["messages"][2]["tool_calls"]] == ["get_balance"]
    assert not any("Not executed" in (m["content"] or "") for m in row["messages"])
    first, second = row["generations"]
    prompt = prompt_text(tiny.tokenizer, row["messages"][:2], row["tools"])
    assert tiny.tokenizer.encode(prompt, add_special_tokens=False) == first["prompt_ids"]
    # the tokens stay what the model saw and wrote: the transfer it proposed, the gate's refusal after it
    assert '"transfer"' in tiny.tokenizer.decode(first["completion_ids"])
    assert "Not executed (block)" in tiny.tokenizer.decode(second["prompt_ids"])


def test_a_run_without_token_ids_exports_its_messages_only(clean, loaded):
    row = loaded[2]
    assert row["generations"] == [] and row["run_id"] == f"{clean.run_id}-bare"
    assert row["messages"] == loaded[0]["messages"][1:]  # no act prompt recorded: no system prompt known to be shown


def test_instructions_the_trace_did_not_record_leave_the_system_prompt_out(clean):
    older = clean.model_copy(update={"metadata": {k: v for k, v in clean.metadata.items() if k != "instructions"}})
    assert to_trl(clean)["messages"][0]["role"] == "system"
    assert to_trl(older)["messages"][0] == {"role": "user", "content": TASK.instruction}


def test_trls_data_utilities_take_a_row_and_split_each_turn_where_the_model_wrote_it(tiny, loaded):
    data_utils = pytest.importorskip("trl.data_utils")
    row = loaded[0]
    assert data_utils.is_conversational(row)
    text = data_utils.maybe_apply_chat_template(row, tiny.tokenizer, tools=row["tools"])["text"]
    assert text == tiny.tokenizer.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
    for generation in row["generations"]:
        at = generation["message"]
        pair = {"prompt": row["messages"][:at], "completion": [row["messages"][at]]}
        completion = data_utils.apply_chat_template(pair, tiny.tokenizer, tools=row["tools"])["completion"]
        ids = tiny.tokenizer.encode(completion, add_special_tokens=False)
        assert ids[:len(generation["completion_ids"])] == generation["completion_ids"]


def test_envace_traces_export_writes_trl_rows(clean, stopped, tmp_path):
    store = TraceStore(tmp_path / "traces")
    for trace in (clean, stopped):
        store.append(trace)
    out = tmp_path / "rows.jsonl"
    done = subprocess.run([sys.executable, "-m", "envace_mcp.cli", "traces", "export", str(tmp_path / "traces"),
                           "--format", "trl", "--out", str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "wrote 2 run(s)" in done.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["run_id"], r["stopped_calls"]) for r in rows] == [(clean.run_id, 0), (stopped.run_id, 1)]
    assert [g["logprobs"] for g in rows[0]["generations"]] == [s.logprobs for s in clean.steps_of("act")]  # exact

"""The `envace` command, run as users run it (a subprocess)."""

import json
import subprocess
import sys

from helpers import TESTS

ENVACE = [sys.executable, "-m", "envace_mcp.cli"]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*ENVACE, *args], capture_output=True, text=True, timeout=timeout,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


def test_servers_ls_prints_both_bundled_catalogs_as_json():
    out = run("servers", "ls", "--json")
    assert out.returncode == 0, out.stderr
    catalog = {t["name"]: t for t in json.loads(out.stdout)}
    assert catalog["transfer"]["annotations"]["destructive"] is True
    assert catalog["get_order"]["annotations"]["read_only"] is True
    assert catalog["return_items"]["output_schema"]["title"] == "Order"


def test_demo_replays_a_reference_solution_over_stdio_and_prints_the_checker_score():
    out = run("demo", "--reference")
    assert out.returncode == 0, out.stderr
    assert "Task bank/test/" in out.stdout and "checker score: 1.00" in out.stdout
    assert "place_order" in out.stdout and "destructive" in out.stdout


def test_demo_runs_the_embedded_agent_end_to_end_with_a_checker_score(tmp_path):
    out = run("demo", "--limits", "max_steps=2", "--traces", str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stderr
    assert "Task bank/test/0000" in out.stdout and "agent" in out.stdout
    score = float(out.stdout.rsplit("checker score:", 1)[1].split()[0])
    assert 0.0 <= score <= 1.0 and "✓ state" in out.stdout  # a read-only task: state untouched
    assert "\nsummary\n" in out.stdout and "calls proposed" in out.stdout and "approvals:" in out.stdout
    # the gate starts from what the shipped adapter recommends, and says so
    assert "gate from the adapter's envace.json: on_unusable=block" in out.stdout
    from envace_mcp.traces import TraceStore

    [trace] = list(TraceStore(tmp_path).read())  # recorded, with the checker's score attached
    assert trace.task_id == "bank/test/0000" and trace.reward("task").value == score
    assert trace.steps[0].role == "act" and trace.steps[0].prompt_ids
    assert trace.gate["on_unusable"] == "block"  # and the run recorded it
    assert trace.gate["require_approval"] == "destructive"  # the interactive default still under it
    assert trace.limits["max_steps"] == 2 and trace.sampling["rehearse"]["max_new_tokens"] == 400


def test_run_prints_a_transcript_and_rejects_bad_gate_settings():
    out = run("run", "What is the balance of CHK-9995?", "--max-new-tokens", "16", "--limits", "max_steps=1",
              "-c", "constrain_calls=true", timeout=600)
    # one turn, cut at 16 tokens inside its call: the run ends without an answer, says why, and exits 1
    assert out.returncode == 1, out.stderr
    assert "final answer: none: the agent used its 1 turn without answering" in out.stdout
    bad = run("run", "x", "--gate", "bogus=1")
    assert bad.returncode == 2 and "unknown setting 'bogus'" in bad.stderr
    vllm = run("run", "x", "--model", "vllm:http://127.0.0.1:9/v1", "-c", "constrain_calls=true")
    assert vllm.returncode == 2 and "transformers backend" in vllm.stderr


def test_a_second_adapter_for_the_rehearse_role_is_named_in_the_trace_and_its_gate_is_trusted(tiny_qwen3_dir, tmp_path):
    """The trace names both adapters; the gate starts from what the world model's adapter recommends (how
    far to trust its rehearsals), not the agent's, whose world model this run does not use."""
    from helpers import random_lora

    from envace_mcp.traces import TraceStore

    agent, world = random_lora(tiny_qwen3_dir, tmp_path / "agent", 0), random_lora(tiny_qwen3_dir, tmp_path / "world", 1)
    (agent / "envace.json").write_text(json.dumps({"gate": {"block_destructive_on_unusable_rehearsal": True}}))
    (world / "envace.json").write_text(json.dumps({"gate": {"min_failure_confidence": 0.7}}))
    unmeasured = run("run", "x", "--model", str(tiny_qwen3_dir), "--world-model", str(world))
    assert unmeasured.returncode == 2 and "has no report (trust.json): measure it first" in unmeasured.stderr
    (world / "trust.json").write_text(json.dumps({"tools": {"get_balance": {"stop": True}}}))
    out = run("run", "What is the balance of CHK-9995?", "--model", str(tiny_qwen3_dir), "--adapter", str(agent),
              "--world-model", str(world), "--max-new-tokens", "8", "--limits", "max_steps=1",
              "--traces", str(tmp_path / "traces"), timeout=300)
    assert out.returncode == 0, out.stderr
    (trace,) = TraceStore(tmp_path / "traces").read()
    assert trace.model == f"{tiny_qwen3_dir} + rehearse adapter {world}"
    assert "gate from the rehearse adapter's envace.json: min_failure_confidence=0.7" in out.stdout
    assert trace.gate["min_failure_confidence"] == 0.7 and trace.gate["on_unusable"] == "allow"
    # the world model's table, re-checked: a hand-written `stop` fails closed, but is not believed, and says why
    assert trace.gate["trust"] == {"get_balance": {"believe_failures": False, "min_p_error": None, "fail_closed": True,
                                                   "skip_approval": False, "server": None, "behaviour": None}}
    assert "'get_balance' claims believe_failures, not believed: the table is bound to no weights" in out.stdout


def test_demo_over_http_for_retail():
    out = run("demo", "--reference", "--domain", "retail", "--transport", "http")
    assert out.returncode == 0, out.stderr
    assert "checker score: 1.00" in out.stdout


def test_call_prints_errors_as_data_with_a_failing_exit_code(tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"bank": {"command": sys.executable,
                                                          "args": ["-P", "-m", "envace_mcp.servers.bank"]}}}))
    out = run("call", "transfer", '{"from_account_id": "A", "amount": -3}', "--servers", str(config))
    assert out.returncode == 1
    result = json.loads(out.stdout)
    assert result["error_kind"] == "invalid_arguments" and result["structured_content"]["field"] == "to_account_id"


def test_bad_input_gets_a_clear_message_not_a_traceback(tmp_path):
    missing = run("servers", "ls", "--servers", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    unknown = run("tasks", "show", "bank/test/9999")
    assert unknown.returncode == 2 and "no task" in unknown.stderr


def test_tasks_ls_lists_a_split():
    out = run("tasks", "ls", "retail", "--split", "test", "--limit", "3")
    assert out.returncode == 0 and out.stdout.count("retail/test/") == 3


EXAMPLES = TESTS.parent / "examples"


def example(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=600)


def test_the_toolbox_example_runs():
    out = example("toolbox_quickstart.py")
    assert out.returncode == 0, out.stderr
    assert "'balance':" in out.stdout and "bad transfer -> invalid_arguments" in out.stdout


def test_the_graph_and_drop_in_examples_run_with_the_embedded_model():
    graph = example("envace_graph.py", "--max-new-tokens", "16")
    assert graph.returncode == 0, graph.stderr
    assert "checker score:" in graph.stdout
    node = example("rehearsing_tool_node.py")
    assert node.returncode == 0, node.stderr
    assert "transfer: rehearsal=" in node.stdout and "decision=" in node.stdout
    middleware = example("create_agent_middleware.py")
    assert middleware.returncode == 0, middleware.stderr
    assert "transfer: rehearsal=" in middleware.stdout and "checker score:" in middleware.stdout


def test_policy_try_prints_the_embedded_models_rehearsal_beside_the_real_result():
    out = run("policy", "try", "--role", "rehearse", "--server", "bank", "--tool", "transfer", timeout=600)
    assert out.returncode == 0, out.stderr
    assert "rehearsed by SmolLM2-135M-Instruct (embedded)" in out.stdout and "real result from bank" in out.stdout
    assert "fidelity:" in out.stdout and '"to_balance"' in out.stdout


def test_the_embedded_model_comes_with_its_shipped_adapter_unless_told_none():
    from envace_mcp.policy.embedded import EMBEDDED_ADAPTER
    from envace_mcp.policy.embedded import default_adapter as _adapter  # what the CLI and the served graph use

    assert _adapter(None, None) == str(EMBEDDED_ADAPTER)  # embedded model: the shipped adapter
    assert _adapter(None, "none") is None and _adapter(None, "None") is None
    assert _adapter("some/model", None) is None  # another model: nothing stacked on it unasked
    assert _adapter("some/model", "my-adapter") == "my-adapter" == _adapter(None, "my-adapter")


def test_eval_off_a_terminal_prints_plain_progress_lines_and_no_library_noise(tmp_path):
    out = subprocess.run([*ENVACE, "eval", "--suite", "bank", "--policy", "reference", "--limit", "3",
                          "--out", str(tmp_path / "eval")], capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "ENVACE_PROGRESS_INTERVAL": "3600"})
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("[eval ")]
    assert lines[0].endswith("0/3 (0%)  elapsed 0s")
    assert "3/3 (100%)  passed 3/3  mean score 1" in lines[-1] and lines[-1].endswith("done")
    assert out.stderr == ""

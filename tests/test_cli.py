"""The `envace` command, run as users run it (a subprocess)."""

import json
import subprocess
import sys

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


def test_demo_solves_a_test_task_over_stdio_and_prints_the_checker_score():
    out = run("demo")
    assert out.returncode == 0, out.stderr
    assert "Task bank/test/" in out.stdout and "checker score: 1.00" in out.stdout
    assert "place_order" in out.stdout and "destructive" in out.stdout


def test_demo_over_http_for_retail():
    out = run("demo", "--domain", "retail", "--transport", "http")
    assert out.returncode == 0, out.stderr
    assert "checker score: 1.00" in out.stdout


def test_call_prints_errors_as_data_with_a_failing_exit_code(tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"bank": {"command": sys.executable,
                                                          "args": ["-m", "envace_mcp.servers.bank"]}}}))
    out = run("call", "transfer", '{"from_account_id": "A", "amount": -3}', "--servers", str(config))
    assert out.returncode == 1
    result = json.loads(out.stdout)
    assert result["error_kind"] == "invalid_arguments" and result["structured_content"]["field"] == "to_account_id"


def test_bad_input_gets_a_clear_message_not_a_traceback(tmp_path):
    missing = run("servers", "ls", "--servers", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stdout and "Traceback" not in missing.stderr
    unknown = run("tasks", "show", "bank/test/9999")
    assert unknown.returncode == 2 and "no task" in unknown.stdout


def test_tasks_ls_lists_a_split():
    out = run("tasks", "ls", "retail", "--split", "test", "--limit", "3")
    assert out.returncode == 0 and out.stdout.count("retail/test/") == 3


def test_the_toolbox_example_runs():
    from pathlib import Path

    example = Path(__file__).parent.parent / "examples" / "toolbox_quickstart.py"
    out = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'balance':" in out.stdout and "bad transfer -> invalid_arguments" in out.stdout


def test_policy_try_prints_the_embedded_models_rehearsal_beside_the_real_result():
    out = run("policy", "try", "--role", "rehearse", "--server", "bank", "--tool", "transfer",
              "--max-new-tokens", "24", timeout=600)
    assert out.returncode == 0, out.stderr
    assert "rehearsed by SmolLM2-135M-Instruct (embedded)" in out.stdout and "real result from bank" in out.stdout
    assert "fidelity:" in out.stdout and '"to_balance"' in out.stdout

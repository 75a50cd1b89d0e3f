"""Bad command lines, run through the real `envace` entry point: one `error:` line naming what was
wrong, exit code 2, and nothing heavy started (no model: neither torch nor transformers imported; a
GRPO config is checked by its pydantic model, whose module needs torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# Runs the CLI as `python -m envace_mcp.cli` does, and notes at exit which heavy modules were imported.
WRAPPER = """
import atexit, os, runpy, sys
atexit.register(lambda: open(os.environ["LOADED"], "w").write(
    " ".join(m for m in ("torch", "transformers") if m in sys.modules)))
sys.argv[0] = "envace"
runpy.run_module("envace_mcp.cli", run_name="__main__")
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input")
    (root / "a-file").write_text("not a folder")
    (root / "folder").mkdir()
    for name, gate in {"approving-adapter": {"require_approval": "never"},
                       "maybe-adapter": {"on_unusable": "maybe"}}.items():
        (root / name).mkdir()  # an adapter folder whose envace.json recommends a gate it may not
        (root / name / "envace.json").write_text(json.dumps({"tool_format": "compact", "gate": gate}))
    (root / "torn-adapter").mkdir()  # an adapter whose envace.json was cut off mid-write
    (root / "torn-adapter" / "envace.json").write_text('{"tool_format": "comp')
    (root / "torn-grpo.json").write_text(json.dumps({"adapter": str(root / "torn-adapter")}))
    (root / "broken.json").write_text("{not json")
    (root / "no-servers.json").write_text(json.dumps({"mcpServers": {}}))
    (root / "grpo.json").write_text(json.dumps({"colour": "blue"}))
    (root / "fidelity.json").write_text(json.dumps({"fidelity_weight": 0.5}))  # simulated mode: nothing to earn it
    for started in ("started", "started-too"):  # a GRPO run started with k=4 that a resume must match: two
        # alike, since the cases run two at a time and each holds its --out while it checks it
        (root / started / "checkpoint").mkdir(parents=True)
        # (its setup.json of the first form, which named some flags only)
        (root / started / "setup.json").write_text(json.dumps(
            {"traces": None, "suite": "bank", "split": "train", "k": 4, "mode": "simulated", "kinds": None,
             "max_new_tokens": 128, "rehearse_max_new_tokens": None}))
    from envace_mcp.traces import Trace, TraceStore

    mixed = TraceStore(root / "mixed")  # runs whose act prompts wrote tools in two formats
    for fmt in ("json", "compact"):
        mixed.append(Trace(run_id=fmt, started_at=0.0, metadata={"tool_format": fmt}))
    from envace_mcp.traces import Reward, Step

    (root / "f1.json").write_text(json.dumps({"call_f1_weight": 0.5}))
    for name, logprobs in {"hosted": None, "unshaped": [-0.5]}.items():  # a chat model's act turn; a scored one
        act = Step(index=0, role="act", time=0.0, prompt_ids=[1, 2], completion_ids=[3], logprobs=logprobs)
        TraceStore(root / name).append(Trace(run_id=name, started_at=0.0, model=name, steps=[act],
                                             rewards=[Reward(name="task", value=1.0)]))
    return root


# (arguments, a fragment the one error line must contain); {f} is the folder of the fixture files
BAD = [
    (["eval", "--suite", "bank", "--out", "{f}/out", "--limit", "-1"], "'--limit'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--limit", "0"], "'--limit'"),
    (["eval", "--suite", "bank", "--out", "{f}/a-file"], "'--out'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--repeats", "0"], "'--repeats'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "-c", "concurrency=0"], "concurrency must be greater than or equal to 1"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--mode", "dreamy"], "'--mode'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--split", "dev"], "'--split'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "-c", "transport=pigeon"], "transport must be 'inprocess', 'stdio' or 'http'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "-c", "concurency=2"], "unknown setting 'concurency'; did you mean 'concurrency'?"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "-c", "{f}/broken.json"], "not a readable JSON settings file"),
    (["eval", "--out", "{f}/out"], "suite is required"),
    (["eval", "--suite", "nosuch", "--out", "{f}/out"], "unknown suite 'nosuch'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--task", "bank/test/9999"], "no task 'bank/test/9999'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--adapter", "{f}/missing"], "'--adapter'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--world-model", "{f}/a-file"], "'--world-model'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--compare", "colour=blue"], "--compare: unknown setting 'colour'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--compare", "split=train"], "split cannot differ"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--gate", "max_steps=8"], "it is a run limit"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--limits", "max_steps=abc"], "max_steps must be a valid integer"),
    (["run", "x", "--servers", "{f}/folder"], "'--servers'"),
    (["run", "x", "--servers", "/nonexistent.json"], "does not exist"),
    (["run", "x", "--servers", "{f}/broken.json"], "not valid JSON"),
    (["run", "x", "--servers", "{f}/no-servers.json"], "no servers configured"),
    (["run", "x", "--limits", "max_steps=abc"], "--limits: max_steps must be a valid integer"),
    (["run", "x", "--limits", "max_steps=0"], "--limits: max_steps must be greater than or equal to 1, not '0'"),
    (["run", "x", "--limits", "max_steps"], "needs a value"),
    (["run", "x", "--gate", "max_steps=3"], "'max_steps' is not a setting of GateConfig: it is a run limit"),
    (["run", "x", "--gate", "rehearse=some"], "rehearse must be 'all', 'writes' or 'none', not 'some'"),
    (["run", "x", "--gate", "approve_blocked=perhaps"], "approve_blocked must be a valid boolean"),
    (["run", "x", "--gate", "min_failure_confidence=1.5"], "min_failure_confidence must be less than or equal to 1"),
    (["run", "x", "--gate", "min_failure_confidence=sure"], "min_failure_confidence must be a valid number"),
    (["run", "x", "--gate", "evidence=[repeated_writes,wishes]"], "evidence must be 'repeated_failures', 'repeated_writes' or 'ungrounded_arguments', not 'wishes'"),
    (["run", "x", "--gate", "on_unusable=maybe"], "on_unusable must be 'allow' or 'block', not 'maybe'"),
    (["run", "x", "--gate", "bogus=1"], "unknown setting 'bogus'"),
    (["run", "x", "--gate", "rehearse"], "needs a value"),
    (["run", "x", "--max-new-tokens", "0"], "'--max-new-tokens'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--compare", "rehearse_max_new_tokens=0"], "rehearse_max_new_tokens must be greater than or equal to 1"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--compare", "mode=dream"], "mode must be 'real', 'simulated' or 'mixed', not 'dream'"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--compare", "rehearse=two"], "rehearse must be a valid integer"),
    (["run", "x", "--model", "./no/such/model"], "'--model'"),
    (["run", "x", "--model", "{f}/a-file"], "'--model'"),
    (["run", "x", "--traces", "{f}/a-file"], "'--traces'"),
    (["run", "x", "--world-model", "{f}/missing"], "'--world-model'"),
    (["run", "x", "--rehearse-adapter", "{f}/missing"], "No such option: --rehearse-adapter; it is --world-model now"),
    (["run", "x", "--rehearse", "2"], "No such option: --rehearse; it is -c rehearse=N now"),
    (["run", "x", "--constrain-calls"], "No such option: --constrain-calls; it is -c constrain_calls=true now"),
    (["run", "x", "-c", "rehearse=-1"], "rehearse must be greater than or equal to 0"),
    (["run", "x", "-c", "constrain_call=true"], "unknown setting 'constrain_call'; did you mean 'constrain_calls'?"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--rehearse", "2"], "No such option: --rehearse; it is -c rehearse=N now"),
    (["train", "sft", "--traces", "{f}/folder", "--out", "{f}/out", "--role", "act"],
     "No such option: --role; it is -c roles=[act] (or [rehearse]) now"),
    (["train", "sft", "--traces", "{f}/folder", "--out", "{f}/out", "-c", "roles=[critique]"],
     "roles must be 'act' or 'rehearse', not 'critique'"),
    (["demo", "--transport", "pigeon"], "'--transport'"),
    (["demo", "--domain", "casino"], "unknown suite 'casino'"),
    (["demo", "--task", "bank/test/9999"], "no task"),
    (["demo", "--limits", "max_steps=0"], "--limits: max_steps must be greater than or equal to 1"),
    (["demo", "--max-steps", "8"], "No such option: --max-steps"),
    (["demo", "--adapter", "{f}/a-file"], "is a file"),
    (["demo", "--adapter", "{f}/approving-adapter"], "recommendation): may set only"),
    (["eval", "--suite", "bank", "--out", "{f}/out", "--adapter", "{f}/torn-adapter"], "envace.json is not JSON"),
    (["train", "grpo", "--out", "{f}/out", "--suite", "bank", "--config", "{f}/torn-grpo.json"], "envace.json is not JSON"),
    (["run", "x", "--adapter", "{f}/maybe-adapter"], "on_unusable must be 'allow' or 'block', not 'maybe'"),
    (["demo", "--bogus"], "No such option: --bogus"),
    (["servers", "serve", "bank", "--port", "99999"], "'--port'"),
    (["servers", "serve", "bank", "--transport", "sse"], "'--transport'"),
    (["servers", "ls", "--servers", "{f}/broken.json"], "not valid JSON"),
    (["call", "get_balance", "[1]"], "must be a JSON object"),
    (["call", "get_balance", "{oops"], "not JSON"),
    (["call", "get_balance", "{}", "--timeout", "0"], "'--timeout'"),
    (["tasks", "ls", "bank", "--limit", "0"], "'--limit'"),
    (["tasks", "ls", "bank", "--split", "dev"], "'--split'"),
    (["tasks", "show", "bank/test/9999"], "no task"),
    (["traces", "ls", "{f}/a-file"], "is a file"),
    (["traces", "stats", "{f}/a-file"], "is a file"),
    (["traces", "ls", "{f}/missing"], "does not exist"),
    (["traces", "ls", "{f}/folder", "--limit", "0"], "'--limit'"),
    (["traces", "show", "abc", "--dir", "{f}/a-file"], "is a file"),
    (["lab", "reference", "{f}/a-file"], "is a file"),
    (["lab", "reference", "{f}/out", "--limit", "-3"], "'--limit'"),
    (["lab", "reference", "{f}/out", "--tool-format", "yaml"], "'--tool-format'"),
    (["lab", "reference", "{f}/out", "--rehearse-format", "dream"], "'--rehearse-format'"),
    (["lab", "sample", "{f}/out", "{f}/missing:3"], "does not exist"),
    (["lab", "sample", "{f}/out", "{f}/hosted", "{f}/mixed:5"], "holds 2 runs, fewer than the 5 asked for"),
    (["lab", "sample", "{f}/out", "{f}/mixed:0"], "N must be at least 1"),
    (["lab", "sample", "{f}/hosted", "{f}/mixed"], "already holds traces"),
    (["lab", "probe", "{f}/out", "--suite", "tau2-airline"], "no sandbox server to probe"),
    (["lab", "probe", "{f}/out", "--suite", "casino"], "unknown suite"),
    (["lab", "probe", "{f}/out", "--per-call", "0"], "'--per-call'"),
    (["lab", "probe", "{f}/out", "--mutations", "typo,bogus"], "--mutations: unknown bogus"),
    (["lab", "probe", "{f}/out", "--mutations", ","], "--mutations: unknown (none given)"),
    (["compare", "{f}/missing", "{f}/folder"], "missing: no readable results.json"),
    (["compare", "{f}/folder", "{f}/folder"], "folder: no readable results.json"),
    (["compare", "{f}/broken.json", "{f}/folder"], "broken.json: no readable results.json (JSONDecodeError"),
    (["compare", "{f}/no-servers.json", "{f}/folder"], "not the results.json of `envace eval`"),
    (["compare", "{f}/folder", "{f}/folder", "--out", "{f}/a-file"], "'--out'"),
    (["policy", "try", "--role", "judge"], "'--role'"),
    (["policy", "try", "--args", "[1, 2]"], "must be a JSON object"),
    (["policy", "try", "--server", "casino"], "unknown suite"),
    (["train", "sft", "--traces", "{f}/missing", "--out", "{f}/out"], "'--traces'"),
    (["train", "sft", "--traces", "{f}/folder", "--out", "{f}/out"], "no recorded runs"),
    (["train", "sft", "--traces", "{f}/folder", "--out", "{f}/out", "--epochs", "0"], "'--epochs'"),
    (["train", "sft", "--traces", "{f}/folder", "--out", "{f}/out", "-c", "lr=0"], "lr must be greater than 0"),
    (["train", "sft", "--traces", "{f}/folder", "--out", "{f}/out", "-c", "performance.micro_tokens=-1"],
     "performance.micro_tokens must be greater than or equal to 1"),
    (["train", "sft", "--traces", "{f}/folder", "--out", "{f}/out", "-c", "performance.micro_token=1"],
     "unknown setting 'micro_token'; did you mean 'micro_tokens'?"),
    (["train", "sft", "--traces", "{f}/folder", "--out", "{f}/out", "--lr", "1e-4"], "No such option: --lr"),
    (["train", "sft", "--traces", "{f}/folder", "--out", "{f}/out", "--adapter", "{f}/folder", "-c", "lora=false"],
     "adapter continues a LoRA adapter, and lora=false trains every weight"),
    (["train", "sft", "--traces", "{f}/mixed", "--out", "{f}/out"], "different tool formats (compact, json)"),
    (["train", "grpo", "--out", "{f}/out"], "exactly one of --traces"),
    (["train", "grpo", "--out", "{f}/out", "--suite", "casino"], "unknown suite"),
    (["train", "grpo", "--out", "{f}/out", "--suite", "bank", "--k", "1"], "'--k'"),
    (["train", "grpo", "--out", "{f}/out", "--suite", "bank", "--steps", "0"], "'--steps'"),
    (["train", "grpo", "--out", "{f}/out", "--suite", "bank", "--config", "{f}/grpo.json"], "unknown setting 'colour'"),
    (["train", "grpo", "--out", "{f}/out", "--suite", "bank", "-c", "share_prefix=false"],
     "'share_prefix' is not a setting of GRPOConfig: it is performance.share_prefix"),
    (["train", "grpo", "--out", "{f}/a-file", "--suite", "bank"], "'--out'"),
    (["train", "grpo", "--out", "{f}/out", "--suite", "bank", "-c", "split=fit,experimental.kinds=[bingo]"],
     "kinds ['bingo']: not among the 'fit' split's task kinds"),
    (["train", "grpo", "--out", "{f}/out", "--traces", "{f}/folder", "-c", "experimental.kinds=[bingo]"],
     "experimental.kinds picks the tasks to roll out: it needs --suite"),
    (["lab", "plot", "{f}/folder"], "no metrics.jsonl in"),
    (["train", "grpo", "--out", "{f}/started", "--suite", "bank", "--k", "8", "--mode", "simulated"],
     "another configuration (k: 4 → 8; there → now)"),
    (["train", "grpo", "--out", "{f}/started-too", "--suite", "bank"],
     'another configuration (mode: "simulated" → "real"'),
    (["eval", "--suite", "bank", "--policy", "noop", "--out", "/proc/envace-out"], "cannot write to /proc/envace-out"),
    (["eval", "--suite", "bank", "--policy", "noop", "--out", "{f}/a-file/out"], "cannot write to"),
    (["lab", "sample", "/proc/envace-out", "{f}/hosted"], "cannot write to /proc/envace-out"),
    (["train", "grpo", "--out", "{f}/out", "--traces", "{f}/hosted"], "act turns without sampling logprobs (model: hosted)"),
    (["train", "grpo", "--out", "{f}/out", "--traces", "{f}/unshaped", "--config", "{f}/f1.json"],
     "call_f1_weight adds each run's tool-call F1 against its task's reference calls, and 1 of 1 runs have no"),
    (["train", "grpo", "--out", "{f}/out", "--suite", "bank", "--mode", "simulated", "--config", "{f}/fidelity.json"],
     "fidelity_weight rewards rehearsals whose call really ran, and simulated mode"),
]


def invoke(args: list[str], folder: Path) -> tuple[subprocess.CompletedProcess, str]:
    loaded = folder / f"loaded-{abs(hash(tuple(args)))}"
    env = {**os.environ, "LOADED": str(loaded), "COLUMNS": "100", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", WRAPPER, *[a.replace("{f}", str(folder)) for a in args]],
                         capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    return out, loaded.read_text() if loaded.exists() else "?"


@pytest.mark.timeout(900)  # 124 fresh interpreters, two at a time: ~3 min on 2 idle cores, more on busy ones
def test_every_bad_invocation_fails_in_one_line_with_exit_code_2_before_anything_heavy_starts(files):
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda case: invoke(case[0], files), BAD))
    wrong = []
    for (args, fragment), (out, loaded) in zip(BAD, results):
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        ok = (out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
              and out.stdout == "" and loaded in ("", "torch" if "--config" in args else ""))
        if not ok:
            wrong.append(f"{' '.join(args)} -> rc {out.returncode}, loaded [{loaded}], stderr {out.stderr[-600:]!r}")
    assert not wrong, "\n".join(wrong)
    assert not (files / "out").exists()  # nothing was written for any of them


def test_a_model_that_cannot_be_reached_is_named_as_it_loads_then_one_error_line(files):
    """Not a bad command line: the server is looked for when the model loads, which the command announces
    (what it loads, on stderr) before the one error line; nothing heavy was imported."""
    out, loaded = invoke(["policy", "try", "--model", "vllm:http://127.0.0.1:9/v1"], files)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and loaded == "" and out.stdout == "", out.stderr
    assert lines[0].startswith("loading vllm:http://127.0.0.1:9/v1") and len(lines) == 2
    assert lines[1].startswith("error: vLLM at http://127.0.0.1:9/v1 is not reachable")


def test_no_arguments_shows_the_help_and_exits_0():
    out = subprocess.run([sys.executable, "-m", "envace_mcp.cli"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "demo" in out.stdout and "train" in out.stdout


def test_demos_step_budget_has_one_door_and_its_own_default_does_not_hide_it():
    """`envace demo --gate max_steps=8` ran with 4: the --max-steps default hid the --gate setting. A run
    limit is now set in one place, `--limits`, over the demo's own default; `--gate` refuses it by name."""
    from envace_mcp.cli._common import _limits
    from envace_mcp.cli.agent import DEMO_LIMITS

    assert _limits("max_steps=8", DEMO_LIMITS).max_steps == 8 and _limits(None, DEMO_LIMITS).max_steps == 4
    assert _limits("max_real_calls=3", DEMO_LIMITS).max_steps == 4  # another limit leaves the demo's turns

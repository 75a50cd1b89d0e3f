"""`envace lab reference`, `envace train sft`, `envace lab probe`, `envace train grpo`, `envace lab plot` as users run them."""

import json
import os
import subprocess
import sys


def cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "envace_mcp.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def test_reference_traces_then_sft_then_grpo_on_the_tiny_model(tmp_path):
    from envace_mcp.testing import build_tiny_qwen3

    model = str(build_tiny_qwen3(tmp_path / "tiny"))
    refs = cli("lab", "reference", str(tmp_path / "refs"), "--suite", "bank", "--limit", "3", "--model", model)
    assert refs.returncode == 0, refs.stderr
    stats = cli("traces", "stats", str(tmp_path / "refs"))
    assert "100.0%" in stats.stdout and "1.000 over" in stats.stdout  # references succeed, simulator exact
    fast = cli("lab", "reference", str(tmp_path / "fast"), "--suite", "bank", "--limit", "3", "--model", model,
               "--no-logprobs", "--tool-format", "compact", "--rehearse-format", "inline",  # token ids only: what SFT needs
               "--rehearsed", "2")  # each run opens with two imagined attempts' memory, as under `eval -c rehearse=2`
    assert fast.returncode == 0, fast.stderr
    from envace_mcp.traces import TraceStore

    steps = [s for t in TraceStore(tmp_path / "fast").read() for s in t.steps if s.role in ("act", "rehearse")]
    assert steps and all(s.prompt_ids and s.completion_ids and s.logprobs is None for s in steps)
    assert all(len(t.metadata["imagined"]) == 2 for t in TraceStore(tmp_path / "fast").read())
    sft = cli("train", "sft", "--traces", str(tmp_path / "fast"), "--out", str(tmp_path / "sft"), "--model", model,
              "--epochs", "1", "-c", "performance.bf16=true,performance.micro_batch=2,roles=[act,rehearse]")
    assert sft.returncode == 0, sft.stderr
    assert (tmp_path / "sft" / "adapter_config.json").exists()
    assert json.loads((tmp_path / "sft" / "envace.json").read_text()) == {"tool_format": "compact",  # as recorded
                                                                           "rehearse_format": "inline"}
    assert len((tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()) >= 1
    probes = cli("lab", "probe", str(tmp_path / "probes"), "--suite", "bank", "--limit", "2", "--model", model,
                 "--adapter", str(tmp_path / "sft"))  # the adapter's formats apply
    assert probes.returncode == 0, probes.stderr
    assert "real errors" in probes.stdout and json.loads((tmp_path / "probes" / "probes.json").read_text())["runs"] > 0
    more = cli("train", "sft", "--traces", str(tmp_path / "probes"), "--out", str(tmp_path / "sft2"), "--model", model,
               "--adapter", str(tmp_path / "sft"), "--epochs", "1", "-c", "lr=1e-2")  # the world model learns errors
    assert more.returncode == 0, more.stderr
    from safetensors.torch import load_file

    start, went_on = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("sft", "sft2"))
    assert start.keys() == went_on.keys() and any((start[k] != went_on[k]).any() for k in start)  # the same adapter, trained on
    mismatched = cli("train", "sft", "--traces", str(tmp_path / "refs"), "--out", str(tmp_path / "sft3"), "--model", model,
                     "--adapter", str(tmp_path / "sft"))  # json + simulator runs, a compact + inline adapter
    assert mismatched.returncode == 2 and "record them in the adapter's formats" in " ".join(mismatched.stderr.split())
    config = tmp_path / "grpo.json"
    config.write_text(json.dumps({"model": model, "lr": 1e-3, "steps": 2, "groups_per_step": 1}))
    from pathlib import Path

    fixtures = Path(__file__).parent.parent / "fixtures" / "traces"
    grpo = cli("train", "grpo", "--traces", str(fixtures), "--out", str(tmp_path / "grpo"), "--config", str(config))
    assert grpo.returncode == 0, grpo.stderr
    assert (tmp_path / "grpo" / "metrics.png").exists() and "step 2" in grpo.stdout
    more = cli("train", "grpo", "--traces", str(fixtures), "--out", str(tmp_path / "grpo"), "--config", str(config),
               "--steps", "3")  # the same run, resumed for one more step
    assert more.returncode == 0 and "step 3" in more.stdout, more.stderr
    elsewhere = cli("train", "grpo", "--traces", str(tmp_path / "refs"), "--out", str(tmp_path / "grpo"), "--config", str(config))
    assert elsewhere.returncode == 2 and "holds a GRPO run of another configuration (traces: " in elsewhere.stderr
    with open(tmp_path / "grpo" / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "lo')  # a line torn by a kill, or still being written: skipped
    arms = cli("lab", "plot", str(tmp_path / "grpo"), str(tmp_path / "sft"), "--out", str(tmp_path / "arms.png"))
    assert arms.returncode == 0, arms.stderr
    assert "2 runs plotted" in arms.stdout and (tmp_path / "arms.png").read_bytes()[:4] == b"\x89PNG"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"epsilon_typo": 1}))
    refused = cli("train", "grpo", "--traces", str(fixtures), "--out", str(tmp_path / "g2"), "--config", str(bad))
    assert refused.returncode == 2 and "unknown setting 'epsilon_typo'; did you mean 'epsilon'" in refused.stderr


def test_online_grpo_rollouts_give_the_rehearse_role_its_own_budget_and_draw_their_own_seeds(tmp_path):
    from envace_mcp.cli.train import _online_trainer
    from envace_mcp.testing import build_tiny_qwen3
    from envace_mcp.train.trainer import GRPOConfig

    model = build_tiny_qwen3(tmp_path / "tiny")
    own = _online_trainer(GRPOConfig(model=str(model), max_new_tokens=16, rehearse_max_new_tokens=300, split="fit"),
                          "bank", tmp_path / "a", 2, "simulated")
    assert {k: (v.max_new_tokens, v.temperature, v.seed) for k, v in own.source.sampling.items()} == {
        "act": (16, 1.0, None), "rehearse": (300, 1.0, None)}  # no fixed seed: a group's K runs must differ
    from envace_mcp.envs import get_suite

    assert [t.id for t in own.source.tasks] == [t.id for t in get_suite("bank").split("fit")]  # the split set
    same = _online_trainer(GRPOConfig(model=str(model), max_new_tokens=16), "bank", tmp_path / "b", 2, "simulated")
    assert same.source.sampling["rehearse"].max_new_tokens == 16


def test_a_sigterm_that_lands_in_a_finalizer_still_stops_the_run():
    """Python drops an exception raised in a `__del__` or weakref callback ("Exception ignored in"); a
    SIGTERM handled there used to vanish, and the training went on. The stop is delivered again."""
    import signal
    import time

    from envace_mcp.cli.train import _stop_on_sigterm

    class Finalized:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)  # the handler runs here, inside the finalizer
            for _ in range(100):
                pass

    reached = []
    try:
        with _stop_on_sigterm():
            Finalized()  # dropped at once: __del__ runs and swallows the first exit
            for _ in range(100):
                reached.append(1)
                time.sleep(0.01)
    except SystemExit as exc:
        assert exc.code == 128 + signal.SIGTERM
    else:
        raise AssertionError("the SIGTERM was lost in the finalizer")
    assert len(reached) < 100 and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

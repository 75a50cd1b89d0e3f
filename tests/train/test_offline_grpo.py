"""Offline GRPO from the checked-in traces: metrics, plot, and bit-for-bit resume after a stop."""

import json
from pathlib import Path

import pytest
import torch

from envace_mcp.errors import UserError
from envace_mcp.train.checkpoints import read_checkpoint
from envace_mcp.train.trainer import GRPOConfig, OfflineGRPO

FIXTURES = Path(__file__).parent.parent / "fixtures" / "traces"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from envace_mcp.testing import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny"))


def trainer(tiny_dir, out, **overrides):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = GRPOConfig(**{"lr": 1e-3, "steps": 4, "groups_per_step": 1, "checkpoint_every": 2, **overrides,
                           "performance": {"micro_batch": 2, **overrides.get("performance", {})}})
    return OfflineGRPO(config, FIXTURES, out, model=AutoModelForCausalLM.from_pretrained(tiny_dir),
                       tokenizer=AutoTokenizer.from_pretrained(tiny_dir))


def trainable(t):
    return {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}


def test_offline_grpo_trains_logs_metrics_and_plots(tiny_dir, tmp_path):
    t = trainer(tiny_dir, tmp_path / "run")
    start = trainable(t)
    records = t.run()
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # first step is on-policy
    assert records[0]["reward"] == 0.5 and records[0]["segments"] == 8  # 2 x (2 act + 1 rehearse) + 2 x 1 act
    assert any(not torch.equal(start[n], p) for n, p in trainable(t).items())
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1])["step"] == 4
    png = tmp_path / "run" / "metrics.png"
    assert png.exists() and png.read_bytes()[:4] == b"\x89PNG"


def test_a_stopped_run_resumes_to_the_same_parameters_as_an_uninterrupted_one(tiny_dir, tmp_path):
    straight = trainer(tiny_dir, tmp_path / "straight")
    straight.run()
    first = trainer(tiny_dir, tmp_path / "resumed", steps=2)  # stopped after 2 of the 4 steps
    first.run()
    second = trainer(tiny_dir, tmp_path / "resumed")  # a fresh process would do exactly this
    assert second.load() and second.step == 2
    second.run()
    a, b = trainable(straight), trainable(second)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


class _Planted:
    """A pickle that, unpickled, creates the file `marker`: what a planted `state.pt` would run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_pickle_checkpoint_is_refused_in_one_line_and_never_unpickled(tiny_dir, tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    torch.save({"step": 1, "payload": _Planted(marker)}, tmp_path / "run" / "checkpoint" / "state.pt")
    with pytest.raises(UserError, match="old pickle format") as refused:
        trainer(tiny_dir, tmp_path / "run").run()
    assert not marker.exists()  # the pickle was never loaded
    assert "\n" not in str(refused.value)


def test_envace_train_grpo_resuming_onto_a_planted_pickle_fails_in_one_line_and_runs_nothing(tiny_dir, tmp_path):
    import os
    import subprocess
    import sys

    marker, out = tmp_path / "ran", tmp_path / "out"
    (out / "checkpoint").mkdir(parents=True)
    torch.save({"step": 1, "payload": _Planted(marker)}, out / "checkpoint" / "state.pt")
    (tmp_path / "grpo.json").write_text(json.dumps({"model": str(tiny_dir), "steps": 1, "micro_batch": 2}))
    done = subprocess.run([sys.executable, "-m", "envace_mcp.cli", "train", "grpo", "--traces", str(FIXTURES),
                           "--out", str(out), "--config", str(tmp_path / "grpo.json")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "old pickle format" in lines[0], done.stderr
    assert not marker.exists()


def test_a_checkpoint_that_is_not_one_envace_wrote_is_refused_clearly(tiny_dir, tmp_path):
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint" / "state.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(UserError, match="not a checkpoint this envace-mcp wrote"):
        trainer(tiny_dir, tmp_path / "run").run()


def test_act_only_and_trajectory_advantages_are_options(tiny_dir, tmp_path):
    t = trainer(tiny_dir, tmp_path / "act", roles=["act"], advantage="trajectory")
    assert {r.role for g in t.groups for r in g} == {"act"}
    assert t.train_step()["segments"] == 6


def test_traces_without_rewards_or_tokens_are_refused_clearly(tiny_dir, tmp_path):
    with pytest.raises(UserError, match="no trainable groups"):
        trainer(tiny_dir, tmp_path / "x", reward="nonexistent")


def test_fidelity_reward_and_real_output_ce_are_off_by_default_and_work_when_on(tiny_dir, tmp_path):
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.rows import segments
    from envace_mcp.train.trainer import step_advantages

    rows = segments(TraceStore(FIXTURES).read())
    checked = [r for r in rows if r.role == "rehearse" and r.fidelity is not None]
    assert checked and all(r.fidelity == 1.0 for r in checked)  # reference rehearsals matched reality
    checked[0].fidelity = 0.0  # pretend the first one missed
    plain = step_advantages([rows], GRPOConfig())
    weighted = step_advantages([rows], GRPOConfig(experimental={"fidelity_weight": 0.5}))
    acts = [i for i, r in enumerate(rows) if r.role == "act"]
    assert torch.equal(plain[acts], weighted[acts])  # the act role's advantages are untouched
    missed = rows.index(checked[0])
    assert weighted[missed] < plain[missed]  # the wrong rehearsal is now below its role's baseline

    default = trainer(tiny_dir, tmp_path / "off").run()
    assert "ce" not in default[0] and default[0]["fidelity"] == 1.0
    records = trainer(tiny_dir, tmp_path / "on", experimental={"real_output_ce": 1.0}, lora=False).run()
    assert all("ce" in r for r in records)
    assert records[-1]["ce"] < records[0]["ce"]  # the rehearse role learns the recorded real outputs


def _stop_part_way(tiny_dir, tmp_path, sig, *, checkpoint_every, after_lines):
    """`envace train grpo` run straight to step 6 and, in another folder, sent `sig` once its metrics have
    `after_lines` lines; returns (the stopped process's exit code, its checkpoint, the command, env)."""
    import os
    import subprocess
    import sys
    import time

    config = tmp_path / "grpo.json"
    config.write_text(json.dumps({"model": str(tiny_dir), "lr": 1e-3, "steps": 6, "groups_per_step": 1,
                                  "micro_batch": 2, "checkpoint_every": checkpoint_every}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}

    def command(out):
        return [sys.executable, "-m", "envace_mcp.cli", "train", "grpo", "--traces", str(FIXTURES), "--out", str(out),
                "--config", str(config)]

    subprocess.run(command(tmp_path / "straight"), env=env, check=True, capture_output=True, timeout=600)
    stopped = subprocess.Popen(command(tmp_path / "stopped"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = tmp_path / "stopped" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and stopped.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= after_lines:
            break
        time.sleep(0.02)
    assert stopped.poll() is None, "training finished before it could be stopped"
    os.kill(stopped.pid, sig)
    code = stopped.wait(timeout=120)
    state, _ = read_checkpoint(tmp_path / "stopped" / "checkpoint" / "state.safetensors")
    subprocess.run(command(tmp_path / "stopped"), env=env, check=True, capture_output=True, timeout=600)
    (a, a_params), (b, b_params) = (read_checkpoint(tmp_path / run / "checkpoint" / "state.safetensors")
                                    for run in ("straight", "stopped"))
    assert a["step"] == b["step"] == 6 and a_params.keys() == b_params.keys()
    assert all(torch.equal(a_params[n], b_params[n]) for n in a_params)  # resumed bit-for-bit
    return code, state


def test_kill_9_mid_training_then_the_same_command_resumes_to_the_parameters_of_an_uninterrupted_run(tiny_dir, tmp_path):
    """A real SIGKILL of a training process (no cleanup, no atexit), then the same command again."""
    import signal

    # step 3 is checkpointed once the metrics have 4 lines
    _, state = _stop_part_way(tiny_dir, tmp_path, signal.SIGKILL, checkpoint_every=1, after_lines=4)
    assert 3 <= state["step"] < 6  # it really stopped part-way
    steps = [json.loads(line)["step"] for line in (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # steps redone after the checkpoint are logged once


def test_sigterm_between_checkpoints_keeps_the_last_completed_step_and_resumes_bit_for_bit(tiny_dir, tmp_path):
    """`checkpoint_every` beyond the run: without the snapshot a stop would lose every step."""
    import signal

    code, state = _stop_part_way(tiny_dir, tmp_path, signal.SIGTERM, checkpoint_every=100, after_lines=2)
    assert code == 128 + signal.SIGTERM
    assert 1 <= state["step"] < 6  # step 1's snapshot at least (step 2's metrics line precedes its snapshot)


def test_segments_with_zero_advantage_are_left_out_of_the_passes_and_the_update_is_the_same(tiny_dir, tmp_path):
    from dataclasses import replace

    from envace_mcp.train.trainer import step_advantages

    results = {}
    for skip in (False, True):
        t = trainer(tiny_dir, tmp_path / str(skip), performance={"skip_zero_advantage": skip})
        group = t.groups[0]
        rehearsing = {r.run_id for r in group if r.role == "rehearse"}
        # the runs that rehearsed score alike (their rehearsals get advantage 0), the others differ
        others = sorted({r.run_id for r in group} - rehearsing)
        reward = {run: 1.0 for run in rehearsing} | {run: float(i % 2) for i, run in enumerate(others)}
        group = [replace(r, reward=reward[r.run_id]) for r in group]
        advantages = step_advantages([group], t.config)
        zero = int((advantages == 0).sum())
        assert 0 < zero < len(group)  # both kinds in the step
        start, passes = trainable(t), []
        hook = t.model.register_forward_pre_hook(lambda *_: passes.append(1))
        record = t.update([group])
        hook.remove()
        assert any(not torch.equal(start[n], p) for n, p in trainable(t).items())  # it did train
        results[skip] = (trainable(t), record, len(passes))
    (full, full_record, full_passes), (lean, lean_record, lean_passes) = results[False], results[True]
    assert all(torch.allclose(full[n], lean[n], rtol=0, atol=1e-7) for n in full)
    assert lean_record["loss"] == pytest.approx(full_record["loss"], abs=1e-7)
    assert lean_record["grad_norm"] == pytest.approx(full_record["grad_norm"], rel=1e-5)
    assert lean_record["scored_tokens"] < full_record["scored_tokens"] == full_record["tokens"]
    assert lean_passes < full_passes  # micro_batch 2: fewer packed passes for the same update


def test_trajectory_advantages_count_each_run_once_whatever_its_segments():
    from envace_mcp.train.grpo import group_advantages, role_advantages, trajectory_advantages

    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0])  # [S] run A: 3 segments, reward 1; run B: 1 segment, reward 0
    groups, runs = torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 0, 1])
    assert trajectory_advantages(rewards, groups, runs).tolist() == [0.5, 0.5, 0.5, -0.5]
    assert role_advantages(rewards, groups, torch.zeros(4, dtype=torch.long)).tolist() == [0.25, 0.25, 0.25, -0.75]
    two = trajectory_advantages(torch.tensor([1.0, 1.0, 0.0, 0.5, 0.5, 0.5]), torch.tensor([0, 0, 0, 1, 1, 1]),
                                torch.tensor([0, 0, 1, 2, 3, 3]), scale="group")
    per_run = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), 2, scale="group")  # TRL's, on the runs
    assert torch.allclose(two, per_run[torch.tensor([0, 0, 1, 2, 3, 3])])


def test_the_trainer_uses_the_trajectory_baseline_over_runs(tiny_dir, tmp_path):
    from envace_mcp.train.trainer import step_advantages

    t = trainer(tiny_dir, tmp_path / "traj", advantage="trajectory")
    group = t.groups[0]
    advantages = step_advantages([group], t.config)
    runs = {r.run_id: r.reward for r in group}
    mean = sum(runs.values()) / len(runs)
    assert advantages.tolist() == pytest.approx([r.reward - mean for r in group])


def test_beta_adds_the_k3_kl_to_a_reference_without_the_adapter_and_logs_it(tiny_dir, tmp_path):
    from envace_mcp.train.rows import batch_logprobs, collate

    t = trainer(tiny_dir, tmp_path / "kl", beta=0.1, performance={"micro_batch": 64, "share_prefix": False})
    torch.manual_seed(0)
    with torch.no_grad():  # move the adapter off zero, so the policy differs from its reference
        for name, p in t.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    [group] = t.source.next(t.order, t.config, t.step)  # the groups train_step would take
    from envace_mcp.train.trainer import step_advantages

    advantages = step_advantages([group], t.config)  # [S]
    batch = collate(group, t.pad_id)
    with torch.no_grad():
        logp = batch_logprobs(t.model, batch)  # [B, T]
        with t.model.disable_adapter():
            ref = batch_logprobs(t.model, batch)  # [B, T]
    mask = batch.completion_mask.float()  # [B, T]
    ratio = torch.exp(logp - batch.old_logprobs)  # [B, T]
    adv = advantages.unsqueeze(1)  # [B, 1]
    surrogate = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)  # [B, T]
    k3 = torch.exp(ref - logp) - (ref - logp) - 1  # [B, T]
    expected_kl = float((k3 * mask).sum() / mask.sum())
    expected = float(((surrogate + 0.1 * k3) * mask).sum() / mask.sum())
    record = t.update([group])
    assert expected_kl > 1e-4  # a real difference from the reference, and it is in the loss
    assert record["kl"] == pytest.approx(expected_kl, rel=1e-4)
    assert record["loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_a_full_fine_tune_with_beta_keeps_a_frozen_reference_prepared_like_the_model(tiny_dir, tmp_path):
    from envace_mcp.train.rows import _takes_packed_rows

    t = trainer(tiny_dir, tmp_path / "full", beta=0.1, lora=False)
    assert t.reference is not None and t.reference is not t.model
    assert _takes_packed_rows(t.reference) == _takes_packed_rows(t.model)
    before = {n: p.detach().clone() for n, p in t.reference.named_parameters()}
    record = t.update(t.source.next(t.order, t.config, t.step))
    assert record["kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is still its reference
    assert all(torch.equal(before[n], p) for n, p in t.reference.named_parameters())  # frozen
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())  # the policy moved

"""Training settings as one model per trainer (`GRPOConfig`, `SFTConfig`: core settings, `experimental`,
`performance`), read from JSON files and `-c key=value`, and saved with every run folder, which refuses
a resume (GRPO) or a retraining (SFT) that would change them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace_mcp.cli._common import _config_layers
from envace_mcp.config import build, parse_text
from envace_mcp.errors import UserError
from envace_mcp.train.config import GRPOConfig, SFTConfig

FIXTURES = Path(__file__).parent.parent / "fixtures" / "traces"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "envace_mcp.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "200"})


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_flat_grpo_json_written_before_the_groups_loads_into_them(tmp_path):
    old = tmp_path / "grpo.json"  # every key at the top level, as GRPOConfig was written before it had groups
    old.write_text(json.dumps({"lr": 1e-3, "steps": 2, "micro_batch": 8, "share_prefix": False, "bf16": False,
                               "rollout_kv_gb": None, "kinds": ["transfer_funds"], "fidelity_weight": 0.5,
                               "dynamic_sampling": 2, "skip_zero_advantage": False, "tis_cap": 3.0}))
    config = build(GRPOConfig, *_config_layers([str(old)], GRPOConfig), where="-c")  # as `train grpo -c` reads it
    assert (config.lr, config.steps, config.tis_cap) == (1e-3, 2, 3.0)
    assert (config.performance.micro_batch, config.performance.share_prefix, config.performance.bf16,
            config.performance.rollout_kv_gb, config.performance.skip_zero_advantage) == (8, False, False, None, False)
    assert (config.experimental.kinds, config.experimental.fidelity_weight,
            config.experimental.dynamic_sampling) == (["transfer_funds"], 0.5, 2)
    assert "micro_batch" not in config.model_dump()  # written back in the new shape only
    later = build(GRPOConfig, *_config_layers([str(old), "performance.micro_batch=4"], GRPOConfig), where="-c")
    assert later.performance.micro_batch == 4 and later.lr == 1e-3  # a later layer wins, the rest stays


def test_key_value_settings_reach_the_groups_over_a_json_file(tmp_path):
    grouped = tmp_path / "grpo.json"
    grouped.write_text(json.dumps({"lr": 1e-3, "performance": {"micro_tokens": 2048, "bf16": True}}))
    typed = parse_text("lr=1e-4,performance.micro_tokens=8192,experimental.kinds=[a,b],roles=[act],split=fit",
                       GRPOConfig, "-c")
    config = build(GRPOConfig, json.loads(grouped.read_text()), typed, where="-c")
    assert (config.lr, config.roles, config.split) == (1e-4, ["act"], "fit")
    assert (config.performance.micro_tokens, config.performance.bf16) == (8192, True)  # the file's bf16 stays
    assert config.experimental.kinds == ["a", "b"]
    sft = build(SFTConfig, parse_text("lr=5e-4,performance.share_prefix=no,min_reward=0.5", SFTConfig, "-c"), where="-c")
    assert (sft.lr, sft.performance.share_prefix, sft.min_reward) == (5e-4, False, 0.5)


def test_a_misspelt_or_moved_key_is_refused_with_a_close_match():
    with pytest.raises(UserError, match="-c: unknown setting 'micro_token'; did you mean 'micro_tokens'"):
        parse_text("performance.micro_token=1", GRPOConfig, "-c")
    with pytest.raises(UserError, match="unknown setting 'epsilon_hgh'; did you mean 'epsilon_high'"):
        parse_text("epsilon_hgh=0.3", GRPOConfig, "-c")
    with pytest.raises(UserError, match="'share_prefix' is not a setting of GRPOConfig: it is performance.share_prefix"):
        parse_text("share_prefix=false", GRPOConfig, "-c")  # typed, a setting has one name: its group's
    with pytest.raises(UserError, match="unknown setting 'epoch'; did you mean 'epochs'"):
        build(SFTConfig, {"epoch": 3}, where="sft.json")
    with pytest.raises(UserError, match="performance.micro_tokens must be greater than or equal to 1"):
        build(GRPOConfig, {"performance": {"micro_tokens": 0}}, where="-c")


def test_sft_settings_group_their_performance_ones_and_the_learning_rate_follows_lora():
    assert SFTConfig().lr == 2e-4 and SFTConfig(lora=False).lr == 1e-5 and SFTConfig(lora=False, lr=3e-5).lr == 3e-5
    assert SFTConfig(lora_r=8).lora_alpha == 16 and SFTConfig(lora_r=8, lora_alpha=8).lora_alpha == 8
    flat = SFTConfig(share_prefix=False, micro_batch=2)  # the dataclass's keyword arguments still read
    assert (flat.performance.share_prefix, flat.performance.micro_batch) == (False, 2)
    shared = set(type(SFTConfig().performance).model_fields)
    assert shared < set(type(GRPOConfig().performance).model_fields)  # one base, GRPO's adds its own
    assert SFTConfig().performance.mmap_threshold_mb is None and GRPOConfig().performance.mmap_threshold_mb == 1.0
    with pytest.raises(UserError, match="adapter continues a LoRA adapter"):
        build(SFTConfig, {"adapter": "runs/sft", "lora": False}, where="-c")


def test_a_grpo_resume_that_changes_the_configuration_is_refused_and_a_longer_one_goes_on(tmp_path, tiny_qwen3_dir):
    first, changed = tmp_path / "a.json", tmp_path / "b.json"
    settings = {"model": str(tiny_qwen3_dir), "lr": 1e-3, "steps": 1, "groups_per_step": 1, "micro_batch": 2}
    first.write_text(json.dumps(settings))  # a flat file, as written before the settings had groups
    changed.write_text(json.dumps({**settings, "lr": 1e-2}))
    out = tmp_path / "grpo"
    started = cli("train", "grpo", "--traces", FIXTURES, "--out", out, "--config", first)
    assert started.returncode == 0, started.stderr
    saved = json.loads((out / "setup.json").read_text())
    assert saved["source"] == {"traces": str(FIXTURES.resolve()), "suite": None, "k": None, "mode": None}
    assert saved["config"] == GRPOConfig(**settings).model_dump(mode="json")  # every setting, resolved

    refused = cli("train", "grpo", "--traces", FIXTURES, "--out", out, "--config", changed, "--steps", "2")
    assert refused.returncode == 2
    assert "holds a GRPO run of another configuration (lr: 0.001 → 0.01; there → now)" in one_line(refused.stderr)
    moved = cli("train", "grpo", "--suite", "bank", "--out", out, "--config", first)
    assert moved.returncode == 2 and f'(traces: "{FIXTURES.resolve()}" → null; there → now)' in one_line(moved.stderr)

    longer = cli("train", "grpo", "--traces", FIXTURES, "--out", out, "--config", first, "--steps", "2",
                 "-c", "performance.micro_tokens=2048")  # more steps, and an exact setting, may change
    assert longer.returncode == 0 and "step 2" in longer.stdout, longer.stderr
    saved = json.loads((out / "setup.json").read_text())["config"]
    assert (saved["steps"], saved["performance"]["micro_tokens"], saved["lr"]) == (2, 2048, 1e-3)


def test_sft_into_a_folder_trained_with_another_configuration_is_refused(tmp_path, tiny_qwen3_dir):
    out = tmp_path / "sft"
    args = ("train", "sft", "--traces", FIXTURES, "--out", out, "--model", tiny_qwen3_dir)
    trained = cli(*args, "--epochs", "1")
    assert trained.returncode == 0, trained.stderr
    saved = json.loads((out / "setup.json").read_text())
    assert saved["source"] == {"traces": str(FIXTURES.resolve())}
    assert saved["config"]["epochs"] == 1 and saved["config"]["model"] == str(tiny_qwen3_dir)
    refused = cli(*args, "--epochs", "2")
    assert refused.returncode == 2
    assert "holds an SFT run of another configuration (epochs: 1 → 2; there → now)" in one_line(refused.stderr)
    again = cli(*args, "--epochs", "1")  # the same configuration trains again, as before
    assert again.returncode == 0, again.stderr


def test_a_run_folder_from_before_setup_json_held_every_setting_is_checked_against_its_checkpoint(tmp_path):
    from envace_mcp.train.run_setup import check_setup, checkpoint_settings

    folder = tmp_path / "run"
    (folder / "checkpoint").mkdir(parents=True)
    meta = {"format": 1, "step": 2, "config": {"lr": 1e-3, "micro_batch": 2, "kinds": None}}  # flat, as checkpoints held it
    header = json.dumps({"__metadata__": {"envace": json.dumps(meta)}}).encode()
    (folder / "checkpoint" / "state.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    (folder / "setup.json").write_text(json.dumps(  # the first setup.json: some flags only
        {"traces": None, "suite": "bank", "split": "fit", "k": 4, "mode": "simulated", "kinds": None,
         "max_new_tokens": 128, "rehearse_max_new_tokens": None}))
    recorded = checkpoint_settings(folder)
    source = {"traces": None, "suite": "bank", "k": 4, "mode": "simulated"}
    same = GRPOConfig(lr=1e-3, split="fit", performance={"micro_batch": 2})
    check_setup(folder, "grpo", same, source, recorded=recorded)
    with pytest.raises(UserError, match=r"another configuration \(lr: 0.001 → 0.01; there → now\)"):
        check_setup(folder, "grpo", same.model_copy(update={"lr": 1e-2}), source, recorded=recorded)
    with pytest.raises(UserError, match=r'\(split: "fit" → "train"; there → now\)'):
        check_setup(folder, "grpo", GRPOConfig(lr=1e-3, performance={"micro_batch": 2}), source, recorded=recorded)
    with pytest.raises(UserError, match=r"\(k: 4 → 8; there → now\)"):
        check_setup(folder, "grpo", same, {**source, "k": 8}, recorded=recorded)
    with pytest.raises(UserError, match="holds a GRPO run, not an SFT run: use another --out"):
        check_setup(folder, "sft", SFTConfig(), {"traces": "x"})

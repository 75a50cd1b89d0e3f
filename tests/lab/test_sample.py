"""`envace lab sample`: a seeded training mix drawn from several trace folders, as users run it."""

import os
import subprocess
import sys

import pytest

from envace_mcp.errors import UserError
from envace_mcp.traces import Reward, Trace, TraceStore


def test_lab_sample_draws_a_seeded_mix_from_several_folders_with_rewards_attached(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "envace_mcp.cli", *args], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "COLUMNS": "200"})

    bank, retail = TraceStore(tmp_path / "bank"), TraceStore(tmp_path / "retail")
    for i in range(10):
        bank.append(Trace(run_id=f"bank-{i}", started_at=0.0))
        bank.attach_reward(f"bank-{i}", Reward(name="task", value=i / 10))  # a reward line apart from its run
    for i in range(3):
        retail.append(Trace(run_id=f"retail-{i}", started_at=0.0))

    def sample(out, seed):
        done = cli("lab", "sample", str(tmp_path / out), f"{tmp_path / 'bank'}:4", str(tmp_path / "retail"),
                   "--seed", str(seed))
        assert done.returncode == 0, done.stderr
        assert "wrote 7 runs" in done.stdout and "4 of 10 from" in done.stdout and "3 of 3 from" in done.stdout
        return list(TraceStore(tmp_path / out).read())

    first = sample("mix-a", 0)
    assert [t.run_id for t in first][4:] == ["retail-0", "retail-1", "retail-2"]
    drawn = first[:4]
    assert len({t.run_id for t in drawn}) == 4 and all(t.run_id.startswith("bank-") for t in drawn)
    assert all(t.reward("task").value == int(t.run_id.split("-")[1]) / 10 for t in drawn)  # rewards travel
    assert [t.run_id for t in sample("mix-b", 0)] == [t.run_id for t in first]  # same seed, same runs
    others = {tuple(t.run_id for t in sample(f"mix-{seed}", seed)) for seed in range(1, 6)}
    assert len(others | {tuple(t.run_id for t in first)}) > 1
    again = cli("lab", "sample", str(tmp_path / "mix-a"), str(tmp_path / "retail"))
    assert again.returncode == 2 and "already holds traces" in again.stderr  # never mixed into earlier runs
    assert len(list(TraceStore(tmp_path / "mix-a").read())) == 7


def test_a_source_is_a_folder_with_an_optional_count(tmp_path):
    from envace_mcp.lab.sample import parse_source

    assert parse_source(str(tmp_path)) == (tmp_path, None)
    assert parse_source(f"{tmp_path}:3") == (tmp_path, 3)
    with pytest.raises(UserError, match="N must be at least 1"):
        parse_source(f"{tmp_path}:0")
    with pytest.raises(UserError, match="does not exist"):
        parse_source(f"{tmp_path / 'missing'}:2")

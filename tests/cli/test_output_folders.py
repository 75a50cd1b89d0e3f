"""What the commands write into their output folders: never through a link planted there, and never by
two processes at once. Run through the real `envace` entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace_mcp._files import hold_folder, open_append, write_atomic
from helpers import TESTS

ENVACE = [sys.executable, "-m", "envace_mcp.cli"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "100", "ENVACE_PROGRESS_INTERVAL": "3600"}
FIXTURES = TESTS / "fixtures" / "traces"
EVAL = ["eval", "--suite", "bank", "--policy", "reference", "--limit", "1"]


def envace(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*ENVACE, *args], capture_output=True, text=True, timeout=timeout, env=ENV,
                          stdin=subprocess.DEVNULL)


def plant(out: Path, outside: Path, names: list[str]) -> dict[str, str]:
    """`out/NAME -> outside/NAME` for each name, each target holding its own text; returns those texts."""
    out.mkdir(parents=True, exist_ok=True)
    outside.mkdir(exist_ok=True)
    texts = {}
    for name in names:
        texts[name] = f"a file outside --out: {name}\n"
        (outside / name).write_text(texts[name])
        (out / name).symlink_to(outside / name)
    return texts


def test_links_planted_in_an_eval_folder_are_replaced_and_their_targets_left_untouched(tmp_path):
    out, outside = tmp_path / "out", tmp_path / "outside"
    texts = plant(out, outside, ["results.md", "results.json", "results.json.tmp", "results.png"])
    done = envace(*EVAL, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert {name: (outside / name).read_text() for name in texts} == texts  # no target was written
    for name in ("results.md", "results.json", "results.png"):
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0  # the link itself was replaced
    assert json.loads((out / "results.json").read_text())["summary"]["success"]["tasks"] == 1


def test_a_link_planted_as_the_journal_or_the_trace_file_is_refused_and_its_target_left_untouched(tmp_path):
    out, outside = tmp_path / "out", tmp_path / "outside"
    plant(out, outside, ["runs.jsonl"])
    (outside / "runs.jsonl").write_text("")  # an empty journal: a fresh start would write its head there
    refused = envace(*EVAL, "--out", str(out))
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1 and "runs.jsonl" in lines[0], refused.stderr
    assert (outside / "runs.jsonl").read_text() == ""

    out = tmp_path / "out2"
    plant(out / "traces", outside, ["traces.jsonl"])
    envace(*EVAL, "--out", str(out))
    assert (outside / "traces.jsonl").read_text() == "a file outside --out: traces.jsonl\n"


def test_the_helpers_replace_a_link_or_refuse_it_and_never_write_its_target(tmp_path):
    from envace_mcp.train.metrics import MetricsLog

    target = tmp_path / "target"
    target.write_text("mine")
    (tmp_path / "whole").symlink_to(target)
    write_atomic(tmp_path / "whole", "new")
    assert target.read_text() == "mine" and (tmp_path / "whole").read_text() == "new"
    assert not (tmp_path / "whole").is_symlink()
    (tmp_path / "metrics.jsonl").symlink_to(target)
    with pytest.raises(OSError):
        MetricsLog(tmp_path / "metrics.jsonl").append({"step": 1})
    with pytest.raises(OSError):
        open_append(tmp_path / "metrics.jsonl", truncate=True)
    assert target.read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no temporary file left


HOLDER = """
import sys
from envace_mcp._files import hold_folder
with hold_folder(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def held(tmp_path):
    """`tmp_path/out`, held by another process (as a running `envace eval` holds its --out)."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=ENV)
    assert holder.stdout.readline() == "held\n"
    yield out, holder.pid
    holder.stdin.close()
    assert holder.wait(timeout=60) == 0


@pytest.mark.parametrize("command", [
    [*EVAL, "--out", "{out}"],
    ["train", "grpo", "--traces", str(FIXTURES), "--out", "{out}", "--steps", "1"],
    ["lab", "sample", "{out}", str(FIXTURES) + ":1"],
], ids=["eval", "train-grpo", "lab-sample"])
def test_a_second_process_on_a_folder_in_use_is_refused_in_one_line_naming_the_holder(held, command):
    out, pid = held
    refused = envace(*[part.replace("{out}", str(out)) for part in command])
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2, refused.stderr
    assert len(lines) == 1 and f"in use by another envace process (pid {pid})" in lines[0], refused.stderr
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing else was written


def test_the_folder_is_free_again_once_its_holder_ends_and_a_refused_command_leaves_no_folder(tmp_path):
    out = tmp_path / "out"
    with hold_folder(out):
        assert (out / ".lock").read_text().strip() == str(os.getpid())
    assert not out.exists()  # created for nothing: removed again
    with hold_folder(out):
        (out / "kept").write_text("")
    assert sorted(p.name for p in out.iterdir()) == ["kept"]
    done = envace(*EVAL, "--out", str(out))
    assert done.returncode == 0, done.stderr

"""The README's two commands, verbatim: the test command is what CI runs, and the main command works
from the root of a clean copy of the repository with a regular (non-editable) install."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def readme_commands() -> list[str]:
    """The README's shell blocks, in order: [main job, tests]."""
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)]


def test_the_readme_has_two_one_line_commands_and_ci_runs_the_test_one_verbatim():
    main, tests = readme_commands()[:2]
    assert "\n" not in main and "\n" not in tests
    assert "pip install ." in main and "envace demo" in main
    assert "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()
    for command in (main, tests):  # torch first, or a bare requirement pulls a CUDA build
        assert command.index("pip install torch==2.13.0") < command.index("pip install .") if "pip install ." in command \
            else command.index("pip install torch==2.13.0") < command.index("pip install -e")


def clean_copy(target: Path) -> None:
    """What a fresh clone holds: tracked files and new files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def outside_env() -> dict[str, str]:
    """This process's environment without its virtual environment, as a new user's shell has it."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    venv = Path(sys.prefix)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and not Path(p).is_relative_to(venv))
    env["HF_HUB_OFFLINE"] = "1"
    return env


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_readme_main_command_runs_verbatim_in_the_root_of_a_clean_clone(tmp_path):
    clone = tmp_path / "envace-mcp"
    clean_copy(clone)
    main = readme_commands()[0]
    out = subprocess.run(["bash", "-c", main], cwd=clone, env=outside_env(), stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=1700)
    tail = (out.stdout[-4000:] + "\n--- stderr ---\n" + out.stderr[-4000:])
    assert out.returncode == 0, tail
    installed = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-P", "-c",
                                "import envace_mcp, pathlib; print(pathlib.Path(envace_mcp.__file__).parent)"],
                               capture_output=True, text=True, check=True).stdout.strip()
    assert not Path(installed).is_relative_to(clone / "envace_mcp"), "the install must not be editable"
    assert "checker score:" in out.stdout, tail
    assert "failed to start" not in out.stdout + out.stderr, tail

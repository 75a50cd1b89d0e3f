"""Code in README.md and docs/ that claims to run does: every ```python block runs as it is written, in
a fresh interpreter, unless a `<!-- not run: why -->` line right above it says why it cannot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*?) -->\n)?```python\n(?P<code>.*?)```", re.S)


def blocks() -> list[tuple[str, str, str | None]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start("code")].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match["code"], match["why"]))
    return found


def test_the_docs_have_python_blocks_and_every_block_not_run_says_why():
    found = blocks()
    assert len([b for b in found if b[2] is None]) >= 5
    assert all(why.strip() for _, _, why in found if why is not None)


def test_every_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme] == []


@pytest.mark.slow
@pytest.mark.parametrize("where,code", [pytest.param(w, c, id=w) for w, c, why in blocks() if why is None])
def test_a_python_block_runs_as_written(where, code, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": "",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # `python` is this one
    script = tmp_path / "snippet.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f"{where}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"

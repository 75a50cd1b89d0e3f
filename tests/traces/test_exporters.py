"""Every export format is an `Exporter` looked up by name: one written in a file of its own (here, in this
test) is reachable from `envace traces export` without a line of the command changed, takes only the
options it declares, and what it reports reaches the terminal escaped."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envace_mcp.cli import app
from envace_mcp.errors import UserError
from envace_mcp.traces import Trace, TraceStore
from envace_mcp.traces.exporting import (
    BUILT_IN,
    ExportConfig,
    FileExporter,
    exporter_names,
    get_exporter,
    register_exporter,
)
from envace_mcp.traces.langsmith import LangSmithExporter
from envace_mcp.traces.otel import OtelExporter

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"


@register_exporter
class StatusLines(FileExporter):
    """A third format, whole: one `run_id<TAB>status<TAB>steps` line per run; a run without steps is left
    out, with its task quoted as the reason (text from a trace file, so the terminal must get it escaped)."""

    name = "status-lines"

    def write(self, traces: Sequence[Trace], out: Path, skipped: list[str]) -> int:
        kept = [t for t in traces if t.steps]
        skipped.extend(f"run {t.run_id} has no steps: {t.task}" for t in traces if not t.steps)
        out.write_text("".join(f"{t.run_id}\t{t.status}\t{len(t.steps)}\n" for t in kept))
        return len(kept)


def envace(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_an_exporter_registered_in_its_own_file_is_a_format_of_envace_traces_export(tmp_path):
    store = TraceStore(tmp_path / "runs")
    traces = list(TraceStore(FIXTURES).read())
    for trace in traces:
        store.append(trace)
    hostile = traces[0].model_copy(update={"run_id": "hostile", "steps": [], "task": "look\x1b[2Jup"})
    store.append(hostile)
    out = tmp_path / "status.tsv"

    code, output = envace("traces", "export", str(tmp_path / "runs"), "--format", "status-lines", "--out", str(out))

    assert code == 0, output
    assert out.read_text().splitlines() == [f"{t.run_id}\t{t.status}\t{len(t.steps)}" for t in traces]
    assert f"wrote {len(traces)} run(s) to {out}" in output
    assert "run hostile has no steps: look\\x1b[2Jup" in output and "\x1b" not in output  # shown, never obeyed


def test_an_exporter_refuses_the_options_it_does_not_take_before_reading_any_run(tmp_path):
    code, output = envace("traces", "export", str(FIXTURES), "--format", "status-lines", "--out",
                          str(tmp_path / "x.tsv"), "--otlp", "http://localhost:4318", "--tokens")
    assert code == 2 and "--otlp, --tokens: not for --format status-lines, which takes --out" in output
    code, output = envace("traces", "export", str(FIXTURES), "--format", "status-lines")
    assert code == 2 and "--format status-lines writes a file: give --out FILE" in output
    code, output = envace("traces", "export", str(FIXTURES), "--format", "nosuch", "--out", str(tmp_path / "x"))
    assert code == 2 and "no exporter named 'nosuch': the formats are" in output and "status-lines" in output
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.tsv").exists()


def test_the_built_in_formats_are_the_same_shape_and_found_by_name():
    assert {"otel", "langsmith", "atif", "trl", "status-lines"} <= set(exporter_names())
    assert get_exporter("otel") is OtelExporter and get_exporter("langsmith") is LangSmithExporter
    for name in BUILT_IN:
        exporter = get_exporter(name)
        assert exporter.name == name and callable(exporter.export)
    with pytest.raises(UserError, match="--content: not for --format langsmith, which takes --out, --tokens"):
        LangSmithExporter(ExportConfig(out=Path("x.jsonl"), content=True))
    with pytest.raises(UserError, match="--out: not for --format otel, which takes --content, --otlp"):
        OtelExporter(ExportConfig(out=Path("x.jsonl"), endpoint="http://localhost:4318"))


def test_the_command_starts_without_importing_any_format_it_is_not_asked_for():
    program = ("import sys, envace_mcp.cli; "
               "print(sorted(m for m in sys.modules if m.endswith(('_exporter', '.trl'))))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


PLUGIN = '''
from envace_mcp.traces.exporting import FileExporter, register_exporter

@register_exporter
class RunIds(FileExporter):
    name = "run-ids"

    def write(self, traces, out, skipped):
        out.write_text("".join(t.run_id + "\\n" for t in traces))
        return len(traces)
'''


def test_an_installed_package_adds_a_format_through_its_entry_point(tmp_path, monkeypatch):
    (tmp_path / "envace_run_ids.py").write_text(PLUGIN)
    info = tmp_path / "envace_run_ids-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: envace-run-ids\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[envace_mcp.exporters]\nrun-ids = envace_run_ids\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "ids.txt"

    code, output = envace("traces", "export", str(FIXTURES), "--format", "run-ids", "--out", str(out))

    assert code == 0, output
    assert out.read_text().split() == [t.run_id for t in TraceStore(FIXTURES).read()]

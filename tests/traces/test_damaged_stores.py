"""Damaged trace files written by the tests themselves: torn records, NUL blocks, corrupt gzip
members and JSON of the wrong shape never lose the healthy records around them, and never raise."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest
from test_traces import full_trace

from envace_mcp.traces import TraceStore


def ids(store: TraceStore) -> list[str]:
    return [t.run_id for t in store.read()]


@pytest.mark.parametrize("damage", [b'{"kind":"trace","run_id":"torn","st', b"\0" * 4096])
def test_records_appended_after_a_torn_tail_or_a_nul_block_are_kept(tmp_path, damage):
    store = TraceStore(tmp_path)
    store.append(full_trace(run_id="a"))
    with open(store.path, "ab") as fh:
        fh.write(damage)  # a writer killed mid-record; a crash that left zeros
    store.append(full_trace(run_id="b"))
    store.append(full_trace(run_id="c"))
    assert ids(store) == ["a", "b", "c"]
    assert len(store.problems) == 1 and "unreadable line" in store.problems[0]


def test_a_record_written_right_after_a_torn_one_on_the_same_line_is_recovered(tmp_path):
    store = TraceStore(tmp_path)
    store.append(full_trace(run_id="a"))
    record = json.dumps({"kind": "trace", **full_trace(run_id="b").model_dump(mode="json")}, separators=(",", ":"))
    with open(store.path, "ab") as fh:  # what a writer without fresh-line appends left behind
        fh.write(b'{"kind":"trace","run_id":"torn","ste' + record.encode() + b"\n")
    store.append(full_trace(run_id="c"))
    assert ids(store) == ["a", "b", "c"] and "recovered" in store.problems[0]


def member(trace_id: str) -> bytes:
    record = json.dumps({"kind": "trace", **full_trace(run_id=trace_id).model_dump(mode="json")}) + "\n"
    return gzip.compress(record.encode())


@pytest.mark.parametrize("damage", ["torn", "corrupt"])
def test_gzip_reading_resumes_after_a_torn_or_corrupt_member(tmp_path, damage):
    store = TraceStore(tmp_path, compress=True)
    store.append(full_trace(run_id="a"))
    bad = member("lost")
    bad = bad[: len(bad) // 2] if damage == "torn" else bad[:12] + bytes(b ^ 0x5A for b in bad[12:40]) + bad[40:]
    with open(store.path, "ab") as fh:
        fh.write(bad)
    for run_id in "bcd":
        store.append(full_trace(run_id=run_id))
    assert ids(store) == ["a", "b", "c", "d"]
    assert len(store.problems) == 1 and "gzip member" in store.problems[0]


WRONG_SHAPES = [b"[1, 2]", b"null", b'"a string"', b"42", b'{"kind":"trace","schema_version":"one"}',
                b'{"kind":"trace","run_id":["a","list"]}', b'{"kind":"reward","run_id":["x"],"reward":{}}',
                b'{"kind":"reward","run_id":"a","reward":[1]}', b"[" * 100_000 + b"]" * 100_000,
                b'{"kind":"trace","steps":"not a list","run_id":"z"}']


@pytest.mark.parametrize("compress", [False, True])
def test_json_of_the_wrong_shape_is_a_reported_problem_and_the_rest_is_read(tmp_path, compress):
    store = TraceStore(tmp_path, compress=compress)
    store.append(full_trace(run_id="a"))
    with open(store.path, "ab") as fh:
        for line in WRONG_SHAPES:
            fh.write(gzip.compress(line + b"\n") if compress else line + b"\n")
    store.append(full_trace(run_id="b"))
    assert ids(store) == ["a", "b"]
    assert len(store.problems) == len(WRONG_SHAPES) - 2  # the two bad rewards are ignored, not traces
    listed = subprocess.run([sys.executable, "-m", "envace_mcp.cli", "traces", "ls", str(tmp_path)],
                            capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    stats = subprocess.run([sys.executable, "-m", "envace_mcp.cli", "traces", "stats", str(tmp_path)],
                           capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert listed.returncode == 0 and "Traceback" not in listed.stderr and listed.stdout.count("warning:") == 8
    assert stats.returncode == 0 and "2 runs" in stats.stdout

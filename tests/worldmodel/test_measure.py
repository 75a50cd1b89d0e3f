"""World-model figures beside their floors, the reliability of P(error), and what figures earn: on
hand-counted calls."""

import pytest

from envace_mcp.policy.fidelity import copy_split
from envace_mcp.policy.trust import earned
from envace_mcp.worldmodel.measure import Scored, report, summarise, trust_entry, wilson


def _calls():
    """Ten calls of one tool, two of which failed: the model foresees one failure (P(error) 0.9), calls
    one success a failure (0.7), reads one rehearsal not at all, and the rest right (P(error) 0.1)."""
    rows = [Scored("reserve", True, "tool_error", p_error=0.9), Scored("reserve", True, "result", p_error=0.1),
            Scored("reserve", False, "tool_error", p_error=0.7), Scored("reserve", False, "invalid", code="UNKNOWN")]
    return rows + [Scored("reserve", False, "result", p_error=0.1) for _ in range(6)]


def test_every_status_figure_stands_beside_the_trivial_predictors_on_the_same_calls():
    figures = summarise(_calls(), majority={"reserve": False})
    assert figures["status_accuracy"] == pytest.approx(0.7)  # 1 failure + 6 successes right, the unknown wrong
    assert figures["floors"] == {"always_succeeds": 0.8, "majority": 0.8}  # the model is below both
    assert figures["status_interval"] == wilson(7, 10) and figures["status_interval"][0] < 0.7 < figures["status_interval"][1]
    assert figures["unknown"] == pytest.approx(0.1) and figures["unusable"] == 0.0
    assert summarise(_calls(), majority=None)["floors"]["majority"] is None  # training calls unknown: said, not guessed
    assert summarise(_calls(), majority={"reserve": True})["floors"]["majority"] == pytest.approx(0.2)


def test_each_call_of_the_report_lists_the_fields_it_got_wrong_and_only_those():
    rows = _calls()
    rows[4].missed = {"absent": ["rooms[1].id"], "wrong": ["rooms[0].seats"]}
    rows[5].missed = {"absent": [], "wrong": []}
    calls = report(rows)["calls"]
    assert (calls[4]["absent"], calls[4]["wrong"]) == (["rooms[1].id"], ["rooms[0].seats"])
    assert not {"absent", "wrong"} & set(calls[5]) and not {"absent", "wrong"} & set(calls[0])


def test_p_error_is_judged_by_its_reliability_and_by_what_stopping_on_it_would_catch():
    figures = summarise(_calls())
    calibration = figures["calibration"]
    assert calibration["calls"] == 9 and [b["calls"] for b in calibration["bins"]] == [7, 0, 0, 1, 1]
    # bin 0: mean 0.1, 1 of 7 failed; bin 3: 0.7, 0 of 1; bin 4: 0.9, 1 of 1
    ece = (7 * abs(0.1 - 1 / 7) + abs(0.7 - 0) + abs(0.9 - 1)) / 9
    assert calibration["ece"] == pytest.approx(ece)
    curve = {point["p_error"]: point for point in figures["stop_curve"]}
    assert (curve[0.5]["stopped"], curve[0.5]["precision"], curve[0.5]["recall"]) == (2, 0.5, 0.5)
    assert (curve[0.8]["stopped"], curve[0.8]["precision"]) == (1, 1.0)


def test_the_field_floor_copies_the_argument_or_the_latest_value_of_that_name():
    split = copy_split({"item": "A-1", "reserved": 3, "left": 9}, {"item": "A-1", "qty": 3},
                       [{"reserved": 1}, {"reserved": 3}])
    # item: echoed, copied right; reserved: 3 is an argument's value (echoed), and the floor guesses it from
    # the latest earlier `reserved`; left: computed, nothing of that name to copy
    assert (split["echoed"], split["echoed_ok"], split["new"], split["new_ok"]) == (2, 2, 1, 0)


def test_a_tool_that_does_not_beat_its_floor_earns_nothing_whatever_else_it_scores():
    strong = {"status_accuracy": 0.95, "floors": {"always_succeeds": 0.8, "majority": 0.8}, "predicted_successes": 40,
              "success_precision": 1.0, "stop_curve": [{"p_error": 0.5, "stopped": 5, "precision": 0.8}]}
    assert earned(strong)["believe_failures"] and earned(strong)["skip_approval"] and earned(strong)["min_p_error"] == 0.5
    below = {**strong, "floors": {"always_succeeds": 0.96, "majority": None}}
    assert not earned(below)["believe_failures"] and not earned(below)["skip_approval"]
    assert "does not beat its floor" in earned(below)["why"]
    assert not earned({"status_accuracy": "high"})["skip_approval"]  # figures that are not a report's earn nothing


def test_an_entry_binds_the_one_tool_it_measured_or_none():
    figures = {**summarise(_calls(), majority={"reserve": False})}
    entry = trust_entry(figures, {("inventory", "abc")})
    assert (entry["server"], entry["behaviour"], entry["fail_closed"]) == ("inventory", "abc", True)
    assert entry["floors"] == figures["floors"] and entry["stop_curve"] == figures["stop_curve"]
    two = trust_entry(figures, {("inventory", "abc"), ("warehouse", "def")})
    assert two["server"] is None and not two["believe_failures"] and "2 different tools" in two["why"]


def test_the_report_and_trust_table_never_wait_on_the_optional_plot(tmp_path, monkeypatch):
    """From outside: without matplotlib (the README's install has none) `fit` died after 15 minutes before
    writing its trust table. The figures and the table come first; the plot is skipped in one line."""
    import json
    import sys

    from envace_mcp.policy.trust import read_trust
    from envace_mcp.worldmodel.fit import write_report
    from envace_mcp.worldmodel.measure import report

    (tmp_path / "adapter_model.safetensors").write_bytes(b"weights")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing it now fails, as where it is not installed
    result = report(_calls(), majority={"reserve": False})
    note = write_report(tmp_path, result, {"traces": "t"}, weights=tmp_path)
    assert note == "report.png skipped: it needs matplotlib (pip install matplotlib)"
    assert json.loads((tmp_path / "report.json").read_text())["overall"]["calls"] == 10
    table = read_trust(tmp_path)
    assert set(table.tools) == {"reserve"} and not table.notes and not (tmp_path / "report.png").exists()

"""Evaluation metrics on hand-computed inputs."""

from __future__ import annotations

import math

import pytest

from envace_mcp.envs.rewards import call_match, prf
from envace_mcp.eval.metrics import paired_difference, pass_at_k, pass_hat_k, summarize


def test_tool_call_precision_recall_f1_count_each_reference_call_once():
    made = [("get", {"id": 1}), ("get", {"id": 1}), ("put", {"id": 2})]
    reference = [("get", {"id": 1}), ("put", {"id": 3}), ("del", {})]
    m = call_match(made, reference)
    assert (m["made"], m["reference"], m["tp"], m["tp_name"], m["exact"]) == (3, 3, 1, 2, False)
    assert prf(m["tp"], m["made"], m["reference"]) == pytest.approx({"precision": 1 / 3, "recall": 1 / 3, "f1": 1 / 3})
    # argument order does not matter; the call order does for exact match
    assert call_match([("a", {"x": 1, "y": 2}), ("b", {})], [("a", {"y": 2, "x": 1}), ("b", {})])["exact"]
    assert not call_match([("b", {}), ("a", {})], [("a", {}), ("b", {})])["exact"]
    # no calls where none were needed is perfect; none where some were needed scores zero
    assert prf(0, 0, 0) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert prf(0, 0, 2) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_pass_hat_k_and_pass_at_k():
    assert pass_hat_k(3, 4, 2) == pytest.approx(3 / 6)  # C(3,2) / C(4,2)
    assert pass_hat_k(4, 4, 4) == 1.0 and pass_hat_k(3, 4, 4) == 0.0
    assert pass_at_k(1, 4, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2) / C(4,2)
    assert math.isnan(pass_hat_k(1, 2, 3))


def _record(task, passed, *, judge=False, fidelity=(), kind="k"):
    return {"task_id": task, "kind": kind, "repeat": 0, "run_id": None, "score": float(passed), "passed": passed,
            "judge_required": judge, "status": "finished",
            "calls": {"made": 1, "reference": 1, "tp": int(passed), "tp_name": 1, "exact": passed},
            "fidelity": list(fidelity), "tokens": {"act": 10}, "gate": {}, "real_calls": 1, "stopped_calls": 0,
            "wall_s": 1.0}


def test_summary_pass_k_fidelity_and_judged_tasks_apart():
    records = [_record("t1", True), _record("t1", True), _record("t2", True), _record("t2", False),
               _record("t3", False, judge=True),
               _record("t3", False, judge=True, fidelity=[{"score": 0.5, "exact": False, "error_ok": True}])]
    records[0]["fidelity"] = [{"score": 1.0, "exact": True, "error_ok": True,
                               "fields": {"echoed": 2, "echoed_ok": 2, "seen": 0, "seen_ok": 0, "new": 3, "new_ok": 3}},
                              {"score": 0.0, "exact": False, "error_ok": False,
                               "fields": {"echoed": 2, "echoed_ok": 0, "seen": 0, "seen_ok": 0, "new": 1, "new_ok": 0}}]
    s = summarize(records)
    assert s["success"]["tasks"] == 2 and s["success"]["repeats"] == 2
    assert s["success"]["pass@1"] == pytest.approx(0.75) and s["success"]["pass^2"] == pytest.approx(0.5)
    assert s["tool_calls"]["precision"] == pytest.approx(0.75)
    # echoed / seen / new fields pool over the fields of successful real results, not over calls
    assert s["fidelity"] == {"executed_rehearsed_calls": 2, "exact_match": 0.5, "field_accuracy": 0.5,
                             "error_prediction": 0.5, "echoed_field_accuracy": 0.5, "seen_field_accuracy": None,
                             "new_field_accuracy": 0.75, "echoed_fields": 4, "seen_fields": 0, "new_fields": 4}
    assert s["cost"]["tokens_act"] == 40 and s["judged_apart"]["tasks"] == 1


def test_paired_difference_has_a_bootstrap_interval_around_the_mean():
    a = {f"t{i}": 0.0 for i in range(20)}
    b = {f"t{i}": 1.0 if i < 10 else 0.0 for i in range(20)}
    d = paired_difference(a, b)
    assert d["tasks"] == 20 and d["mean"] == pytest.approx(0.5) and (d["better"], d["same"], d["worse"]) == (10, 10, 0)
    assert 0.2 < d["low"] < 0.5 < d["high"] < 0.8
    same = paired_difference(a, a)
    assert same["low"] == same["high"] == 0.0


def test_paired_difference_says_the_smallest_difference_its_tasks_could_detect():
    a = {f"t{i}": 0.0 for i in range(20)}
    b = {f"t{i}": 1.0 if i < 10 else 0.0 for i in range(20)}
    d = paired_difference(a, b)
    sd = (0.25 * 20 / 19) ** 0.5  # ten 1s and ten 0s
    assert d["detectable"] == pytest.approx((1.95996 + 0.84162) * sd / 20 ** 0.5, rel=1e-4)  # ≈ 0.32
    assert d["tasks_for_target"] == 207 and d["power"] == 0.8
    four_times = paired_difference({f"{k}{i}": v for i in range(4) for k, v in a.items()},
                                   {f"{k}{i}": v for i in range(4) for k, v in b.items()})
    assert four_times["detectable"] == pytest.approx(d["detectable"] / 2, rel=0.02)  # 4× the tasks: half
    assert paired_difference(a, a)["detectable"] == 0.0
    assert paired_difference({"t": 0.0}, {"t": 1.0})["tasks_for_target"] is None  # one task: no spread

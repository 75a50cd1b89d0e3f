import json

from envace_mcp.policy import Prediction
from envace_mcp.policy.fidelity import compare, field_split, leaves, misses
from envace_mcp.toolbox import ToolResult

REAL = ToolResult(tool="get_balance", structured_content={"account_id": "CHK-1", "balance": 12.5, "tags": ["a", "b"]})


def predicted(result=None, status="result", code=None):
    return Prediction(tool="get_balance", status=status, result=result, code=code)


def test_a_perfect_prediction_scores_one_and_numbers_compare_with_tolerance():
    match = compare(predicted({"account_id": "CHK-1", "balance": 12.501, "tags": ["a", "b"]}), REAL)
    assert match.score == 1.0 and match.fields == 4 and match.status_match


def test_partly_right_predictions_score_the_fraction_of_real_fields():
    match = compare(predicted({"account_id": "CHK-1", "balance": 99, "extra": 1}), REAL)
    assert match.score == 0.25 and set(match.mismatches) == {"balance", "tags[0]", "tags[1]"}


def test_status_decides_errors_and_invalid_rehearsals_score_zero():
    failed = ToolResult(tool="get_balance", is_error=True, error_kind="tool_error")
    assert compare(predicted(status="tool_error", code="EXECUTION_ERROR"), failed).score == 1.0
    assert compare(predicted({"balance": 1}), failed).score == 0.0
    assert compare(predicted(status="tool_error", code="EXECUTION_ERROR"), REAL).score == 0.0
    assert compare(predicted(status="invalid", code="MISSING_TAG"), REAL).score == 0.0


def test_leaves_flatten_nested_json():
    assert leaves({"a": {"b": [1, {"c": None}]}, "d": []}) == {"a.b[0]": 1, "a.b[1].c": None, "d": []}



def test_field_split_tells_echoed_and_earlier_seen_fields_from_what_the_environment_computed():
    call = {"from_account_id": "CHK-1", "to_account_id": "SAV-2", "amount": 50}
    earlier = [{"account_id": "CHK-1", "balance": 1000.0, "currency": "USD"}, '{"quote": 3.5, "currency": "USD"}']
    real = {"from_account_id": "CHK-1", "to_account_id": "SAV-2", "amount": 50.0, "currency": "USD",
            "from_balance": 950.0, "to_balance": 150.0, "transfer_id": "TXN-7"}
    # a world model that copies the call and the currency it read, but guesses the new balances wrong
    copied = {"from_account_id": "CHK-1", "to_account_id": "SAV-2", "amount": 50, "currency": "USD",
              "from_balance": 1000.0, "to_balance": 150.0, "transfer_id": "TXN-1"}
    assert field_split(copied, real, call, earlier) == {"echoed": 3, "echoed_ok": 3, "seen": 1, "seen_ok": 1,
                                                        "new": 3, "new_ok": 1}
    # seen means the same field name with the same value: an old balance is no new balance
    assert field_split(copied, {"from_balance": 1000.0}, call, earlier)["new"] == 1
    # no usable prediction (invalid, or an error predicted for a success) gets no field; JSON text is parsed
    assert field_split(None, '{"id": "CHK-1", "balance": 2}', {"account_id": "CHK-1"}) == \
        {"echoed": 1, "echoed_ok": 0, "seen": 0, "seen_ok": 0, "new": 1, "new_ok": 0}


def test_misses_name_the_fields_a_prediction_left_out_apart_from_those_it_got_wrong():
    real = '{"rooms": [{"id": "R-1", "seats": 4}, {"id": "R-2", "seats": 8}], "as_of": "09:00"}'
    guess = {"rooms": [{"id": "R-1", "seats": 6}], "as_of": "09:00"}  # one room left out, one seat count wrong
    assert misses(guess, real) == {"absent": ["rooms[1].id", "rooms[1].seats"], "wrong": ["rooms[0].seats"]}
    assert misses(None, real)["absent"] == ["rooms[0].id", "rooms[0].seats", "rooms[1].id", "rooms[1].seats", "as_of"]
    many = {"items": [{"name": "x" * 500}] * 50}
    cut = misses({}, many)["absent"]
    assert len(cut) == 20 and all(len(p) <= 200 for p in cut)  # bounded whatever the reply
    assert misses(json.loads(real), real) == {"absent": [], "wrong": []}

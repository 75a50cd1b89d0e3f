import pytest

from envace_mcp.toolbox.validation import ArgumentValidator

SCHEMA = {
    "type": "object",
    "properties": {
        "account": {"type": "string"},
        "amount": {"type": "number", "exclusiveMinimum": 0},
        "lines": {"type": "array", "items": {"type": "object", "properties": {"qty": {"type": "integer", "minimum": 1}},
                                             "required": ["qty"]}},
    },
    "required": ["account", "amount"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"amount": 5}, "account"),
        ({"account": "A", "amount": -1}, "amount"),
        ({"account": "A", "amount": 1, "lines": [{"qty": 0}]}, "lines[0].qty"),
        ({"account": "A", "amount": 1, "lines": [{}]}, "lines[0].qty"),
        ({"account": "A", "amount": 1, "memo": "x"}, "memo"),
        ({"account": 7, "amount": 1}, "account"),
    ],
)
def test_the_offending_field_is_named(arguments, field):
    errors = ArgumentValidator(SCHEMA).errors(arguments)
    assert errors and errors[0]["field"] == field


def test_valid_arguments_pass_and_non_objects_are_rejected():
    validator = ArgumentValidator(SCHEMA)
    assert validator.errors({"account": "A", "amount": 2.5}) == []
    assert "JSON object" in validator.errors(["A", 2])[0]["message"]
    assert validator.errors(None)[0]["field"] == ""


def test_an_invalid_schema_is_reported_and_does_not_block_calls():
    validator = ArgumentValidator({"type": "object", "properties": {"a": {"type": 12}}})
    assert validator.schema_error
    assert validator.errors({"a": 1}) == []


def test_a_call_checked_again_gets_the_same_answer_and_its_own_copy():
    """The gate, the act node and the toolbox check one call three times; the second and third are
    answered from what the first found, and nobody can change that answer for the others."""
    from envace_mcp.toolbox.validation import ArgumentValidator

    validator = ArgumentValidator({"type": "object", "properties": {"amount": {"type": "number", "minimum": 0}},
                                   "required": ["amount"]})
    first = validator.errors({"amount": -1})
    first[0]["message"] = "tampered"
    again = validator.errors({"amount": -1})
    assert again and again[0]["field"] == "amount" and again[0]["message"] != "tampered"
    assert validator.errors({"amount": 3}) == [] and validator.errors({}) != []
    assert validator.errors({"amount": float("nan")}) == validator.errors({"amount": float("nan")})


def test_each_missing_required_property_is_named_as_itself():
    validator = ArgumentValidator({"type": "object", "required": ["start", "end", "title", "organizer"],
                                   "properties": {n: {"type": "string"} for n in ("start", "end", "title", "organizer")}})
    errors = validator.errors({"start": "09:00"})
    assert sorted((e["field"], e["message"]) for e in errors) == [
        ("end", "'end' is a required property"),
        ("organizer", "'organizer' is a required property"),
        ("title", "'title' is a required property"),
    ]
    nested = ArgumentValidator({"type": "object", "properties": {"lines": {"type": "array", "items": {
        "type": "object", "required": ["sku", "qty"]}}}}).errors({"lines": [{}]})
    assert sorted(e["field"] for e in nested) == ["lines[0].qty", "lines[0].sku"]

"""Tools as text: the compact one-line-per-tool form, and the JSON form left exactly as it was."""

import json

from envace_mcp.policy.prompts import prompt_text, render_act, tool_for_template, tools_block
from envace_mcp.policy.tool_text import OUTPUT_KEY, signature, type_text
from envace_mcp.policy.types import ActRequest


def test_a_signature_marks_required_optional_defaults_enums_bounds_and_result_fields():
    params = {"type": "object", "required": ["account_id", "side", "quantity"], "properties": {
        "account_id": {"type": "string"}, "side": {"enum": ["buy", "sell"]}, "quantity": {"type": "integer", "minimum": 1},
        "limit_price": {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}], "default": None},
        "tags": {"type": "array", "items": {"type": "string"}}}}
    output = {"type": "object", "properties": {"id": {"type": "string"}, "fills": {"type": "array"}}}
    assert signature("place_order", params, output) == ('place_order(account_id: str, side: "buy"|"sell", quantity: int>=1, '
                                                        'limit_price?: num>0|null = null, tags?: list[str]) -> {id, fills[]}')
    assert type_text({"type": "object", "properties": {"street": {}, "city": {}}}) == "{street, city}"
    assert type_text({"type": ["string", "null"]}) == "str|null"


def test_the_compact_bank_tools_cost_under_half_the_json_and_say_what_the_json_says(bank_catalog):
    entries = [tool_for_template(s) for s in bank_catalog]
    compact, full = tools_block(entries, "compact"), tools_block(entries, "json")
    assert len(compact) < 0.5 * len(full)
    for spec in bank_catalog:
        line = next(x for x in compact.splitlines() if x.startswith(f"- {spec.name}("))
        for arg in spec.input_schema.get("properties", {}):
            assert (f"{arg}: " in line) == (arg in spec.input_schema.get("required", []))
    assert 'status?: "open"|"filled"|"cancelled"|"all" = "all"' in compact
    assert "amount: num>0" in compact and "-> {transfer_id, from_account_id" in compact
    assert "cancel_order(order_id: str) -> same as place_order" in compact


def test_the_json_form_and_native_templates_never_see_the_output_schema_key(bank_catalog, tiny_qwen3_dir):
    from transformers import AutoTokenizer

    entries = [tool_for_template(s) for s in bank_catalog]
    assert any(OUTPUT_KEY in e["function"] for e in entries)
    block = tools_block(entries, "json")
    assert OUTPUT_KEY not in block
    first = json.loads(block.split("<tools>\n")[1].splitlines()[0])
    assert list(first["function"]) == ["name", "description", "parameters"]  # as before the compact form existed
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_dir)  # a template that renders tools= itself
    chat, tools = render_act(ActRequest(task="hi", tools=bank_catalog))
    native = prompt_text(tokenizer, chat, tools, tool_format="compact")
    assert OUTPUT_KEY not in native and '"parameters"' in native  # its own format, whatever tool_format says
    tokenizer.chat_template = None  # no template: the text protocol, in the chosen form
    assert "- get_balance(account_id: str)" in prompt_text(tokenizer, chat, tools, tool_format="compact")
    assert '"name": "get_balance"' in prompt_text(tokenizer, chat, tools)

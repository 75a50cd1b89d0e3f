"""Tools as text: the compact one-line-per-tool form, the JSON form left exactly as it was, and the
format travelling with traces and adapters."""

import json

import pytest

from envace_mcp.policy.prompts import prompt_text, render_act, tool_for_template, tools_block
from envace_mcp.policy.tool_text import OUTPUT_KEY, signature, type_text
from envace_mcp.policy.types import ActRequest

pytestmark = pytest.mark.anyio


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


def test_the_tool_format_travels_from_traces_to_the_adapter_and_back_to_its_prompts(tiny_qwen3_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from envace_mcp.errors import UserError
    from envace_mcp.policy import load_policy
    from envace_mcp.policy.tool_text import adapter_tool_format, traces_tool_format, write_adapter_format
    from envace_mcp.traces import Trace

    def run(fmt):
        return Trace(run_id=fmt or "old", started_at=0.0, metadata={"tool_format": fmt} if fmt else {})

    assert traces_tool_format([run("compact"), run("compact")]) == "compact"
    assert traces_tool_format([run(None)]) == "json"  # recorded before the format was
    with pytest.raises(UserError, match="different tool formats"):
        traces_tool_format([run("compact"), run(None)])
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir), LoraConfig(r=2, target_modules=["q_proj"])
                   ).save_pretrained(tmp_path / "adapter")
    assert adapter_tool_format(tmp_path / "adapter") is None
    assert load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "adapter")).tool_format == "json"
    write_adapter_format(tmp_path / "adapter", "compact")
    policy = load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "adapter"))
    assert policy.tool_format == "compact"
    assert load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "adapter"), tool_format="json").tool_format == "json"
    assert policy.rehearse_format == "simulator"
    # the rehearse prompt format travels the same way
    from envace_mcp.policy.tool_text import traces_rehearse_format

    inline = Trace(run_id="i", started_at=0.0, rehearse_format="inline")
    assert traces_rehearse_format([inline, inline]) == "inline"
    assert traces_rehearse_format([run(None)]) == "simulator"
    with pytest.raises(UserError, match="different rehearse formats"):
        traces_rehearse_format([inline, run(None)])
    write_adapter_format(tmp_path / "adapter", "compact", "inline")
    assert load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "adapter")).rehearse_format == "inline"


async def test_a_recorded_run_says_which_tool_format_its_prompts_used(tiny_qwen3_dir, bank_catalog):
    from langchain_core.messages import HumanMessage

    from envace_mcp.graph import EnvaceContext, RunLimits, create_envace_graph
    from envace_mcp.policy import SamplingParams, load_policy
    from envace_mcp.traces import record_run

    policy = load_policy(str(tiny_qwen3_dir), tool_format="compact", sampling=SamplingParams(max_new_tokens=4))
    _, trace = await record_run(create_envace_graph().compile(), {"messages": [HumanMessage(content="hi")]},
                                context=EnvaceContext(policy=policy, tools=bank_catalog, mode="simulated",
                                                      limits=RunLimits(max_steps=1)), metadata={"note": "kept"})
    assert trace.metadata == {"tool_format": "compact", "note": "kept"}


def test_a_torn_or_unknown_envace_json_is_an_error_naming_it_not_a_silent_default_format(tmp_path):
    """Guessing an adapter's formats would prompt it in a shape it never learned."""
    from envace_mcp.errors import UserError
    from envace_mcp.policy.tool_text import adapter_file, adapter_formats

    assert adapter_formats(None) == {} and adapter_formats(tmp_path) == {}  # no envace.json: nothing said
    (tmp_path / "envace.json").write_text(json.dumps({"tool_format": "compact", "gate": {}, "later": 1}))
    assert adapter_formats(tmp_path) == {"tool_format": "compact"}  # keys it does not know are left alone
    assert adapter_file(tmp_path)["later"] == 1
    for text, says in [("{torn", "is not JSON"), ('["compact"]', "must hold an object"),
                       ('{"tool_format": "xml"}', "tool_format must be one of json, compact, not 'xml'"),
                       ('{"rehearse_format": null}', "rehearse_format must be one of")]:
        (tmp_path / "envace.json").write_text(text)
        with pytest.raises(UserError, match=says) as raised:
            adapter_formats(tmp_path)
        assert str(tmp_path / "envace.json") in str(raised.value)


def test_a_world_models_reply_budgets_are_read_bounded_from_its_envace_json():
    from envace_mcp.policy.tool_text import MAX_REPLY_TOKENS, reply_budgets

    assert reply_budgets({"reply_tokens": {"list_items": 429, "get_item": 90}}) == {"list_items": 523, "get_item": 116}
    hostile = {"reply_tokens": {"huge": 10**9, "zero": 0, "negative": -5, "text": "400", "flag": True, "": 10}}
    assert reply_budgets(hostile) == {"huge": MAX_REPLY_TOKENS}
    assert reply_budgets({"reply_tokens": [400]}) == {} and reply_budgets({}) == {}


async def test_a_rehearsal_gets_at_least_its_tools_budget(tiny_qwen3_dir, bank_catalog):
    """A listing longer than the run's rehearsal budget was cut on every call (inventory's `list_items`,
    402-429 tokens against 400): a world model carries each tool's budget from its longest training reply,
    which raises the run's budget for that tool and lowers none."""
    from langchain_core.messages import HumanMessage

    from envace_mcp.policy import RehearseRequest, SamplingParams, ToolCall, load_policy

    policy = load_policy(str(tiny_qwen3_dir), rehearse_format="inline")
    policy.reply_budgets = {"get_balance": 9, "transfer": 2}
    sampling = SamplingParams(max_new_tokens=3, temperature=1.0, seed=0)

    def request(name):
        spec = next(s for s in bank_catalog if s.name == name)
        return RehearseRequest(call=ToolCall(id="c", name=name, arguments={}), tool=spec, allowed=list(bank_catalog),
                               history=[HumanMessage(content="What is my balance?")])

    raised = await policy.rehearse(request("get_balance"), sampling)
    assert raised.sampling.max_new_tokens == 9 and len(raised.completion_ids) <= 9
    kept = await policy.rehearse(request("transfer"), sampling)
    assert kept.sampling.max_new_tokens == 3 and len(kept.completion_ids) <= 3

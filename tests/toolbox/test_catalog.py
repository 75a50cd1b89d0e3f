from envace_mcp.toolbox.catalog import ToolAnnotations, ToolSpec, name_tools


def spec(server: str, name: str, **kw) -> ToolSpec:
    return ToolSpec.create(remote_name=name, server=server, description="d", input_schema=None,
                           output_schema=None, annotations=kw.pop("annotations", ToolAnnotations()))


def test_absent_annotations_take_the_spec_defaults():
    a = ToolAnnotations.from_hints(None)
    assert (a.read_only, a.destructive, a.idempotent, a.open_world) == (False, True, False, True)


def test_read_only_tools_are_never_destructive_and_partial_hints_keep_other_defaults():
    assert ToolAnnotations.from_hints({"readOnlyHint": True}).destructive is False
    partial = ToolAnnotations.from_hints({"idempotentHint": True})
    assert (partial.read_only, partial.destructive, partial.idempotent, partial.open_world) == (False, True, True, True)
    assert ToolAnnotations.from_hints({"destructiveHint": False, "openWorldHint": False}).open_world is False


def test_names_are_prefixed_only_where_two_servers_collide():
    named = name_tools({"bank": [spec("bank", "list_orders"), spec("bank", "transfer")],
                        "shop": [spec("shop", "list_orders"), spec("shop", "return_items")]})
    assert set(named) == {"bank_list_orders", "shop_list_orders", "transfer", "return_items"}
    assert named["bank_list_orders"].remote_name == "list_orders"


def test_a_tool_without_schema_gets_an_empty_object_schema_and_an_openai_shape():
    s = spec("a", "ping")
    assert s.input_schema == {"type": "object", "properties": {}}
    assert s.to_openai()["function"]["name"] == "ping"

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
    named, problems = name_tools({"bank": [spec("bank", "list_orders"), spec("bank", "transfer")],
                                  "shop": [spec("shop", "list_orders"), spec("shop", "return_items")]})
    assert problems == []
    assert set(named) == {"bank_list_orders", "shop_list_orders", "transfer", "return_items"}
    assert named["bank_list_orders"].remote_name == "list_orders"


def test_a_tool_without_schema_gets_an_empty_object_schema_and_an_openai_shape():
    s = spec("a", "ping")
    assert s.input_schema == {"type": "object", "properties": {}}
    assert s.to_openai()["function"]["name"] == "ping"


def test_a_name_another_tool_holds_leaves_out_only_the_tool_that_would_take_it():
    """A prefixed name follows from the config and keeps its tool; a listed name equal to it, or a second
    prefixed name alike (servers `a` and `a_b`), is left out with a problem line."""
    named, problems = name_tools({
        "bank": [spec("bank", "transfer")],
        "third": [spec("third", "bank_transfer"), spec("third", "ping")],
        "shop": [spec("shop", "transfer")],
        "a": [spec("a", "b_c")], "a_b": [spec("a_b", "c")], "z": [spec("z", "b_c"), spec("z", "c")],
    })
    assert list(named) == ["bank_transfer", "ping", "shop_transfer", "a_b_c", "z_b_c", "z_c"]
    assert named["bank_transfer"].server == "bank" and named["a_b_c"].server == "a"
    assert problems == [
        "server 'third': its tool 'bank_transfer' would be named 'bank_transfer', the name of server 'bank''s "
        "'transfer'; it is left out (rename one of the servers in the config to keep both)",
        "server 'a_b': its tool 'c' would be named 'a_b_c', the name of server 'a''s 'b_c'; it is left out "
        "(rename one of the servers in the config to keep both)",
    ]

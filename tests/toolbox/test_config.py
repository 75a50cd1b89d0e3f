import json

import pytest

from envace_mcp.errors import ConfigError
from envace_mcp.toolbox import Toolbox
from envace_mcp.toolbox.config import HttpServer, InProcessServer, StdioServer, load_servers
from probe_server import build


def test_the_mcp_servers_shape_users_already_have_is_read():
    servers = load_servers({"mcpServers": {
        "bank": {"command": "python", "args": ["-m", "x"], "env": {"K": "V"}},
        "shop": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer t"}},
    }})
    assert servers["bank"] == StdioServer(command="python", args=["-m", "x"], env={"K": "V"})
    assert isinstance(servers["shop"], HttpServer) and servers["shop"].headers == {"Authorization": "Bearer t"}


def test_type_aliases_disabled_entries_and_unknown_keys_are_tolerated():
    servers = load_servers({"mcpServers": {
        "a": {"type": "streamable-http", "url": "http://x/mcp", "autoApprove": []},
        "b": {"command": "srv", "disabled": True},
        "c": {"type": "stdio", "command": "srv", "timeout": 5},
    }})
    assert set(servers) == {"a", "c"}
    assert servers["c"].timeout == 5


def test_a_config_file_is_read_from_disk(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"s": {"command": "srv"}}}))
    assert load_servers(path)["s"].command == "srv"


@pytest.mark.anyio
async def test_an_in_process_server_object_stands_in_for_an_entry_and_is_the_server_called():
    probe = build()
    servers = load_servers({"probe": probe})
    assert servers["probe"] == InProcessServer(server=probe) and servers["probe"].server is probe
    async with Toolbox(servers) as toolbox:  # the spec the config became, not the object handed in
        result = await toolbox.call("echo", {"text": "hi"})
    assert result.structured_content == {"text": "hi", "count": 1}
    assert probe.calls == [{"tool": "echo", "arguments": {"text": "hi", "count": 1}}]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"mcpServers": {"x": {"args": []}}}, "needs 'command'"),
        ({"mcpServers": {"x": {"type": "sse", "url": "http://x"}}}, "SSE"),
        ({"mcpServers": {"x": {"command": "srv", "timeout": -1}}}, "timeout"),
        ({"mcpServers": {"x": 42}}, "expected an object"),
        ({"mcpServers": {}}, "no servers"),
        ({"mcpServers": []}, "must be an object"),
        ({"mcpServer": {"bank": {"command": "srv"}}}, "'mcpServer' would be read as a server's name; did you mean 'mcpServers'"),
        ({"mcp_servers": {"bank": {"command": "srv"}}}, "did you mean 'mcpServers'"),
    ],
)
def test_malformed_configs_get_a_clear_error_naming_the_problem(config, message):
    with pytest.raises(ConfigError, match=message):
        load_servers(config)


def test_a_missing_or_torn_config_file_is_reported(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_servers(tmp_path / "nope.json")
    torn = tmp_path / "torn.json"
    torn.write_text('{"mcpServers": {"s": {"comm')
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_servers(torn)


def test_a_server_named_like_the_key_is_still_a_server():
    assert list(load_servers({"server": {"command": "srv"}})) == ["server"]

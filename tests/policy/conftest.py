import pytest

from envace_mcp.eval import get_suite
from envace_mcp.testing import build_tiny_qwen3


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session")
def bank_tools():
    """The bank server's catalog entries, read through a real in-process session."""
    import anyio

    from envace_mcp.toolbox import Toolbox

    async def read():
        async with Toolbox({"bank": get_suite("bank").build_server()}) as toolbox:
            return list(toolbox.catalog)

    return anyio.run(read)

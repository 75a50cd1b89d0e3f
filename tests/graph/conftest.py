import pytest

from envace_mcp.eval import get_suite


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def bank():
    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "savings_minimum")
    return suite, task


@pytest.fixture(scope="session")
def bank_catalog():
    import anyio

    from envace_mcp.toolbox import Toolbox

    async def read():
        async with Toolbox({"bank": get_suite("bank").build_server()}) as toolbox:
            return list(toolbox.catalog)

    return anyio.run(read)

import pytest

from envace_mcp.envs import get_suite


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def bank():
    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "savings_minimum")
    return suite, task


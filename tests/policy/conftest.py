import pytest

from envace_mcp.testing import build_tiny_qwen3


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))

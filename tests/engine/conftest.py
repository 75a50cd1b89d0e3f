import pytest

from envace_mcp.engine import Engine, load_model


@pytest.fixture(scope="module")
def engine(tiny_qwen3_dir):
    return Engine(*load_model(str(tiny_qwen3_dir)), batch_window_s=0.05)

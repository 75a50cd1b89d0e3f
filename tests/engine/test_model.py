"""Choosing a dtype: bf16 only where the CPU does it natively (emulated bf16 is ~1.9x slower here)."""

import pytest
import torch

from envace_mcp.engine import model
from envace_mcp.errors import UserError


@pytest.mark.parametrize(("flags", "want", "said"), [({"fpu", "amx_bf16"}, torch.bfloat16, "native (amx_bf16)"),
                                                      ({"fpu", "avx512f"}, torch.float32, "emulated")])
def test_auto_picks_bf16_only_on_a_cpu_with_native_bf16_and_says_which(monkeypatch, caplog, flags, want, said):
    monkeypatch.delenv(model.DTYPE_ENV, raising=False)  # (the test suite pins it)
    monkeypatch.setattr(model, "cpu_flags", lambda: frozenset(flags))
    with caplog.at_level("INFO", logger="envace_mcp.engine.model"):
        assert model.resolve_dtype("auto") is want
    assert f"dtype auto -> {str(want).removeprefix('torch.')}" in caplog.text and said in caplog.text
    assert said in model.machine()
    assert model.autocast_bf16("auto") is (want is torch.bfloat16) and model.autocast_bf16(False) is False
    monkeypatch.setenv(model.DTYPE_ENV, "float32")  # pinned, whatever the CPU
    assert model.resolve_dtype("auto") is torch.float32 and model.autocast_bf16("auto") is False


def test_named_dtypes_the_checkpoints_own_and_a_clear_error_for_anything_else():
    assert model.resolve_dtype("bf16") is torch.bfloat16 and model.resolve_dtype(torch.float16) is torch.float16
    assert model.resolve_dtype("checkpoint") == "auto"  # transformers' word for the checkpoint's own dtype
    with pytest.raises(UserError, match="unknown dtype 'fp8'"):
        model.resolve_dtype("fp8")

"""Training: traces → rows, EnvACE role-wise GRPO math, SFT / GRPO trainers.

The names below load on first use (they need torch), so light modules of this package
(`envace_mcp.train.config`, `envace_mcp.train.run_setup`) import without it: the CLI checks its
options against them before anything heavy starts."""

from importlib import import_module
from typing import Any

# name -> the submodule that defines it
_WHERE = {"grpo_loss": "grpo", "group_advantages": "grpo", "kl_k3": "grpo", "role_advantages": "grpo",
          "token_logprobs": "grpo", "Batch": "rows", "Segment": "rows", "batch_logprobs": "rows",
          "collate": "rows", "segments": "rows"}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value

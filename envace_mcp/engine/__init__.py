"""The inference engine: token ids in, token ids and sampling logprobs out, batched.

Roles, prompts and tools live in `envace_mcp.policy`; this package knows the model, its tokenizer
and sampling settings only, so a policy backend (or a trainer) can drive it directly. Importing the
package does not import torch: `Engine` and `load_model` load it when first named.
"""

from typing import TYPE_CHECKING, Any

from envace_mcp.engine.types import Completion, Job, SamplingParams

if TYPE_CHECKING:
    from envace_mcp.engine.generation import Engine
    from envace_mcp.engine.model import load_model

__all__ = ["Engine", "Job", "Completion", "SamplingParams", "load_model"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from envace_mcp.engine.generation import Engine

        return Engine
    if name == "load_model":
        from envace_mcp.engine.model import load_model

        return load_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

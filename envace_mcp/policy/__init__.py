"""The shared policy: one model, act / rehearse / critique roles, several backends."""

from envace_mcp.errors import UserError
from envace_mcp.policy.base import Policy, PromptPolicy
from envace_mcp.policy.parsing import parse_act, parse_critique, parse_prediction
from envace_mcp.policy.roles import RolePolicies
from envace_mcp.policy.trust import require_report
from envace_mcp.policy.types import (
    ActOutput,
    ActRequest,
    Critique,
    CritiqueRequest,
    Example,
    Generation,
    ParseIssue,
    Prediction,
    RehearseRequest,
    SamplingParams,
    ToolCall,
)

__all__ = [
    # the seam
    "Policy",
    "PromptPolicy",
    "RolePolicies",
    "load_policy",
    # requests and results
    "ActRequest",
    "RehearseRequest",
    "CritiqueRequest",
    "Example",
    "Generation",
    "ActOutput",
    "Prediction",
    "Critique",
    "ToolCall",
    "ParseIssue",
    "SamplingParams",
    # parsers
    "parse_act",
    "parse_prediction",
    "parse_critique",
]


def load_policy(model: str | None = None, *, adapter: str | None = None, rehearse_adapter: str | None = None,
                unmeasured: bool = False, **kwargs):  # noqa: ANN201
    # keyword arguments go to TransformersPolicy (dtype, max_batch_size, role_sampling, seed, …)
    """A `TransformersPolicy` for a Hugging Face id or local folder; `None` is the embedded default.
    `"vllm:http://host:port/v1"`: a `VLLMPolicy` on that server (`adapter` is then hot-loaded into it).
    `rehearse_adapter`: the rehearse role runs the same model with this adapter instead (`RolePolicies`:
    a world model trained apart from the agent; on transformers a second copy of the weights). It must hold
    the trust table its report wrote (`policy.trust`), as in every entry point: a world model nobody measured
    is not one a gate should read; `unmeasured=True` is the explicit opt-in, for research on such models.
    Each adapter's trust table is read once, here, and carried by the policy (`policy.trust`)."""
    if rehearse_adapter is not None:
        if not unmeasured:
            require_report(rehearse_adapter)

        act = load_policy(model, adapter=adapter, **kwargs)
        kwargs.pop("constrain_calls", None)  # constrained decoding shapes tool calls, which rehearsals do not write
        kwargs.pop("tool_format", None)  # each adapter renders the tools as its envace.json says
        rehearse = load_policy(model, adapter=rehearse_adapter, **kwargs)
        return RolePolicies(act, rehearse, name=f"{act.name} + rehearse adapter {rehearse_adapter}")
    from envace_mcp.policy.vllm import PREFIX, VLLMPolicy  # the HTTP client: not on every import of policy

    if model is not None and model.startswith(PREFIX):
        if kwargs.pop("constrain_calls", False):
            raise UserError("constrained tool calls run on the transformers backend; a vLLM server does not take them")

        return VLLMPolicy.from_url(model[len(PREFIX):], adapter=adapter, **kwargs)
    from envace_mcp.policy.transformers import TransformersPolicy  # torch: only when a model loads

    return TransformersPolicy.from_pretrained(model, adapter=adapter, **kwargs)

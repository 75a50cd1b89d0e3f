"""Two policies behind one: the act role (and critique) from one, the rehearse role from another.

EnvACE trains one model in both roles. With a small model and one LoRA adapter that is a trade: rows
that teach the world model the agent's own errors (mostly the server's refusals) pull the shared
weights toward refusing, and the act role can stop calling tools while its rehearse role learns to
foresee the agent's failures. `RolePolicies` pairs an agent with a world model trained apart — the same
base model with a second adapter (`load_policy(..., rehearse_adapter=DIR)`), or any other policy — and
leaves the graph, the gate and the traces as they are. What the pairing does on the bundled bank suite
is measured in docs/evidence.md ("The gate").

Cost: each policy holds its own weights (a second copy of the base model for a second adapter on the
transformers backend; with `vllm:` two clients of one server, each hot-loading its adapter under a
name of its own, tests/policy/test_vllm.py), and an inline rehearsal no longer reuses the act turn's
cached prefix, so every rehearsal prefills its whole prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace_mcp.errors import UserError
from envace_mcp.policy.trust import require_report
from envace_mcp.policy.types import (
    ActOutput,
    ActRequest,
    Critique,
    CritiqueRequest,
    Generation,
    Prediction,
    RehearseRequest,
    SamplingParams,
)

if TYPE_CHECKING:
    from envace_mcp.policy.base import Policy


class RolePolicies:
    """A `Policy` whose act and critique turns come from `act` and whose rehearsals come from `rehearse`.
    Each generation records its own policy's name as its model; the trace's formats are the ones each role
    rendered its prompts in (`tool_format` of the act policy, `rehearse_format` of the rehearse policy)."""

    def __init__(self, act: Policy, rehearse: Policy, *, name: str | None = None) -> None:
        self.act_policy = act
        self.rehearse_policy = rehearse
        self.name = name or f"{getattr(act, 'name', 'policy')} + rehearse: {getattr(rehearse, 'name', 'policy')}"

    @property
    def tool_format(self) -> str | None:
        return getattr(self.act_policy, "tool_format", None)

    @property
    def sampling_given(self) -> bool:
        return bool(getattr(self.act_policy, "sampling_given", False) or getattr(self.rehearse_policy, "sampling_given", False))

    @property
    def adapter(self) -> Any:
        """The world model's adapter folder as read when it loaded (`policy.adapter.Adapter`)."""
        return getattr(self.rehearse_policy, "adapter", None)

    @property
    def adapter_folder(self) -> Any:
        """The world model's adapter: its envace.json says how far to trust its rehearsals."""
        return getattr(self.rehearse_policy, "adapter_folder", None)

    @property
    def trust(self) -> Any:
        """The world model's trust table (`policy.trust.TrustTable`), read when its adapter loaded."""
        return getattr(self.rehearse_policy, "trust", None)

    @property
    def recall(self) -> Any:
        """The logged calls the world model recalls (`policy.recall.CallLog`), read when its adapter loaded."""
        return getattr(self.rehearse_policy, "recall", None)

    @property
    def rehearse_format(self) -> str | None:
        return getattr(self.rehearse_policy, "rehearse_format", None)

    async def act(self, request: ActRequest, sampling: SamplingParams | None = None) -> Generation[ActOutput]:
        return await self.act_policy.act(request, sampling)

    async def rehearse(self, request: RehearseRequest, sampling: SamplingParams | None = None) -> Generation[Prediction]:
        return await self.rehearse_policy.rehearse(request, sampling)

    async def critique(self, request: CritiqueRequest, sampling: SamplingParams | None = None) -> Generation[Critique]:
        return await self.act_policy.critique(request, sampling)

    def as_chat_model(self, *, sampling: SamplingParams | None = None) -> Any:
        """The act role as a LangChain chat model (as `PromptPolicy.as_chat_model`)."""
        return self.act_policy.as_chat_model(sampling=sampling)


def with_world_model(policy: Policy, world_model: Policy | str | Path) -> RolePolicies:
    """`policy` acting and `world_model` rehearsing: a policy, or the folder of a world model fitted to your
    tools (`envace world-model fit`), loaded on `policy`'s own base model. A folder must hold the trust
    table its report wrote (`trust.json`): a world model nobody measured is not one the gate should read."""
    if not isinstance(world_model, (str, Path)):
        return RolePolicies(policy, world_model)
    folder = Path(world_model)
    if not (folder / "adapter_config.json").is_file():
        raise UserError(f"world model {str(folder)!r}: no adapter there (adapter_config.json); fit one with "
                        "envace world-model fit --traces DIR --out DIR")
    require_report(folder)
    source = getattr(policy, "model_source", None)
    if source is None:
        raise UserError("this policy does not say which base model it runs, so the world model cannot be loaded on "
                        "it: pass world_model=load_policy(MODEL, adapter=FOLDER) instead of the folder")
    from envace_mcp.policy import load_policy  # a cycle at the top: the package imports this module

    rehearse = load_policy(None if source == "embedded" else str(source), adapter=str(folder))
    return RolePolicies(policy, rehearse, name=f"{getattr(policy, 'name', 'policy')} + world model {folder}")

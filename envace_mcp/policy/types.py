"""What the policy's roles take and give back.

Every generation carries the text, the parsed result and — for backends that have them — the exact
prompt token ids, completion token ids and per-token sampling logprobs: what GRPO trains on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, ConfigDict, Field

from envace_mcp._formats import RehearseFormat
from envace_mcp.engine.types import SamplingParams
from envace_mcp.toolbox import ToolSpec

Role = Literal["act", "rehearse", "critique"]

REHEARSE_MAX_NEW_TOKENS = 400
"""The rehearse role's token budget wherever a run starts (`envace demo/run/eval`, the served graph): a
tool's reply can be far longer than a tool call (a retail order runs to ~360 tokens), and a rehearsal cut
short parses as no prediction."""


def role_sampling(params: SamplingParams, rehearse_max_new_tokens: int | None = None) -> dict[Role, SamplingParams]:
    """`params` for every role, the rehearse role with its own token budget when given (`None`: the same).
    A tool's reply can be far longer than a tool call, and a rehearsal cut short is no prediction."""
    rehearse = (params if rehearse_max_new_tokens is None
                else params.model_copy(update={"max_new_tokens": rehearse_max_new_tokens}))
    return {"act": params, "rehearse": rehearse, "critique": params}


def context_sampling(policy: Any) -> dict[Role, SamplingParams]:
    """A run's per-role sampling when its context names none: `run_sampling`, unless the policy was given
    sampling of its own (`load_policy(sampling=..., role_sampling=...)`), which it then keeps (`{}`)."""
    return {} if getattr(policy, "sampling_given", False) else run_sampling()


def run_sampling(max_new_tokens: int = 160, temperature: float = 0.0, seed: int = 0,
                 rehearse_max_new_tokens: int = REHEARSE_MAX_NEW_TOKENS) -> dict[Role, SamplingParams]:
    """How a run samples unless told otherwise, in every form (`envace demo/run/eval`, the graph's
    context, the served graph, the drop-ins): greedy, so a run can be repeated; 160 tokens for a turn of
    the agent, `REHEARSE_MAX_NEW_TOKENS` for a rehearsal. Training rollouts sample at the policy's own
    temperature instead (EnvACE's 1.0)."""
    return role_sampling(SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed),
                         rehearse_max_new_tokens)



class ParseIssue(BaseModel):
    """Something the parser noticed or repaired in model output."""

    model_config = ConfigDict(frozen=True)

    code: str
    message: str
    snippet: str = ""


class ToolCall(BaseModel):
    """One tool call proposed by the act role."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: Any = Field(default_factory=dict)
    """A JSON object normally; whatever the model wrote otherwise (validation rejects it later)."""

    def as_langchain(self) -> dict[str, Any]:
        return {"name": self.name, "args": self.arguments if isinstance(self.arguments, dict) else {"__raw__": self.arguments},
                "id": self.id, "type": "tool_call"}


class ActOutput(BaseModel):
    """The act role's turn: tool calls, or a final answer when there are none."""

    tool_calls: list[ToolCall] = Field(default_factory=list)
    content: str = ""
    """The text outside tool calls and thinking."""
    thinking: str | None = None
    issues: list[ParseIssue] = Field(default_factory=list)

    @property
    def final_answer(self) -> str | None:
        return None if self.tool_calls else self.content

    def reply_text(self, raw: str) -> str:
        """The text of the turn's AI message: the text beside the calls, or the answer (the model's raw
        text when the parser kept none)."""
        return self.content if self.tool_calls else (self.content or raw)

    @property
    def malformed(self) -> bool:
        """Some tool call in the output could not be recovered."""
        return any(i.code == "invalid_tool_call" for i in self.issues)


PredictionStatus = Literal["result", "tool_error", "invalid"]

REHEARSAL_ERROR_CODES = (
    # the tool call itself, as EnvACE's simulator judges it (predicted tool errors)
    "INVALID_TOOL_CALL_FORMAT",
    "TOOL_NOT_AVAILABLE",
    "INVALID_PARAMETERS",
    "EXECUTION_ERROR",
    # the rehearsal output, as our parser judges it (typed rehearsal errors)
    "EMPTY_OUTPUT",
    "MISSING_TAG",
    "MALFORMED_TAG",
    "INVALID_JSON",
    "WRONG_TYPE",
    "OUTPUT_SCHEMA_MISMATCH",
    "NOT_A_TOOL_REPLY",
    # no rehearsal was sampled: its prompt and token budget did not fit the model's context
    "PROMPT_TOO_LONG",
)


class Prediction(BaseModel):
    """The rehearse role's prediction of one tool call's outcome.

    - `result`: a predicted successful result (`result` is the JSON the tool would return);
    - `tool_error`: a predicted tool error (`error_tool_call` with `code` and `details`);
    - `invalid`: the rehearsal itself is unusable (`code` says why; `result` keeps what parsed).
    """

    tool: str
    arguments: Any = None
    status: PredictionStatus
    result: Any = None
    code: str | None = None
    message: str = ""
    details: Any = None
    repaired: bool = False
    confidence: float | None = None
    """How sure the rehearse role was of this outcome: `p_error` for a predicted failure, 1 − `p_error` for
    a result where the status was decoded first; else the probability it gave the first token it wrote.
    `None` when the backend reports no logprobs."""
    p_error: float | None = None
    """The model's own probability that the call fails, read off its status decision (the mass on tokens
    opening an error reply over the mass on tokens opening any reply: `reply.ReplyConstraint`). `None`
    where the rehearsal was not decoded status first (the simulator format, a chat-model or vLLM backend)."""
    text: str | None = None
    """Inline rehearsals: the tool turn as the model wrote it (what stands in for the tool's reply in
    simulated mode, so the trajectory continues the rehearsal's own tokens)."""
    copied: list[str] = Field(default_factory=list)
    """Fields of `result` set by its world model's copy rules (`copying`) from the call's arguments or the
    run's earlier replies, not as the model wrote them (`text` keeps what it wrote)."""
    partial: bool = False
    """Its result was decided first and then cut at the token budget or written off its schema (`CUT`,
    `OFF_SCHEMA`): a prediction of the status, but not a reply that was read whole, so a gate treats it as
    it treats an unusable one (it fails closed where told to, and never stands in for approval)."""
    ruled: str | None = None
    """The fact of the call that decided a predicted failure by its world model's status rule
    (`status_rules`), where one did, not the model."""

    @property
    def predicts_error(self) -> bool:
        return self.status == "tool_error"


class Critique(BaseModel):
    """A self-evaluation of an imagined trajectory (test-time rehearsal)."""

    success: bool | None = None
    """`None` when the critique gave no verdict."""
    pitfalls: str = ""
    advice: str = ""
    text: str = ""


T = TypeVar("T")


class Generation(BaseModel, Generic[T]):
    """One model turn: text, parsed result, and the exact tokens and logprobs behind it."""

    role: Role
    text: str
    parsed: T
    sampling: SamplingParams
    model: str | None = None
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    """log p(token) under the sampling distribution (logits / temperature), one per completion token."""
    finish_reason: Literal["stop", "length"] | None = None
    prompt_format: RehearseFormat | None = None
    """Rehearse generations: which prompt they answered (`RehearseFormat`)."""
    turn_close: str | None = None
    """Inline rehearsals: the text the chat template closes a tool turn with after its content
    (e.g. `"\\n</tool_response>"`): what SFT appends to a real reply to make the target."""


@dataclass
class ActRequest:
    """What the act role sees."""

    task: str
    messages: list[BaseMessage] = field(default_factory=list)
    """The conversation after the task: AI turns with tool calls and tool results."""
    tools: list[ToolSpec] = field(default_factory=list)
    memory: str | None = None
    """Rendered rehearsal memory (predicted outcomes, mismatches, pitfalls), shown after the conversation."""
    instructions: str | None = None
    """Servers' instructions / domain policy."""


@dataclass
class Example:
    """An earlier real call and its result, shown to the rehearse role as a few-shot example."""

    tool: str
    arguments: Any
    result: str


@dataclass
class RehearseRequest:
    """What the rehearse role sees (EnvACE's simulator prompt, plus MCP's output schema)."""

    call: ToolCall
    tool: ToolSpec | None
    """`None` when the called tool is not in the catalog."""
    allowed: list[ToolSpec] = field(default_factory=list)
    history: list[BaseMessage] = field(default_factory=list)
    """The conversation so far, task included."""
    act_message: str = ""
    """The act role's latest raw message."""
    examples: list[Example] = field(default_factory=list)
    similar: list[Example] = field(default_factory=list)
    """Logged calls of the same tool from other runs, most like this one first (`recall.CallLog`): how this
    server answered calls like it."""
    context: ActRequest | None = None
    """The act role's request of the turn that proposed the call (inline rehearsal continues it, memory
    included); `None`: derived from `history` (the first human message is the task)."""


@dataclass
class CritiqueRequest:
    """An imagined trajectory for the critique role to judge."""

    task: str
    transcript: list[BaseMessage] = field(default_factory=list)
    earlier: list[str] = field(default_factory=list)
    """Earlier attempts' critiques (sequential test-time rehearsal)."""


class RawCompletion(BaseModel):
    """What a backend returns for one prompt, before parsing."""

    text: str
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: Literal["stop", "length"] | None = None
    p_error: float | None = None
    """An inline rehearsal held to a readable reply (`reply.ReplyConstraint`): the model's P(error)."""
    refused: str | None = None
    """Why nothing was sampled (the prompt and `max_new_tokens` do not fit the model's context): the
    text is empty and the roles turn this into a parse failure (`PROMPT_TOO_LONG`), not a crash."""

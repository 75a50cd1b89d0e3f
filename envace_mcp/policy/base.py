"""The `Policy` seam and the prompt-based policy every text backend shares."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from envace_mcp.errors import UserError
from envace_mcp.policy.parsing import loads_lenient, parse_act, parse_critique, parse_prediction, parse_tool_turn
from envace_mcp.policy.prompts import ChatMessage, render_act, render_critique, render_inline, render_rehearse
from envace_mcp.policy.types import (
    ActOutput,
    ActRequest,
    Critique,
    CritiqueRequest,
    Generation,
    ParseIssue,
    Prediction,
    RawCompletion,
    RehearseFormat,
    RehearseRequest,
    Role,
    SamplingParams,
)

if TYPE_CHECKING:
    from envace_mcp.toolbox.catalog import ToolSpec

REHEARSE_STOP = ("</execution_result>",)


@runtime_checkable
class Policy(Protocol):
    """One model, several roles. The graph and the trainer talk to this and nothing else.

    Implementations coalesce concurrent calls (many graph runs at once) as they see fit; every call
    returns a `Generation` whose `parsed` field is typed and whose failures are data.
    """

    name: str

    async def act(self, request: ActRequest, sampling: SamplingParams | None = None) -> Generation[ActOutput]: ...

    async def rehearse(self, request: RehearseRequest, sampling: SamplingParams | None = None) -> Generation[Prediction]: ...

    async def critique(self, request: CritiqueRequest, sampling: SamplingParams | None = None) -> Generation[Critique]: ...


class PromptPolicy(ABC):
    """Renders each role's prompt, asks the backend for a completion, parses it.

    Subclasses implement `_complete` (and `_continue`, for inline rehearsal); sampling defaults can
    differ per role (`role_sampling`). `rehearse_format` picks the rehearse prompt (`RehearseFormat`).
    """

    name: str = "policy"
    rehearse_format: RehearseFormat = "simulator"
    adapter: Any = None
    """The adapter folder its weights were loaded with, as read once (`adapter.Adapter`; `use_adapter`)."""
    adapter_folder: str | None = None
    """That folder's path."""
    trust: Any = None
    """Its world model's trust table (`trust.TrustTable`), re-checked when the adapter loaded."""
    recall: Any = None
    """Logged calls its rehearsals recall (`recall.CallLog`: the adapter's `recall.jsonl`, or set by hand)."""
    copy_rules: Any = None
    """Reply fields its rehearsals copy by rule (`copying.RuleTable`: the adapter's `copy_rules.json`, or set
    by hand)."""
    reply_budgets: dict[str, int] = {}
    """Tool -> the least tokens a rehearsal of it is given (the adapter's `envace.json` `reply_tokens`): a
    reply cut at the budget leaves its fields unknown."""
    status_rules: Any = None
    """Failures its rehearsals predict by rule (`status_rules.StatusTable`: the adapter's `status_rules.json`,
    or set by hand)."""

    def __init__(self, *, sampling: SamplingParams | None = None, role_sampling: dict[Role, SamplingParams] | None = None):
        self.sampling = sampling or SamplingParams()
        self.role_sampling = dict(role_sampling or {})
        self.sampling_given = sampling is not None or bool(role_sampling)
        """Whether the caller chose how this policy samples: a run's context then leaves it to the policy
        instead of starting from `types.run_sampling` (`types.context_sampling`)."""

    def _sampling(self, role: Role, override: SamplingParams | None) -> SamplingParams:
        chosen = override or self.role_sampling.get(role) or self.sampling
        if role == "rehearse" and self.rehearse_format == "simulator" and not set(REHEARSE_STOP) <= set(chosen.stop):
            chosen = chosen.model_copy(update={"stop": tuple(chosen.stop) + REHEARSE_STOP})
        return chosen

    @abstractmethod
    async def _complete(self, role: Role, chat: list[ChatMessage], tools: list[dict[str, Any]] | None,
                        sampling: SamplingParams) -> RawCompletion:
        """One completion of a rendered chat (with `tools=` for the act role)."""

    async def _continue(self, role: Role, chat: list[ChatMessage], tools: list[dict[str, Any]] | None,
                        sampling: SamplingParams, reply_to: ToolSpec | None = None) -> tuple[RawCompletion, str]:
        """A completion that continues a chat rendered up to `prompts.TOOL_TURN_SLOT` (inline rehearsal),
        and the text that closes that turn (`prompts.inline_prompt`); `reply_to`: the `ToolSpec` whose
        reply is written (a backend that can holds it to a readable reply: `reply.ReplyConstraint`).
        Backends that only complete whole chats (chat-model APIs) cannot."""
        raise UserError(f"{type(self).__name__} cannot continue a rendered prompt, which inline rehearsal needs: "
                        "use rehearse_format='simulator'")

    def _generation(self, role: Role, raw: RawCompletion, parsed: Any, sampling: SamplingParams) -> Generation[Any]:
        return Generation(role=role, text=raw.text, parsed=parsed, sampling=sampling, model=self.name,
                          prompt_text=raw.prompt_text, prompt_ids=raw.prompt_ids, completion_ids=raw.completion_ids,
                          logprobs=raw.logprobs, finish_reason=raw.finish_reason)

    async def act(self, request: ActRequest, sampling: SamplingParams | None = None) -> Generation[ActOutput]:
        s = self._sampling("act", sampling)
        chat, tools = render_act(request)
        raw = await self._complete("act", chat, tools, s)
        parsed = parse_act(raw.text) if raw.refused is None else ActOutput(
            issues=[ParseIssue(code="prompt_too_long", message=raw.refused)])  # a turn with no call
        return self._generation("act", raw, parsed, s)

    def use_adapter(self, folder: Any) -> None:
        """Carry what an adapter folder holds (`adapter.Adapter`, read when its weights loaded; None: no
        adapter), in place of the last one's: its gate recommendation, trust table and recall log."""
        self.adapter = folder
        self.adapter_folder = str(folder.path) if folder is not None else None
        self.trust = folder.trust if folder is not None else None
        self.recall = folder.recall if folder is not None else None
        self.copy_rules = folder.rules if folder is not None else None
        self.status_rules = folder.status if folder is not None else None
        self.reply_budgets = dict(folder.budgets) if folder is not None else {}

    def recalled(self, request: RehearseRequest) -> RehearseRequest:
        """`request` with the logged calls most like it (`recall`), unless it brings its own."""
        if self.recall is None or request.similar or request.tool is None:
            return request
        return replace(request, similar=self.recall.similar(request.call, request.tool))

    async def rehearse(self, request: RehearseRequest, sampling: SamplingParams | None = None) -> Generation[Prediction]:
        run = self._sampling("rehearse", sampling)
        budget = self.reply_budgets.get(request.call.name, 0)
        s = run.model_copy(update={"max_new_tokens": budget}) if budget > run.max_new_tokens else run
        request = self.recalled(request)
        if self.rehearse_format == "inline":
            chat, tools = render_inline(request)
            raw, close = await self._continue("rehearse", chat, tools, s, reply_to=request.tool)
            if raw.refused is not None and s is not run:  # no room for the tool's budget: the run's, as before
                s = run
                raw, close = await self._continue("rehearse", chat, tools, s, reply_to=request.tool)
            parsed = (parse_tool_turn(raw.text, request.call, request.tool, close, cut=raw.finish_reason == "length")
                      if raw.refused is None else _unusable(request, raw.refused))
            if parsed.code in ("UNKNOWN", "OUTPUT_SCHEMA_MISMATCH") and raw.p_error is not None:
                parsed = decided(parsed)
            if raw.p_error is not None:  # the model's own probability of the status it was held to decide
                parsed = parsed.model_copy(update={"p_error": raw.p_error, "confidence": (
                    raw.p_error if parsed.status == "tool_error" else 1 - raw.p_error
                    if parsed.status == "result" else None)})
            generation = self._generation("rehearse", raw, self._by_rule(parsed, request), s)
            return generation.model_copy(update={"prompt_format": "inline", "turn_close": close})
        raw = await self._complete("rehearse", render_rehearse(request), None, s)
        if raw.refused is not None and s is not run:
            s = run
            raw = await self._complete("rehearse", render_rehearse(request), None, s)
        parsed = (parse_prediction(raw.text, request.call, request.tool) if raw.refused is None
                  else _unusable(request, raw.refused))
        parsed = self._by_rule(parsed, request)
        generation = self._generation("rehearse", raw, parsed, s)
        return generation.model_copy(update={"prompt_format": "simulator"})

    def _by_rule(self, prediction: Prediction, request: RehearseRequest) -> Prediction:
        """`prediction` with the fields its copy rules set, then the failure its status rules predict."""
        if self.copy_rules is not None:
            prediction = self.copy_rules.apply(prediction, request)
        return self.status_rules.apply(prediction, request) if self.status_rules is not None else prediction

    def as_chat_model(self, *, sampling: SamplingParams | None = None) -> Any:
        """This policy's act role as a LangChain chat model (`PolicyChatModel`), for any agent: its
        replies' token ids and logprobs reach `record_run`, so the agent's runs can train this policy."""
        from envace_mcp.policy.chat_model import PolicyChatModel

        return PolicyChatModel(policy=self, sampling=sampling)

    async def critique(self, request: CritiqueRequest, sampling: SamplingParams | None = None) -> Generation[Critique]:
        s = self._sampling("critique", sampling)
        raw = await self._complete("critique", render_critique(request), None, s)
        return self._generation("critique", raw, parse_critique(raw.text), s)


def decided(prediction: Prediction) -> Prediction:
    """A result that a rehearsal held status first (`reply.ReplyConstraint`) decided on and could not finish
    as its schema asks: cut at its token budget (`CUT`: what parsed before the cut, the rest unknown), or a
    value that breaks the schema where the hold does not look (`OFF_SCHEMA`: a string's format or pattern;
    its fields scored as written). Either way its status was decided, and it predicts it. An error's
    message runs free and is read whole or cut, so only a result gets here."""
    text = (prediction.text or "").lstrip()
    if not text.startswith(("{", "[")):
        return prediction
    if prediction.code == "OUTPUT_SCHEMA_MISMATCH":
        return prediction.model_copy(update={
            "status": "result", "code": "OFF_SCHEMA", "partial": True,
            "message": f"a result its output schema refuses where decoding does not check it ({prediction.message})"})
    try:
        value, _ = loads_lenient(text)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, dict) and "error_tool_call" in value:  # an error written as JSON: not a result
        return prediction
    return prediction.model_copy(update={
        "status": "result", "result": value if isinstance(value, (dict, list)) else None, "code": "CUT", "partial": True,
        "message": "cut at the rehearsal's token budget: a result, its fields after the cut unknown"})


def _unusable(request: RehearseRequest, why: str) -> Prediction:
    """A rehearsal that was never sampled: unusable, which a gate treats as it treats any unusable one."""
    return Prediction(tool=request.call.name, arguments=request.call.arguments, status="invalid",
                      code="PROMPT_TOO_LONG", message=why)

"""Rehearsals held to a readable tool reply while they are decoded, and the model's own P(error).

An inline rehearsal is the tool's reply, written where the server's would go. Left to itself a small
model writes markup (`<tool_call>`, the next act turn), half a JSON object, or an object its tool's
`outputSchema` refuses, and each is a rehearsal nobody can read. `ReplyConstraint` decides the status
first and then holds the reply to it:

- the first token decides: an error reply (`Error executing tool …`, how MCP servers' failures read) or
  a result — for a tool with an `outputSchema`, a JSON value of its kind (an object for object schemas,
  each key one the schema declares, the object closed only once every required key is there:
  `json_prefix.CallScanner`); without one, JSON of the kind its logged replies were where a fit learned
  one (`copying.RuleTable.reply_kind`: a flight search is a list), else JSON or plain text, never markup;
- `p_error` is read off that first decision: the probability mass the model puts on tokens that open an
  error, over the mass on tokens that open either kind of reply (the 256 likeliest tokens: the rest
  carry nothing measurable). It is the model's own P(error), whatever the greedy choice (a result of
  another kind than its log's still counts as a result);
- a JSON reply ends as soon as its value is complete (only end-of-turn may follow), and cannot end
  before; an error's message and a plain-text result run free to the end of the turn.

A reply cut at the token budget before its first token decided stays unreadable, and the parser calls it
`UNKNOWN` (never a prediction); one cut inside a result had decided it, and predicts that result (`CUT`,
`base.decided`). The engine records each token's logprob under the masked distribution; `shifts`
turns it back into the model's own (`log p = log p_masked + logsumexp(masked) − logsumexp(all)`, at the
sampling temperature), so a recorded rehearsal's logprobs are what a trainer recomputes. Its tokens were
still drawn from the masked distribution, so GRPO rollouts decode without the hold
(`TransformersPolicy(constrain_rehearsals=False)`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import torch

from envace_mcp.policy.constrained import TokenText
from envace_mcp.policy.json_prefix import CallScanner, ScanState, Violation, openings

ERROR_OPENING = "Error"
"""How an MCP server's failure reads in its tool message (`Error executing tool <name>: …`)."""
DECIDING = 256
"""Candidates (likeliest first) whose mass decides P(error) at the first token."""
CANDIDATES = 64
"""Candidates tried per step after the first (the vocabulary is scanned when none fits)."""
MAX_BLANK = 12
"""Blank characters in a row between JSON tokens (a 2-space indented reply nests 5 deep in 12)."""
MAX_NUMBER = 32
"""Characters of one JSON number (a float's 17 digits, a sign, a point and an exponent fit easily)."""
_NUMBER_PREFIX = re.compile(r"-?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?)?")
_JSON_START = '{["-0123456789tfn'
_PREFIX = '<tool_call>{"name": "reply", "arguments": '


class ReplyConstraint:
    """Masks the logits of one inline rehearsal of `tool` (see the module); `restrict` is the engine's
    hook. After decoding, `p_error` holds the model's P(error) (None if it never reached a decision)."""

    def __init__(self, output_schema: Any, token_text: TokenText, end_ids: set[int], *, kind: str | None = None,
                 special_ids: set[int] = frozenset(), stops: tuple[str, ...] = (), temperature: float = 0.0) -> None:
        self.schema = output_schema if isinstance(output_schema, dict) and output_schema else None
        declared = self.schema.get("type") if self.schema else None
        self.wants_object = declared == "object" or (declared is None and self.schema is not None
                                                     and "properties" in self.schema)
        opens = openings(self.schema) if self.schema is not None and not self.wants_object else None
        self.firsts = "{" if self.wants_object else opens or (_JSON_START if self.schema is not None else "{[")
        """The characters a JSON reply may open with: its schema's kinds (no schema: an object or a list)."""
        self.shape = {"object": "{", "array": "["}.get(kind or "") if self.schema is None else None
        """Where the tool declares no schema, the opening its logged replies had (`kind`: "object" or "array");
        a result that opens otherwise still counts as the model's belief in success, but is not written."""
        self.token_text = token_text
        self.end_ids = set(end_ids)
        self.special_ids = set(special_ids) - self.end_ids
        """Template tokens (`<|im_start|>`): inside a JSON value they are text no server writes."""
        self.stops = tuple(s for s in stops if s)
        """Stop strings (the tool turn's close): written inside a JSON string they would cut it short."""
        self.scanner = _ReplyScanner(self.schema if self.wants_object else {})
        self.state = self.scanner.start()
        self.branch: str | None = None  # "error" | "json" | "text", once the reply's first characters decide
        self.text = ""
        self.fed = 0
        self.p_error: float | None = None
        self.temperature = temperature or 1.0  # greedy decoding records logprobs at temperature 1
        self.shifts: dict[int, float] = {}
        """Step -> what to add to the logprob the engine recorded there (a step left unmasked: nothing)."""

    # ------------------------------------------------------------------ the engine's hook

    def restrict(self, tokens: list[int], logits: torch.Tensor) -> None:
        for token in tokens[self.fed:]:
            self._take(self.token_text(token) if token not in self.end_ids else "")
        self.fed = len(tokens)
        if self.branch is None or self.branch == "json":
            whole = torch.logsumexp(logits.float() / self.temperature, dim=-1)
            self._decide(logits) if self.branch is None else self._json_step(logits)
            shift = float(torch.logsumexp(logits.float() / self.temperature, dim=-1) - whole)
            if shift:
                self.shifts[len(tokens)] = shift
        # an error's message and a plain-text result: free to the end of the turn

    def unmasked(self, logprobs: list[float] | None) -> list[float] | None:
        """The engine's recorded logprobs as the model's own (see the module)."""
        if logprobs is None:
            return None
        return [lp + self.shifts.get(i, 0.0) for i, lp in enumerate(logprobs)]

    def _take(self, text: str) -> None:
        opening = self.branch is None
        self.text += text
        if self.branch == "json" or (opening and self._opens_json(self.text.lstrip())):
            if self.branch is None:
                self.branch = "json"
                text = self.text.lstrip()
            try:
                self._feed(self.state, text)
            except Violation:  # only a fallback token gets here: stop holding this reply
                self.branch = "text"
            return
        body = self.text.lstrip()
        if opening and body and not ERROR_OPENING.startswith(body):
            self.branch = "error" if body.startswith(ERROR_OPENING) else "text"

    # ------------------------------------------------------------------ the first token: the status

    def _decide(self, logits: torch.Tensor) -> None:
        probs = torch.softmax(logits.float(), dim=-1)
        order = torch.topk(logits, min(DECIDING, logits.numel())).indices.tolist()
        error, result, shaped = [], [], []
        for token in order:
            side = self._side(token)
            if side == "error":
                error.append(token)
            elif side == "result":
                result.append(token)
                if self._shaped(token):
                    shaped.append(token)
        if self.p_error is None and self.text.strip() == "":  # the decision itself, not a later "E" → "rror" step
            mass_error = float(probs[error].sum()) if error else 0.0
            mass_result = float(probs[result].sum()) if result else 0.0
            total = mass_error + mass_result
            self.p_error = mass_error / total if total > 0 and math.isfinite(total) else None
        allowed = error + shaped
        if not allowed:  # nothing likely opens a reply: scan the vocabulary once for anything that does
            allowed = [t for t in torch.isfinite(logits).nonzero().flatten().tolist()
                       if (side := self._side(t)) == "error" or (side == "result" and self._shaped(t))]
        _keep(logits, allowed)

    def _shaped(self, token: int) -> bool:
        """Whether a result-opening token opens the kind of reply the tool's log showed (any, where unknown)."""
        return self.shape is None or (self.text + self.token_text(token)).lstrip()[:1] == self.shape

    def _side(self, token: int) -> str | None:
        """Which reply a token opens (continuing the text so far): "error", "result", or None (it opens
        none: markup, an end of turn, blank space)."""
        if token in self.end_ids:
            return None
        candidate = (self.text + self.token_text(token)).lstrip()
        if not candidate:
            return None
        if ERROR_OPENING.startswith(candidate) or candidate.startswith(ERROR_OPENING):
            return "error"
        if self.text.strip():  # inside "Error": only the word itself continues it
            return None
        if self._opens_json(candidate):
            try:
                self._feed(self.state.clone(), candidate)
            except Violation:
                return None
            return "result"
        if self.schema is not None or candidate[0] == "<":  # a structured tool answers JSON; markup is no reply
            return None
        return "result"

    def _opens_json(self, body: str) -> bool:
        if not body:
            return False
        return body[0] in self.firsts

    # ------------------------------------------------------------------ a JSON reply

    def _json_step(self, logits: torch.Tensor) -> None:
        if self._complete():
            _keep(logits, sorted(self.end_ids))
            return
        order = torch.topk(logits, min(CANDIDATES, logits.numel())).indices.tolist()
        allowed = [t for t in order if t not in self.end_ids and self._fits(t)]
        if not allowed:
            allowed = [t for t in torch.isfinite(logits).nonzero().flatten().tolist()
                       if t not in self.end_ids and self._fits(t)]
        if allowed:
            _keep(logits, allowed)

    def _fits(self, token: int) -> bool:
        text = self.token_text(token)
        if not text or token in self.special_ids or "<|" in text or "\ufffd" in text:
            return False  # template markup, or part of a character (which, alone, decodes to U+FFFD)
        if self.stops and any(stop in self.text[-64:] + text for stop in self.stops):
            return False
        try:
            self._feed(self.state.clone(), text)
        except Violation:
            return False
        return True

    def _feed(self, state: ScanState, text: str) -> None:
        """The scanner's, stricter where a reply must be JSON a parser reads: no control character inside
        a string, no number past `MAX_NUMBER` characters, no run of blank space past `MAX_BLANK` (a
        small model loops on newlines or digits until the budget is spent), nothing but blank space once
        the value is whole (a token such as `}}` closes the value and goes on)."""
        for c in text:
            if state.string is not None and ord(c) < 0x20:
                raise Violation("a control character inside a JSON string")
            if state.string is None and state.literal is None and c in " \t\r\n":
                state.tail = state.tail + c if state.tail.isspace() else c
                if len(state.tail) > MAX_BLANK:
                    raise Violation("a run of blank space")
            elif state.string is None:
                state.tail = ""
            self.scanner.char(state, c)
            if state.mode != "json" or (len(state.stack) == 1 and state.stack[0].expect not in ("value", "comma")):
                raise Violation("past the end of the reply")  # `}}`, `},`: closing the wrapper the scan reads it in
            if state.literal is not None and state.literal[0] in "-0123456789" and (
                    len(state.literal) > MAX_NUMBER or not _NUMBER_PREFIX.fullmatch(state.literal)):
                raise Violation(f"{state.literal!r} does not start a JSON number")

    def _complete(self) -> bool:
        """Whether the reply's JSON value is whole (a number at the top level: once it reads as one)."""
        state = self.state
        if len(state.stack) != 1 or state.string is not None:
            return False
        if state.literal is not None:
            try:
                json.loads(state.literal)
            except ValueError:
                return False
            return True
        return state.stack[0].expect == "comma"


class _ReplyScanner(CallScanner):
    """The call scanner on one reply (the arguments of a call named "reply"), checking nested objects and
    array items too: each key one its schema declares, every required one before it closes (FastMCP's
    nested models arrive as `$ref`s into `$defs`)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.root = schema
        super().__init__({"reply": schema})

    def start(self) -> ScanState:
        """The state at the reply's first character: inside the arguments of a call to "reply"."""
        state = ScanState()
        self.feed(state, _PREFIX)
        return state

    def _resolve(self, schema: Any, depth: int = 0) -> Any:
        """`schema` with a local `$ref` followed and a nullable `anyOf` / `oneOf` narrowed to its one
        non-null branch; anything else as it is (unchecked where it means several things)."""
        if not isinstance(schema, dict) or depth > 8:
            return schema
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = self.root
            for part in ref[2:].split("/"):
                target = target.get(part) if isinstance(target, dict) else None
            return self._resolve(target, depth + 1)
        for key in ("anyOf", "oneOf"):
            branches = [b for b in schema.get(key) or [] if not (isinstance(b, dict) and b.get("type") == "null")]
            if key in schema and len(branches) == 1:
                return self._resolve(branches[0], depth + 1)
        return schema

    def value_schema(self, state: ScanState, frame: Any) -> Any:
        if frame.role == "args":
            return self._resolve(super().value_schema(state, frame))
        schema = self._resolve(frame.schema)
        if not isinstance(schema, dict):
            return None
        if frame.kind == "array":
            return self._resolve(schema.get("items"))
        return self._resolve((schema.get("properties") or {}).get(frame.key))

    def start_value(self, state: ScanState, frame: Any, c: str) -> None:
        schema = self.value_schema(state, frame) if frame.role != "call" else None
        depth = len(state.stack)
        super().start_value(state, frame, c)
        if len(state.stack) > depth and state.stack[-1].role == "other":
            state.stack[-1].schema = schema

    def unused(self, state: ScanState, frame: Any) -> list[str] | None:
        if frame.role != "other" or frame.kind != "object":
            return super().unused(state, frame)
        props = (self._resolve(frame.schema) or {}).get("properties") if isinstance(self._resolve(frame.schema), dict) else None
        return [k for k in props if k not in frame.keys] if props else None

    def close(self, state: ScanState) -> None:
        frame = state.stack[-1]
        schema = self._resolve(frame.schema)
        if frame.role == "other" and frame.kind == "object" and isinstance(schema, dict):
            missing = [k for k in schema.get("required") or [] if k not in frame.keys]
            if missing:
                raise Violation(f"required field(s) missing: {', '.join(missing)}")
        super().close(state)


def _keep(logits: torch.Tensor, allowed: list[int]) -> None:
    """Mask every token but `allowed` (in place)."""
    if not allowed:
        return
    keep = torch.full_like(logits, float("-inf"))
    index = torch.tensor(allowed, dtype=torch.long, device=logits.device)
    keep[index] = logits[index]
    logits.copy_(keep)

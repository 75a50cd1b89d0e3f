"""Tool calls held to the tools' schemas while they are decoded (`constrain_calls=True`).

A small model names tools it has and then writes another tool's arguments (a `place_order` with
`transfer`'s `to_account_id`, `amount` and `memo`), which the gate then rejects for a missing `side`.
`CallConstraint` watches the act role's text as it is decoded and, inside a `<tool_call>` JSON block,
lets through only tokens that keep the call a call the schema accepts so far:

- `"name"`: one of the offered tools' names;
- `"arguments"` of a known tool: each key one the tool declares (once), a value that starts as its type
  says (`"` for a string, a digit or `-` for a number, `t`/`f`, `n` where null is allowed, `{`, `[`),
  a string enum one of its values, a number inside its `minimum` / `maximum` (exclusive or not; no
  `-` where the bound is 0 or more: a constraint that checked only the kind let a negative transfer
  `amount` through a `gt=0` schema), and the object closed only once every required key is there.

The characters are checked by `json_prefix.CallScanner`. Outside a `<tool_call>` block, and inside values
it does not check (free strings, numbers' digits, nested objects), any token goes. This is what OpenAI's strict function calling and vLLM's structured
outputs do for a whole reply, kept to the call so the model can still answer in plain text.

The logprob recorded for a constrained token is under the constrained distribution (the disallowed
tokens' mass removed), so a run decoded this way is an inference run: the trainer's recomputation would
not match it, and GRPO rollouts do not use it. What it changes for an agent is measured in
docs/evidence.md ("Constrained calls").
"""

from __future__ import annotations

from typing import Any

import torch

from envace_mcp.policy.json_prefix import CallScanner, ScanState, Violation

CANDIDATES = 64
"""Tokens checked per step, best first; the rest of the vocabulary is only scanned when none of these fits."""


class CallConstraint:
    """Masks the logits of one act generation (see the module). `restrict(tokens, logits)` is the engine's
    hook: `tokens` are those sampled so far, `logits` the next token's, masked in place.

    Args:
        tools: the act role's `tools=` (`{"type": "function", "function": {name, parameters}}`) or MCP-style
            `{name, inputSchema}` dicts.
        token_text: token id -> its text as it appears in the decoded completion (`TokenText`).
        prefix: text already in the completion before the first sampled token (tests; a prefilled call).
    """

    def __init__(self, tools: list[dict[str, Any]], token_text: TokenText, prefix: str = "") -> None:
        self.schemas: dict[str, dict[str, Any]] = {}
        for tool in tools:
            fn = tool.get("function", tool)
            schema = fn.get("parameters", fn.get("inputSchema")) or {}
            self.schemas[fn["name"]] = schema if isinstance(schema, dict) else {}
        self.token_text = token_text
        self.scanner = CallScanner(self.schemas)
        self.state = ScanState()
        self.fed = 0
        self.stats = {"steps": 0, "masked": 0, "scans": 0}
        self.scanner.feed(self.state, prefix)

    # ------------------------------------------------------------------ the engine's hook

    def restrict(self, tokens: list[int], logits: torch.Tensor) -> None:
        for token in tokens[self.fed:]:
            try:
                self.scanner.feed(self.state, self.token_text(token))
            except Violation:  # only an unconstrained fallback gets here; stop checking this call
                self.state = ScanState(mode="after")
        self.fed = len(tokens)
        if self.state.mode != "json":
            return
        self.stats["steps"] += 1
        order = torch.topk(logits, min(CANDIDATES, logits.numel())).indices.tolist()
        allowed = [t for t in order if self._fits(t)]
        if not allowed:  # none of the likeliest fits: scan the vocabulary (rare)
            self.stats["scans"] += 1
            finite = torch.isfinite(logits).nonzero().flatten().tolist()
            tried = set(order)
            allowed = [t for t in finite if t not in tried and self._fits(t)]
            if not allowed:  # nothing can continue this call: leave the model to it (the gate checks the call)
                return
        keep = torch.full_like(logits, float("-inf"))
        index = torch.tensor(allowed, dtype=torch.long, device=logits.device)
        keep[index] = logits[index]
        if len(allowed) < len(order):
            self.stats["masked"] += 1
        logits.copy_(keep)

    def _fits(self, token: int) -> bool:
        text = self.token_text(token)
        if not text:
            return False
        try:
            self.scanner.feed(self.state.clone(), text)
        except Violation:
            return False
        return True


class TokenText:
    """Token id -> the text it adds to a decoded completion, decoded once per id and kept.

    Decoding one id alone drops a leading space under SentencePiece tokenizers, so each id is decoded
    after an anchor token and the anchor's text cut off."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._anchor = tokenizer("a", add_special_tokens=False)["input_ids"][:1]
        self._anchor_text = tokenizer.decode(self._anchor, skip_special_tokens=False)
        self._texts: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            full = self.tokenizer.decode(self._anchor + [token], skip_special_tokens=False)
            text = full[len(self._anchor_text):] if full.startswith(self._anchor_text) else \
                self.tokenizer.decode([token], skip_special_tokens=False)
            self._texts[token] = text
        return text

"""Where a turn ends: the token ids that close one. No torch here, so a client of a remote engine
(`VLLMPolicy`) finds the same turn ends as our own engine without importing it."""

from __future__ import annotations

from typing import Any


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token id that ends a turn: the tokenizer's, the generation config's, ChatML's `<|im_end|>`."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return ids

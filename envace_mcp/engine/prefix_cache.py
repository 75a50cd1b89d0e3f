"""Keys/values of recent prompts, reused for the longest shared token prefix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class PrefixCache:
    """Keys/values of recent prompts, reused for the longest shared token prefix.

    Rehearse prompts of one task share their system prompt and tool list; act prompts of one
    conversation extend the previous turn's prompt. A prompt stored after reusing another's prefix
    keeps a reference to that prefix and a copy of its own new tokens only, so sixteen concurrent
    runs over one ~1,500-token system prompt hold it once, not sixteen times. Bounded by the tokens
    actually held (LRU). Entries belong to one state of the weights (`for_weights`): after a training
    step they would be another policy's keys/values, so they are dropped.

    Each entry also says how many of its first tokens were prefilled in whole fixed-position chunks
    (`Entry.canonical`, see `invariant`): a batch-invariant prompt reuses only those.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.entries: list[Entry] = []
        self.weights: int | None = None

    def for_weights(self, key: int) -> None:
        """Use the cache for weights identified by `key` (`weights_key`); entries of others are dropped."""
        if key != self.weights:
            self.clear()
            self.weights = key

    def clear(self) -> None:
        """Drop every entry (their keys/values are freed once no decode batch holds them)."""
        self.entries = []

    def lookup(self, ids: list[int], *, canonical: bool = False,
               ) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]], Entry | None]:
        """Length of the longest stored prefix of `ids` (leaving at least one token to run), its
        per-layer keys/values (1, kv heads, length, head dim) and the entry it came from; `canonical`:
        of the entries' chunk-prefilled tokens only."""
        best, hit = 0, None
        for entry in self.entries:
            n = common_prefix(entry.ids, ids, limit=min(len(ids) - 1, entry.canonical) if canonical else len(ids) - 1)
            if n > best:
                best, hit = n, entry
        if hit is None:
            return 0, [], None
        self.entries.remove(hit)
        self.entries.append(hit)
        return best, hit.keys_values(best), hit

    def store(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]], reused: int = 0,
              source: Entry | None = None, canonical: int = 0) -> None:
        """Remember `ids` with their keys/values `kv`; the first `reused` tokens came from `source`, the
        first `canonical` were prefilled in whole fixed-position chunks."""
        if self.max_tokens <= 0 or len(ids) > self.max_tokens:
            return
        self.entries = [e for e in self.entries if e.ids != ids]
        if source is not None and reused:
            self._split(source, reused)
        pieces = source.pieces_upto(reused) if source is not None and reused else []
        start = reused if pieces else 0
        own = [(k[:, :, start:].clone(), v[:, :, start:].clone()) for k, v in kv] if start else kv  # a copy frees the rest
        self.entries.append(Entry(list(ids), [*pieces, (own, start, len(ids))], canonical))
        while self.held_tokens() > self.max_tokens and len(self.entries) > 1:
            self.entries.pop(0)

    def _split(self, source: Entry, at: int) -> None:
        """Make token `at` a boundary between two of `source`'s pieces: a piece it falls inside becomes
        two (copies), in every entry that holds it, so a prompt reusing its first part does not keep the
        rest alive. Every entry holds each of its pieces whole."""
        for piece, start, end in source.pieces:
            if start < at < end:
                cut = at - start
                head = [(k[:, :, :cut].clone(), v[:, :, :cut].clone()) for k, v in piece]
                tail = [(k[:, :, cut:].clone(), v[:, :, cut:].clone()) for k, v in piece]
                for entry in {id(e): e for e in [*self.entries, source]}.values():
                    entry.pieces = [part for held in entry.pieces
                                    for part in ([(head, start, at), (tail, at, end)] if held[0] is piece else [held])]
                return

    def held_tokens(self) -> int:
        """Tokens whose keys/values are held (each stored piece once, however many prompts share it).
        Every piece an entry holds is used whole (`store` splits a piece it reuses in part), so this is the
        memory the cache keeps alive; a piece referenced for its first tokens only would keep all of
        its tokens alive uncounted (it did: 16k counted tokens held 1.46 GB, not 0.74, in GRPO rollouts)."""
        pieces = {id(p[0]): p for e in self.entries for p in e.pieces}
        return sum(end - start for _, start, end in pieces.values())


@dataclass
class Entry:
    ids: list[int]
    pieces: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], int, int]]
    """(per-layer keys/values of tokens [start, end), start, end), covering [0, len(ids)) in order."""
    canonical: int = 0
    """Its first tokens whose keys/values came from whole fixed-position prefill chunks (`invariant`)."""

    def pieces_upto(self, n: int) -> list[tuple[list[tuple[torch.Tensor, torch.Tensor]], int, int]]:
        return [(kv, start, min(end, n)) for kv, start, end in self.pieces if start < n]

    def keys_values(self, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        parts = self.pieces_upto(n)
        if len(parts) == 1:
            kv, start, end = parts[0]
            return [(k[:, :, : end - start], v[:, :, : end - start]) for k, v in kv]
        return [(torch.cat([kv[layer][0][:, :, : end - start] for kv, start, end in parts], dim=2),
                 torch.cat([kv[layer][1][:, :, : end - start] for kv, start, end in parts], dim=2))
                for layer in range(len(parts[0][0]))]


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def cache_of(config: Any, kv: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> Any:
    """A transformers `DynamicCache` holding the first `length` positions of `kv` (a `lookup`'s keys/values),
    for a forward pass to extend."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for layer, (keys, values) in enumerate(kv):
        cache.update(keys[:, :, :length], values[:, :, :length], layer)
    return cache


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))  # transformers 4.x


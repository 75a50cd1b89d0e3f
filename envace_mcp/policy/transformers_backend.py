"""The trainable backend: any Hugging Face causal LM, batched, with exact token ids and logprobs.

- Prompts are rendered with the model's own chat template, with `tools=` when the template takes
  them (Qwen3: `<tool_call>` format and the `enable_thinking` switch); otherwise the conversation
  is rewritten into the same text protocol (see `prompts.plain_chat`); a tokenizer without any
  template gets plain ChatML.
- Generation is our own loop over a KV cache, so every sampled token's logprob is recorded as
  log_softmax(logits / temperature)[token] — what a trainer recomputes from the same tokens
  (top-k / top-p only narrow the sampling, not the recorded distribution). Greedy (temperature 0)
  records log_softmax(logits).
- Concurrent requests share one decode batch (`Batcher`, continuous batching): a request that
  arrives while others decode joins at the next token step, and each result is returned when its
  row finishes. Each row samples with its own seeded generator, so results do not depend on which
  requests shared a batch.
- The rehearse role is a fresh chat (EnvACE), so there is no act prefix to reuse across roles; within
  one generation the prompt is encoded once and every new token reuses the KV cache.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy
import torch

from envace_mcp.errors import UserError
from envace_mcp.policy._batching import Batcher, ListFeed
from envace_mcp.policy._decode_attention import PREFIX_KW, SharedPrefixes, base_model, use_for_decoding
from envace_mcp.policy.base import PromptPolicy
from envace_mcp.policy.prompts import ChatMessage, plain_chat
from envace_mcp.policy.types import RawCompletion, Role, SamplingParams

_STOP_TAIL_TOKENS = 16


@dataclass
class _Job:
    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16}[dtype]
    except KeyError:
        raise UserError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16") from None


class TransformersPolicy(PromptPolicy):
    """Act, rehearse and critique with one transformers model (optionally under a LoRA adapter).

    Args:
        model, tokenizer: a loaded causal LM and its tokenizer (see `from_pretrained`).
        max_batch_size: most requests generated together.
        batch_window_s: how long a request waits for others to share its batch.
        enable_thinking: passed to chat templates that have the switch (Qwen3).
        seed: seeds the per-request RNG used when a request has no seed of its own.
        prefix_cache_tokens: how many prompt tokens' keys/values to keep for reuse (0 disables).
        kv_budget_gb: the most memory one decode batch's keys/values may take (GiB, padding included); a
            request that would take the batch past it waits until rows leave. "auto": 2 GiB on CPU
            (16 rows of 2.9k tokens for the embedded model in fp32, 5.8k in bf16), no limit on
            accelerators (size it to the GPU). None: no limit beyond `max_batch_size`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str | None = None,
        sampling: SamplingParams | None = None,
        role_sampling: dict[Role, SamplingParams] | None = None,
        max_batch_size: int = 16,
        batch_window_s: float = 0.01,
        enable_thinking: bool = False,
        seed: int = 0,
        prefix_cache_tokens: int = 32768,
        kv_budget_gb: float | Literal["auto"] | None = "auto",
    ) -> None:
        super().__init__(sampling=sampling, role_sampling=role_sampling)
        self.model = model
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self.enable_thinking = enable_thinking
        template = getattr(tokenizer, "chat_template", None)
        self.template_has_tools = bool(template) and "tools" in template
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        self.eos_ids = self._eos_ids()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        base = base_model(model)
        # transformers 5.2x renamed `past_key_values` to `cache`; accept both generations of the API
        self._cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        self.plain_cache = _plain_layers(model.config)
        """Every cache layer is plain full attention: rows can join a running batch and prompts can
        share a prefix (a sliding-window layer keeps only its window)."""
        self.decode_attention = use_for_decoding(model)
        """Whether one-token steps use the packed grouped-query attention (CPU models on `sdpa`)."""
        self.share_prefix = True
        """With `decode_attention`: a decode batch holds the prompt prefixes its rows share once (see
        `_DecodeBatch`); False gives every row its own copy (for comparisons)."""
        self.merge_lora = True
        """CPU generation under one plain LoRA adapter runs on merged copies of the adapted weights
        (see `_merged_lora`); False keeps peft's separate adapter path (for comparisons)."""
        _dense_head_input(model)
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        if kv_budget_gb == "auto":
            kv_budget_gb = 2.0 if next(model.parameters()).device.type == "cpu" else None
        self.kv_budget_gb: float | None = kv_budget_gb
        """See the class docstring. Long multi-turn runs (the shipped bank adapter: up to 12 calls, ~5k-token
        contexts) made 16 rows of fp32 keys/values (46 KB a token for the embedded model) the largest
        cost of a GRPO step."""
        self.prefill_stats: dict[str, float] = {"prompt_tokens": 0, "reused_tokens": 0, "prefill_s": 0.0, "decode_s": 0.0,
                                                "decode_steps": 0, "decode_rows": 0, "kv_waits": 0, "grouped_rows": 0}
        """Running totals: prompt tokens seen, of them reused from the prefix cache, seconds spent,
        decode steps (forward passes) and the rows they fed (rows / steps: the mean batch), requests that
        waited for room under `kv_budget_gb`, rows that joined a decode batch's prefix group (their
        shared prompt prefix held once, see `_DecodeBatch`)."""
        self.kv_peak_slots = 0
        """The most key/value slots a decode batch held (`_DecodeBatch.slots`), for benchmarks and tests."""
        self.batcher: Batcher[_Job, RawCompletion] = Batcher(self.generate_batch, max_batch=max_batch_size,
                                                             window_s=batch_window_s, stream=self.stream)

    def wait_idle(self) -> None:
        """Block until no generation runs. A stream's worker thread delivers its last result before it
        leaves its stream (and the merged LoRA weights); change the weights only after this returns."""
        with self._lock:
            pass

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path | None = None,
        *,
        adapter: str | Path | None = None,
        dtype: str | torch.dtype = "float32",
        device: str = "cpu",
        **kwargs: Any,
    ) -> TransformersPolicy:
        """Load a model by Hugging Face id or local folder; `None` loads the embedded default.

        `dtype` defaults to float32 so recorded logprobs match a trainer's recomputation closely;
        bfloat16 generates about twice as fast on CPUs with AMX.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if model is None:
            from envace_mcp.policy.embedded import EMBEDDED_NAME, embedded_model_dir

            model = embedded_model_dir()
            kwargs.setdefault("name", f"{EMBEDDED_NAME} (embedded)")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(model))
            lm = AutoModelForCausalLM.from_pretrained(str(model), dtype=_resolve_dtype(dtype))
        except OSError as exc:
            raise UserError(f"could not load model {str(model)!r}: {exc}") from exc
        if adapter is not None:
            from peft import PeftModel

            try:
                lm = PeftModel.from_pretrained(lm, str(adapter))
            except (OSError, ValueError) as exc:  # no adapter_config.json there, or not an adapter of this model
                raise UserError(f"could not load adapter {str(adapter)!r}: {exc}") from exc
        lm.to(device).eval()
        return cls(lm, tokenizer, name=kwargs.pop("name", str(model)), **kwargs)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(configured, int):
            ids.add(configured)
        elif configured:
            ids.update(int(i) for i in configured)
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != self.tokenizer.unk_token_id:
            ids.add(im_end)
        return ids

    # ------------------------------------------------------------------ prompts

    def render(self, chat: list[ChatMessage], tools: list[dict[str, Any]] | None) -> str:
        """The exact prompt text the model sees."""
        template = getattr(self.tokenizer, "chat_template", None)
        if not template:
            return _chatml(plain_chat(chat, tools))
        kwargs = {"enable_thinking": self.enable_thinking}
        if self.template_has_tools:
            return self.tokenizer.apply_chat_template(chat, tools=tools or None, add_generation_prompt=True,
                                                      tokenize=False, **kwargs)
        return self.tokenizer.apply_chat_template(plain_chat(chat, tools), add_generation_prompt=True,
                                                  tokenize=False, **kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def _complete(self, role: Role, chat: list[ChatMessage], tools: list[dict[str, Any]] | None,
                        sampling: SamplingParams) -> RawCompletion:
        prompt_text = self.render(chat, tools)
        prompt_ids = self.encode(prompt_text)
        seed = sampling.seed if sampling.seed is not None else self._rng.randrange(2**63)
        raw = await self.batcher.submit(_Job(prompt_ids, sampling, seed))
        return raw.model_copy(update={"prompt_text": prompt_text})

    # ------------------------------------------------------------------ generation

    def generate_batch(self, jobs: list[_Job]) -> list[RawCompletion]:
        """Generate every job (synchronous; rows join and leave one decode batch as in `stream`)."""
        feed: ListFeed[_Job, RawCompletion] = ListFeed(jobs)
        self.stream(feed, max(len(jobs), 1))
        return feed.results()

    def stream(self, feed: Any, max_rows: int) -> int:
        """Continuous batching (the batcher calls this in a worker thread): take jobs from `feed`,
        decode up to `max_rows` together, admit newly arrived jobs at every token step, deliver each
        result when its row finishes; return when no job is left. Returns the most rows decoded together."""
        with self._lock, torch.inference_mode():
            self.prefix_cache.for_weights(_weights_key(self.model))  # before the merge swaps weights in
            with _merged_lora(self.model, self.merge_lora):
                return self._stream(feed, max_rows)

    def _stream(self, feed: Any, max_rows: int) -> int:
        # Each prompt is prefilled alone (no padding waste, shared prefixes from the prefix cache),
        # then decoded with the other rows over one cache: one forward pass per token for all rows.
        device = next(self.model.parameters()).device
        batch = _DecodeBatch(self.model, self._cache_kw, device, max_rows, joinable=self.plain_cache,
                             shared_prefix=self.decode_attention and self.share_prefix,
                             budget_bytes=None if self.kv_budget_gb is None else self.kv_budget_gb * 2**30)
        if not batch.joinable:  # sliding-window layers keep per-layer lengths: one row at a time, its own cache
            max_rows = 1
        rows: list[_Row] = []
        waiting: collections.deque[tuple[_Job, Any]] = collections.deque()  # taken, not admitted: over the KV budget
        blocked = None  # the request now waiting for room (counted once)
        peak = 0
        while True:
            started = time.perf_counter()
            if len(rows) + len(waiting) < max_rows and (batch.joinable or not rows):
                waiting.extend(feed.take(max_rows - len(rows) - len(waiting)))
            admitted = 0
            while waiting and len(rows) < max_rows and (batch.joinable or not rows):
                job, ticket = waiting[0]
                remaining = [row.remaining() for row in rows]
                if rows and not batch.fits(job.prompt_ids, job.sampling.max_new_tokens, remaining):
                    if ticket != blocked:
                        blocked = ticket
                        self.prefill_stats["kv_waits"] += 1
                    break  # first come, first served: it waits for rows to leave, and so do those behind it
                waiting.popleft()
                admitted += 1
                # room first, then the prompt's keys/values go straight in (no prefilled copy next to a regrown batch)
                group = batch.make_room([job.prompt_ids], [job.sampling.max_new_tokens], remaining)[0] if batch.joinable else None
                try:
                    kv, logits, cache = self._prefill(job.prompt_ids, device)
                except Exception as exc:  # this job fails; the others go on
                    batch.forget(group)
                    feed.fail(ticket, exc)
                    continue
                rows.append(_Row(job, ticket, numpy.random.default_rng(job.seed), logits))
                if batch.joinable:
                    batch.place(kv, group)
                    self.prefill_stats["grouped_rows"] += group is not None
                else:
                    batch.start_alone(cache, len(job.prompt_ids))
                del kv, cache  # copied into the batch: not kept alive through the decode (a 3k-token prompt: 0.14 GB in fp32)
            decode_started = time.perf_counter()
            self.prefill_stats["prefill_s"] += decode_started - started
            self.kv_peak_slots = max(self.kv_peak_slots, batch.slots())
            if not rows:
                if admitted or waiting:  # every job taken failed in prefill: look for more
                    continue
                return peak
            if len(rows) > peak:
                peak = len(rows)
                feed.rows(peak)
            for slot in reversed(range(len(rows))):  # sample every row; finished rows leave the batch
                row = rows[slot]
                token, logprob = _sample(row.logits, row.job.sampling, row.generator)
                row.tokens.append(token)
                row.logprobs.append(logprob)
                if token in self.eos_ids or self._hit_stop(row.tokens, row.job.sampling.stop):
                    row.finish = "stop"
                elif len(row.tokens) >= row.job.sampling.max_new_tokens:
                    row.finish = "length"
                if row.finish is not None:
                    feed.deliver(row.ticket, self._result(row))
                    batch.remove(slot)
                    rows[slot] = rows[-1]
                    rows.pop()
            if rows:
                logits = batch.step([row.tokens[-1] for row in rows], [row.position() for row in rows])
                self.prefill_stats["decode_steps"] += 1
                self.prefill_stats["decode_rows"] += len(rows)
                for row, row_logits in zip(rows, logits):
                    row.logits = row_logits
            self.prefill_stats["decode_s"] += time.perf_counter() - decode_started

    def _result(self, row: _Row) -> RawCompletion:
        return RawCompletion(text=self._decode(row.tokens), prompt_ids=row.job.prompt_ids, completion_ids=row.tokens,
                             logprobs=row.logprobs, finish_reason=row.finish or "length")  # type: ignore[arg-type]

    def _prefill(self, prompt_ids: list[int], device: torch.device) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, Any]:
        """Per-layer (keys, values) of one prompt, the logits after its last token, and the cache."""
        from transformers import DynamicCache

        if not prompt_ids:
            raise UserError("cannot generate from an empty prompt")
        cache = DynamicCache(config=self.model.config)
        plain = self.plain_cache  # (a sliding-window layer keeps only its window: no prefix to reuse)
        reused, kv, source = self.prefix_cache.lookup(prompt_ids) if plain else (0, [], None)
        for layer, (keys, values) in enumerate(kv):
            cache.update(keys[:, :, :reused], values[:, :, :reused], layer)
        del kv  # the cache holds them now; each layer's goes once the forward extends it
        rest = torch.tensor([prompt_ids[reused:]], dtype=torch.long, device=device)
        positions = torch.arange(reused, len(prompt_ids), device=device)[None, :]
        # logits of the last position only: the LM head over every prompt position would cost ~20 % of
        # the prefill's compute and a (prompt length x vocabulary) tensor (334 MB for 1,700 tokens, fp32)
        out = self.model(input_ids=rest, position_ids=positions, use_cache=True, logits_to_keep=1,
                         **{self._cache_kw: cache})
        layers = _cache_layers(cache)
        if plain:
            self.prefix_cache.store(prompt_ids, layers, reused, source)
        self.prefill_stats["prompt_tokens"] += len(prompt_ids)
        self.prefill_stats["reused_tokens"] += reused
        return layers, out.logits[0, -1, :].float(), cache

    def _hit_stop(self, tokens: list[int], stops: tuple[str, ...]) -> bool:
        if not stops:
            return False
        tail = self.tokenizer.decode(tokens[-_STOP_TAIL_TOKENS:], skip_special_tokens=False)
        return any(stop in tail for stop in stops)

    def _decode(self, tokens: list[int]) -> str:
        body = tokens[:-1] if tokens and tokens[-1] in self.eos_ids else tokens
        return self.tokenizer.decode(body, skip_special_tokens=False)

    # ------------------------------------------------------------------ teacher forcing

    def force(self, prompt_text: str, completion: str, temperature: float = 1.0, *, score: bool = True) -> RawCompletion:
        """The completion the model *would* record had it sampled `completion`: exact token ids
        (completion + end of turn) and the model's own logprobs of them (`score=False`: no forward
        pass, logprobs None — enough for SFT data). Used to turn reference solutions into training traces."""
        prompt_ids = self.encode(prompt_text)
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        end = end if isinstance(end, int) and end in self.eos_ids else min(self.eos_ids)
        completion_ids = self.encode(completion) + [end]
        logprobs = self.score(prompt_ids, completion_ids, temperature) if score else None
        return RawCompletion(text=completion, prompt_text=prompt_text, prompt_ids=prompt_ids,
                             completion_ids=completion_ids, logprobs=logprobs, finish_reason="stop")

    # ------------------------------------------------------------------ scoring

    def score(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
        """Logprobs of `completion_ids` after `prompt_ids` from one fresh forward pass (no cache)."""
        with self._lock, torch.inference_mode():
            device = next(self.model.parameters()).device
            ids = torch.tensor([prompt_ids + completion_ids], dtype=torch.long, device=device)
            logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
            if temperature > 0:
                logits = logits / temperature
            lp = torch.log_softmax(logits, dim=-1)
            return lp.gather(-1, torch.tensor(completion_ids, device=device)[:, None]).squeeze(-1).tolist()


class PrefixCache:
    """Keys/values of recent prompts, reused for the longest shared token prefix.

    Rehearse prompts of one task share their system prompt and tool list; act prompts of one
    conversation extend the previous turn's prompt. A prompt stored after reusing another's prefix
    keeps a reference to that prefix and a copy of its own new tokens only, so sixteen concurrent
    runs over one ~1,500-token system prompt hold it once, not sixteen times. Bounded by the tokens
    actually held (LRU). Entries belong to one state of the weights (`for_weights`): after a training
    step they would be another policy's keys/values, so they are dropped.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.entries: list[_Entry] = []
        self.weights: int | None = None

    def for_weights(self, key: int) -> None:
        """Use the cache for weights identified by `key` (`_weights_key`); entries of others are dropped."""
        if key != self.weights:
            self.clear()
            self.weights = key

    def clear(self) -> None:
        """Drop every entry (their keys/values are freed once no decode batch holds them)."""
        self.entries = []

    def lookup(self, ids: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]], _Entry | None]:
        """Length of the longest stored prefix of `ids` (leaving at least one token to run), its
        per-layer keys/values (1, kv heads, length, head dim) and the entry it came from."""
        best, hit = 0, None
        for entry in self.entries:
            n = _common_prefix(entry.ids, ids, limit=len(ids) - 1)
            if n > best:
                best, hit = n, entry
        if hit is None:
            return 0, [], None
        self.entries.remove(hit)
        self.entries.append(hit)
        return best, hit.keys_values(best), hit

    def store(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]], reused: int = 0,
              source: _Entry | None = None) -> None:
        """Remember `ids` with their keys/values `kv`; the first `reused` tokens came from `source`."""
        if self.max_tokens <= 0 or len(ids) > self.max_tokens:
            return
        self.entries = [e for e in self.entries if e.ids != ids]
        if source is not None and reused:
            self._split(source, reused)
        pieces = source.pieces_upto(reused) if source is not None and reused else []
        start = reused if pieces else 0
        own = [(k[:, :, start:].clone(), v[:, :, start:].clone()) for k, v in kv] if start else kv  # a copy frees the rest
        self.entries.append(_Entry(list(ids), [*pieces, (own, start, len(ids))]))
        while self.held_tokens() > self.max_tokens and len(self.entries) > 1:
            self.entries.pop(0)

    def _split(self, source: _Entry, at: int) -> None:
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
class _Entry:
    ids: list[int]
    pieces: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], int, int]]
    """(per-layer keys/values of tokens [start, end), start, end), covering [0, len(ids)) in order."""

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


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))  # transformers 4.x


@dataclass
class _Row:
    """One request being decoded."""

    job: _Job
    ticket: Any
    generator: numpy.random.Generator
    logits: torch.Tensor
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None

    def position(self) -> int:
        """Position id of the token being fed (its prompt's length plus the tokens before it)."""
        return len(self.job.prompt_ids) + len(self.tokens) - 1

    def remaining(self) -> int:
        return self.job.sampling.max_new_tokens - len(self.tokens)


class _DecodeBatch:
    """The decode batch's keys/values: one buffer per layer, (rows, kv heads, columns, head dim).

    All rows write their next token in the same column (`seen`); each row's prompt sits right-aligned
    before the column that was current when it joined, and the attention mask hides every column a
    row does not own (its left padding, and the gap when a longer prompt joined later). Position ids
    are per row, so a row's positions do not depend on where its columns are. Rows leave by
    swapping the last row into their slot (one row copied). Models with other cache layers than plain
    full attention (sliding windows) decode one row at a time with the library's cache object.

    With `shared_prefix` (CPU models on the packed decode attention), rows whose prompts start alike
    form groups (`_PrefixGroup`): a group's common prefix is kept once (positions 0..P-1) and its rows'
    columns hold only what follows, so a step reads the prefix once instead of once per row (GRPO
    rollouts: the act rows share the act system prompt and tool schemas, the rehearse rows theirs —
    most of each prompt). A row joins the group it shares most with; sharing less than the group's
    prefix shortens it (the tail is copied into the group's rows' columns first); sharing too little
    starts a new group, or none.
    """

    compact_from = 256
    """Leading columns no live row uses are dropped once there are this many and they are half the buffer."""
    min_shared = 64
    """A prefix shorter than this is not worth a group (two attention calls instead of one)."""
    max_groups = 4
    """More groups than this and a prompt joins the group it shares most with (if >= `min_shared`)."""

    def __init__(self, model: Any, cache_kw: str, device: torch.device, max_rows: int, *, joinable: bool,
                 shared_prefix: bool = False, budget_bytes: float | None = None) -> None:
        from transformers import DynamicCache

        self.model, self.cache_kw, self.device, self.max_rows = model, cache_kw, device, max_rows
        self.budget_bytes = budget_bytes  # `TransformersPolicy.kv_budget_gb`
        self.budget: int | None = None
        """The budget in key/value slots (rows x columns + shared prefix tokens), once the first row's
        keys/values tell the bytes a slot takes (all layers); None: no budget (or no row yet)."""
        self.cache = DynamicCache(config=model.config)
        self.joinable = joinable  # `_plain_layers(model.config)`
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=device)
        self.rows = 0  # live rows: slots [0, rows)
        self.seen = 0  # columns in use; the next token of every row goes to column `seen`
        self.starts: list[int] = []  # first column of each row's prompt
        self.wanted = (0, 0)  # rows x columns `place` needs (set by `make_room`)
        self.shared_prefix = shared_prefix and joinable and max_rows > 1  # one row: nothing to share with
        self.groups: list[_PrefixGroup] = []
        self.row_groups: list[_PrefixGroup | None] = []  # each row's group (None: its columns hold its whole prompt)

    # -- membership

    def make_room(self, prompts: list[list[int]], new_tokens: list[int], remaining: list[int]) -> list[_PrefixGroup | None]:
        """Get ready for rows with `prompts` (`place` adds them one by one, so the prefilled keys/values
        of a whole group of arrivals never sit in memory next to the batch at once); returns the prefix
        group of each, for `place`."""
        plans = [self._group_for(ids) for ids in prompts] if self.shared_prefix else [None] * len(prompts)
        lengths = [len(ids) - (len(group.ids) if group else 0) for ids, group in zip(prompts, plans)]
        seen = max([self.seen, *lengths])
        self.wanted = (self.rows + len(lengths), seen + max([*new_tokens, *remaining]))
        if self.keys:
            self._reserve(*self.wanted)
            self.mask[: self.rows, self.seen:seen] = 0  # existing rows skip the columns of a longer new prompt
        self.seen = seen
        self._bind()
        return plans

    def slots(self) -> int:
        """Key/value token slots held: the buffers' rows x columns (padding included), and each shared
        prefix once."""
        return self.mask.shape[0] * self.mask.shape[1] + self._prefix_slots()

    def _prefix_slots(self) -> int:
        return sum(len(group.ids) for group in self.groups)

    def slots_with(self, prompt: list[int], new_tokens: int, remaining: list[int], *, trimmed: bool = False) -> int:
        """What `slots` would be, about, with one more row for `prompt` (without changing the batch):
        the buffers as they are if the row fits in them, else the rows then in use times the columns
        they span; plus the shared prefixes. `trimmed`: as if `trim` had dropped the rows no one uses."""
        # as `_group_for` decides, without changing anything: a new group holds its prefix once, and a group
        # the prompt shares less with gives up tokens of its prefix to its rows' columns
        best, share = self._best_group(prompt) if self.shared_prefix else (None, 0)
        tail, prefix, seen = len(prompt) - share, share if best is None else 0, self.seen
        if best is not None and share < len(best.ids):  # joining shortens the group (`_shorten`)
            cut = len(best.ids) - share  # prefix tokens that move into its rows' columns
            prefix = -cut
            seen += self._shortening_shift(best, cut)
        rows, columns = self.rows + 1, max(seen, tail) + max([new_tokens, *remaining])
        have_rows, have_cols = self.mask.shape
        have_rows = min(have_rows, self.rows) if trimmed else have_rows
        held = have_rows * have_cols if rows <= have_rows and columns <= have_cols else rows * columns  # or regrown
        return held + self._prefix_slots() + prefix

    def fits(self, prompt: list[int], new_tokens: int, remaining: list[int]) -> bool:
        """Whether one more row for `prompt` keeps the batch within its budget (`slots_with`), after
        dropping buffer rows no one uses if that makes the difference."""
        if self.budget is None or self.slots_with(prompt, new_tokens, remaining) <= self.budget:
            return True
        if self.slots_with(prompt, new_tokens, remaining, trimmed=True) > self.budget:
            return False  # it waits (no copy for nothing)
        self.trim()
        return True

    def forget(self, group: _PrefixGroup | None) -> None:
        """Drop a prefix group `make_room` made for a row that never came (its prefill failed)."""
        if group is not None and not group.layers and all(g is not group for g in self.row_groups):
            self.groups.remove(group)

    def place(self, kv: list[tuple[torch.Tensor, torch.Tensor]], group: _PrefixGroup | None = None) -> None:
        """Add one prefilled row (per-layer (1, kv heads, n, head dim)) right-aligned before `seen`; with
        its prefix `group` (from `make_room`) only the tokens after the group's prefix go in."""
        if group is not None:
            shared = len(group.ids)
            if not group.layers:  # copied: the row's own tensors hold its whole prompt
                group.layers = [(k[:, :, :shared].clone(), v[:, :, :shared].clone()) for k, v in kv]
            kv = [(k[:, :, shared:], v[:, :, shared:]) for k, v in kv]
        self._reserve(*self.wanted, like=kv)
        slot, n, seen = self.rows, kv[0][0].shape[2], self.seen
        self.mask[slot] = 0
        self.mask[slot, seen - n:seen] = 1
        for layer, (keys, values) in enumerate(kv):
            self.keys[layer][slot, :, seen - n:seen] = keys[0]
            self.values[layer][slot, :, seen - n:seen] = values[0]
        self.starts.append(seen - n)
        self.row_groups.append(group)
        self.rows += 1
        self._bind()

    def remove(self, slot: int) -> None:
        """Drop a row: the last row moves into its slot (row order is the caller's list order too)."""
        last = self.rows - 1
        if self.joinable:
            if slot != last:
                for buf in (*self.keys, *self.values):
                    buf[slot, :, : self.seen] = buf[last, :, : self.seen]
                self.mask[slot, : self.seen] = self.mask[last, : self.seen]
                self.starts[slot] = self.starts[last]
            gone = self.row_groups[slot]
            self.row_groups[slot] = self.row_groups[last]
            self.starts.pop()
            self.row_groups.pop()
            if gone is not None and all(group is not gone for group in self.row_groups):
                self.groups.remove(gone)
            self.rows = last
            self._compact()
            self._bind()
        else:  # the one row of a library cache (`start_alone`)
            self.rows = 0

    # -- one step

    def step(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Feed each row's last token; (rows, vocab) float32 logits for the next one."""
        if self.rows == 1 and self.row_groups and self.row_groups[0] is not None:
            # one row left: the split attention only costs (~15 % of a one-row step); its prefix goes back in
            group = self.row_groups[0]
            self._shorten(group, 0)
            self.groups.remove(group)
            self.row_groups[0] = None
        if self.joinable and self.seen + 1 > self.mask.shape[1]:
            self._reserve(self.rows, self.seen + 1)
            self._bind()
        if self.mask.shape[1] <= self.seen:  # plain library cache: the mask grows with it
            self.mask = torch.cat([self.mask, self.mask.new_zeros(self.mask.shape[0], 1)], dim=1)
        self.mask[: self.rows, self.seen] = 1
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)[:, None]
        shared = {PREFIX_KW: self._prefixes()} if self.groups else {}
        out = self.model(input_ids=ids, attention_mask=self.mask[: self.rows, : self.seen + 1], position_ids=pos,
                         use_cache=True, **{self.cache_kw: self.cache}, **shared)
        self.seen += 1
        if self.joinable:
            self._bind()
        return out.logits[:, -1, :].float()

    # -- storage

    def _reserve(self, rows: int, columns: int, like: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """Make the buffers hold at least `rows` x `columns` (grown with slack: one copy when grown).
        `like`: one prompt's per-layer keys/values, for the shapes of the first buffers."""
        have_rows, have_cols = self.mask.shape
        if rows <= have_rows and columns <= have_cols:
            return
        need_rows, need_cols = rows, columns
        rows = max(rows, min(2 * have_rows, self.max_rows))  # rows join one by one: grow by doubling
        columns = max(columns, have_cols + max(have_cols // 4, 64)) if columns > have_cols else have_cols
        if self.budget is not None:  # slack only within the budget: a regrown buffer may drop rows no one uses
            room = max(self.budget - self._prefix_slots(), 0)  # the shared prefixes count too
            rows = max(need_rows, self.rows, min(rows, room // max(columns, 1)))
            columns = max(need_cols, min(columns, room // max(rows, 1)))
        self._resize(rows, columns, like)

    def trim(self) -> bool:
        """Drop the buffer rows no live row uses (rows that left keep their slots until the buffers are
        regrown); True if there were any."""
        if not self.keys or self.mask.shape[0] <= self.rows:
            return False
        self._resize(self.rows, self.mask.shape[1])
        self._bind()
        return True

    def _resize(self, rows: int, columns: int, like: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        have_cols = self.mask.shape[1]
        used = min(self.seen, have_cols)
        mask = self.mask.new_zeros((rows, columns))
        mask[: self.rows, :used] = self.mask[: self.rows, :used]
        self.mask = mask
        self._unbind()  # views of the old buffers: let each go once copied
        if not self.keys:
            if self.budget_bytes is not None and like:
                slot = sum(k[0, :, 0].numel() * k.element_size() + v[0, :, 0].numel() * v.element_size() for k, v in like)
                self.budget = max(1, int(self.budget_bytes // slot))
            for keys, values in like or []:
                self.keys.append(keys.new_zeros((rows, keys.shape[1], columns, keys.shape[3])))
                self.values.append(values.new_zeros((rows, values.shape[1], columns, values.shape[3])))
            return
        for bufs in (self.keys, self.values):
            for layer, old in enumerate(bufs):
                new = old.new_zeros((rows, old.shape[1], columns, old.shape[3]))
                new[: self.rows, :, :used] = old[: self.rows, :, :used]
                bufs[layer] = new

    def _best_group(self, ids: list[int]) -> tuple[_PrefixGroup | None, int]:
        """Where a prompt would go, without changing anything: (a group, the tokens it would share with
        it) to join; (None, n) to start a new group of its first n tokens; (None, 0) for no group."""
        best, share = None, 0
        for group in self.groups:
            n = _common_prefix(group.ids, ids, limit=len(ids) - 1)  # the row keeps one token of its own
            if n > share:
                best, share = group, n
        full = len(self.groups) >= self.max_groups
        if best is not None and share >= self.min_shared and (2 * share >= len(best.ids) or full):
            return best, share
        return None, len(ids) - 1 if not full and len(ids) - 1 >= self.min_shared else 0

    def _group_for(self, ids: list[int]) -> _PrefixGroup | None:
        """The group a prompt joins (shortened to what they share), a new group, or None."""
        best, share = self._best_group(ids)
        if best is not None:
            if share < len(best.ids):
                self._shorten(best, share)
            return best
        if not share:
            return None
        group = _PrefixGroup(list(ids[:share]))
        self.groups.append(group)
        return group

    def _shorten(self, group: _PrefixGroup, n: int) -> None:
        """Make `group` share only its first `n` tokens: the rest go into its rows' columns, before their
        own (the buffers grow on the left when one of them has no free columns there)."""
        cut = len(group.ids) - n
        members = self._members(group)
        if members:
            shift = self._shortening_shift(group, cut)
            if shift:  # shift every row right by the missing columns
                self._shift(shift)
            for layer, (keys, values) in enumerate(group.layers):
                for slot in members:
                    start = self.starts[slot]
                    self.keys[layer][slot, :, start - cut : start] = keys[0, :, n:]
                    self.values[layer][slot, :, start - cut : start] = values[0, :, n:]
            for slot in members:
                self.mask[slot, self.starts[slot] - cut : self.starts[slot]] = 1
                self.starts[slot] -= cut
            self._bind()
        group.ids = group.ids[:n]
        group.layers = [(k[:, :, :n].clone(), v[:, :, :n].clone()) for k, v in group.layers]

    def _members(self, group: _PrefixGroup) -> list[int]:
        return [slot for slot, g in enumerate(self.row_groups) if g is group]

    def _shortening_shift(self, group: _PrefixGroup, cut: int) -> int:
        """Columns every row moves right when `group` hands its last `cut` prefix tokens to its rows'
        columns (`_shorten`): what its row with the fewest free columns on the left lacks."""
        return max(0, cut - min((self.starts[slot] for slot in self._members(group)), default=cut))

    def _prefixes(self) -> SharedPrefixes:
        members: dict[int, tuple[_PrefixGroup, list[int]]] = {}
        for slot, group in enumerate(self.row_groups):
            if group is not None:
                members.setdefault(id(group), (group, []))[1].append(slot)
        return SharedPrefixes([(torch.tensor(slots, device=self.device), group.layers)
                               for group, slots in members.values()])

    def _compact(self) -> None:
        """Drop leading columns no live row uses once they are most of the buffer (keeps steps cheap)."""
        if not self.rows:  # drained: let the buffers go (the next row sizes new ones to what it needs)
            self.seen, self.starts, self.groups, self.row_groups = 0, [], [], []
            self._unbind()
            self.keys, self.values = [], []
            self.mask = self.mask.new_zeros((0, 0))
            return
        cut = min(self.starts)
        if cut < self.compact_from or cut * 2 < self.seen:
            return
        self._shift(-cut)

    def _shift(self, by: int) -> None:
        """Move every live row's columns `by` to the right (negative: to the left), growing the buffers
        when needed; the columns left behind are masked (their stale keys/values get no weight)."""
        if by > 0:
            self._reserve(self.rows, self.seen + by)
        source, target = slice(max(-by, 0), self.seen), slice(max(by, 0), self.seen + by)
        for buf in (*self.keys, *self.values):
            buf[: self.rows, :, target] = buf[: self.rows, :, source].clone()
        self.mask[: self.rows, target] = self.mask[: self.rows, source].clone()
        vacated = slice(0, by) if by > 0 else slice(self.seen + by, self.seen)
        self.mask[: self.rows, vacated] = 0
        self.seen += by
        self.starts = [s + by for s in self.starts]

    def _unbind(self) -> None:
        for layer in getattr(self.cache, "layers", []):
            if hasattr(layer, "bind"):
                layer.keys = layer.values = layer.key_buf = layer.value_buf = None

    def _bind(self) -> None:
        """Point the cache's layers at the live rows' columns."""
        layer_type = _preallocated_layer()
        for index, (keys, values) in enumerate(zip(self.keys, self.values)):
            layer = self.cache.layers[index]
            if not isinstance(layer, layer_type):
                layer = self.cache.layers[index] = layer_type()
            layer.bind(keys, values, self.rows, self.seen)

    def start_alone(self, cache: Any, length: int) -> None:
        """One row with the library's own cache object (models whose layers are not all plain)."""
        self.cache = cache
        self.mask = torch.ones((1, length), dtype=torch.long, device=self.device)
        self.rows, self.seen = 1, length


def _weights_key(model: Any) -> int:
    """Changes whenever a parameter is changed in place (an optimizer step, `load_state_dict`) or
    replaced: PyTorch counts in-place writes per tensor (`_version`). ~0.1 ms for 500 parameters."""
    return hash(tuple((id(p), _version(p)) for p in model.parameters()))


def _version(tensor: torch.Tensor) -> int:
    try:
        return tensor._version
    except RuntimeError:  # an inference tensor (a model loaded under inference_mode) keeps no count
        return 0


@contextlib.contextmanager
def _merged_lora(model: Any, enabled: bool = True) -> Iterator[bool]:
    """Generate on W + scale * B @ A instead of peft's W x + scale * B (A x): for the duration, every
    LoRA layer calls a linear on a merged copy of its weights (rounded once, from float32) — in the
    generating thread only (see `_merged_forward`). On CPU the adapter path is mostly per-module overhead — for the
    embedded model with a q/k/v/o adapter, 33 of a 112 ms 16-row decode step and 18 of a 67 ms
    one-row step (peft's wrapper alone, adapter disabled, is 12 of them). The adapter's own weights
    are untouched: training goes on through them, and the copies are made again for every generation
    call, so they follow each update. Only where the merge is exact math: one active LoRA adapter,
    linear layers, no DoRA, no bias training, no extra trained modules, CPU; anything else generates
    as before. Yields whether it merged."""
    layers = _plain_lora_layers(model) if enabled else None
    if not layers:
        yield False
        return
    adapter = model.active_adapter
    owner = threading.get_ident()
    try:
        with torch.no_grad():
            for layer in layers:
                base = layer.get_base_layer()
                delta = layer.get_delta_weight(adapter)
                merged = (base.weight.float() + delta.float()).to(base.weight.dtype)
                layer.forward = functools.partial(_merged_forward, owner, merged, base.bias, layer.forward)
        yield True
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


def _merged_forward(owner: int, weight: torch.Tensor, bias: torch.Tensor | None, adapter_forward: Any,
                    x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A merged LoRA layer: the merged linear in the generating thread only. Any other thread — a
    training step that starts while a finished stream's worker thread is still winding down — runs
    peft's own path on the untouched weights, so the merge is never seen by autograd."""
    if threading.get_ident() != owner:
        return adapter_forward(x, *args, **kwargs)
    return torch.nn.functional.linear(x, weight, bias)


def _plain_lora_layers(model: Any) -> list[Any] | None:
    """The LoRA linear layers of a peft model whose single active adapter `_merged_lora` can merge exactly."""
    try:
        from peft import PeftModel
        from peft.tuners.lora import Linear as LoraLinear
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a core dependency
        return None
    if not isinstance(model, PeftModel) or len(getattr(model, "active_adapters", [])) != 1:
        return None
    adapter = model.active_adapter
    config = model.peft_config.get(adapter)
    kind = getattr(config, "peft_type", None)
    if (config is None or getattr(kind, "value", kind) != "LORA" or getattr(config, "modules_to_save", None)
            or getattr(config, "bias", "none") != "none" or getattr(config, "use_dora", False)
            or getattr(model, "_adapters_disabled", False)):
        return None
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    for layer in layers:
        base = layer.get_base_layer()
        if (type(layer) is not LoraLinear or not isinstance(base, torch.nn.Linear) or layer.merged
                or layer.disable_adapters or adapter not in layer.lora_A or base.weight.device.type != "cpu"
                or layer.use_dora.get(adapter, False)):
            return None
    return layers


@dataclass(eq=False)
class _PrefixGroup:
    """A prompt prefix some rows of a decode batch start with; its keys/values are held once."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # from its first row placed


def _dense_head_input(model: Any) -> None:
    """Give the output layer inputs with plain strides. Prefill asks for the last position's logits
    only, and the LM head then gets a (1, 1, hidden) view of (1, n, hidden) states; for such a view
    PyTorch's linear takes a batched-matmul path that copies the whole (vocabulary x hidden) weight
    first — 55 ms per prompt for the embedded model, more than its 10-token prefill. A copy of the
    one row costs nothing."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_envace_dense_input", False):
        return

    def dense(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dim() < 3:
            return None
        natural = [1]
        for size in reversed(x.shape[1:]):
            natural.insert(0, natural[0] * size)
        if list(x.stride()) == natural:
            return None
        return (x.clone(memory_format=torch.contiguous_format), *args[1:])

    head.register_forward_pre_hook(dense)
    head._envace_dense_input = True


def _plain_layers(config: Any) -> bool:
    """Whether every layer of the model's cache is the library's plain full-attention `DynamicLayer`."""
    from transformers import DynamicCache

    layers = getattr(DynamicCache(config=config), "layers", None)  # older caches have no layer objects
    return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)


@functools.cache
def _preallocated_layer() -> type:
    """`DynamicLayer` (imported lazily, like the rest of transformers here) over a `_DecodeBatch` buffer."""
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """Keys/values are views of the batch's buffers: `update` writes the new column in place, where
        the library's layer concatenates (copies the whole cache) on every step."""

        def bind(self, key_buf: torch.Tensor, value_buf: torch.Tensor, rows: int, seen: int) -> None:
            self.key_buf, self.value_buf, self.live = key_buf, value_buf, rows
            self.device, self.is_initialized = key_buf.device, True
            self.keys, self.values = key_buf[:rows, :, :seen], value_buf[:rows, :, :seen]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            seen, new = self.keys.shape[2], key_states.shape[2]  # the batch reserved the columns
            self.key_buf[: self.live, :, seen : seen + new] = key_states
            self.value_buf[: self.live, :, seen : seen + new] = value_states
            return self.key_buf[: self.live, :, : seen + new], self.value_buf[: self.live, :, : seen + new]

    return PreallocatedLayer


def _sample(logits: torch.Tensor, sampling: SamplingParams, generator: numpy.random.Generator) -> tuple[int, float]:
    """One token from one row of logits, and its logprob under the (temperature-scaled) distribution."""
    if sampling.temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
        return token, float(logprobs[token])
    scaled = logits / sampling.temperature
    logprobs = torch.log_softmax(scaled, dim=-1)
    filtered = scaled.clone()
    if sampling.top_k and sampling.top_k < filtered.numel():
        kth = torch.topk(filtered, sampling.top_k).values[-1]
        filtered[filtered < kth] = float("-inf")
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(filtered, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) > sampling.top_p
        filtered[order[drop]] = float("-inf")
    # exponential race: argmax p_i / E_i with E_i ~ Exp(1) picks i with probability p_i (what
    # torch.multinomial does, but its CPU generator takes ~1 ms for a 49k vocabulary; numpy's PCG64
    # 0.2 ms). Unlike inverse-CDF sampling, it is not moved by float noise in the probabilities of
    # other tokens, so a row decoded in a batch samples what it samples alone. A filtered token
    # (p = 0) never wins; a draw of u = 0 gives E = inf and only drops that token from this draw.
    probs = torch.softmax(filtered, dim=-1).float().cpu()
    race = torch.from_numpy(generator.random(probs.numel(), dtype=numpy.float32)).log_().neg_()
    token = int(torch.argmax(probs / race))
    return token, float(logprobs[token])


def _chatml(chat: list[ChatMessage]) -> str:
    """Documented fallback for tokenizers with no chat template at all: ChatML."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)
    return text + "<|im_start|>assistant\n"

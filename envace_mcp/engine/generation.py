"""The generation engine: any Hugging Face causal LM, continuous batching over one KV cache, exact
token ids and per-token sampling logprobs.

It knows token ids, sampling settings and the model, nothing of roles, prompts or tools (the policy
renders and encodes; see `envace_mcp.policy.transformers`).

- Every sampled token's logprob is log_softmax(logits / temperature)[token] — what a trainer recomputes
  from the same tokens (top-k / top-p only narrow the sampling, not the recorded distribution). Greedy
  (temperature 0) records log_softmax(logits).
- Concurrent requests share one decode batch (`submit`, continuous batching): a request that arrives
  while others decode joins at the next token step, and each result is returned when its row
  finishes. Each row samples with its own seeded generator. A greedy row (temperature 0) is
  batch-invariant (`batch_invariant`, see `invariant`): its logits are the same bit for bit whatever
  else the batch holds and whatever the prefix cache held, so a greedy evaluation repeats exactly on
  one machine with one dtype. A sampled row's logits may differ in their last bits with its company;
  the exponential race it samples with is not moved by that (`sampling`).
- Each prompt is prefilled alone, reusing the longest prefix the `PrefixCache` holds; the decode batch
  (`DecodeBatch`) holds prompt prefixes its rows share once and stays within a key/value memory budget.
- Under one plain LoRA adapter on CPU, generation runs on merged copies of the adapted weights
  (`merged_lora`); a trainer changing the weights calls `weights_changed()` before generating again.
"""

from __future__ import annotations

import collections
import copy
import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy
import torch

from envace_mcp.engine.attention import base_model, use_for_decoding
from envace_mcp.engine.batch import DecodeBatch, plain_layers
from envace_mcp.engine.batcher import Batcher, ListFeed
from envace_mcp.engine.invariant import PREFILL_CHUNK, row_tile
from envace_mcp.engine.lora import merged_lora
from envace_mcp.engine.model import cache_keyword, dense_head_input, weights_key
from envace_mcp.engine.prefix_cache import PrefixCache, cache_layers, cache_of
from envace_mcp.engine.sampling import sample
from envace_mcp.engine.scoring import ScoreRequest, logits_after_cached, logprobs_of
from envace_mcp.engine.turns import eos_ids
from envace_mcp.engine.types import Completion, Job
from envace_mcp.errors import UserError

_STOP_TAIL_TOKENS = 16


class Engine:
    """Generates, scores and batches for one model (optionally under a LoRA adapter).

    Args:
        model, tokenizer: a loaded causal LM and its tokenizer (`envace_mcp.engine.load_model`).
        max_batch_size: most requests decoded together.
        batch_window_s: how long a request waits for others to share its batch.
        prefix_cache_tokens: how many prompt tokens' keys/values to keep for reuse (0 disables).
        kv_budget_gb: the most memory one decode batch's keys/values may take (GiB, padding included); a
            request that would take the batch past it waits until rows leave. "auto": 2 GiB on CPU
            (16 rows of 2.9k tokens for the embedded model in fp32, 5.8k in bf16), no limit on
            accelerators (size it to the GPU). None: no limit beyond `max_batch_size`.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int = 16, batch_window_s: float = 0.01,
                 prefix_cache_tokens: int = 32768, kv_budget_gb: float | Literal["auto"] | None = "auto") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids(model, tokenizer)
        self._lock = threading.Lock()
        self._scores: collections.deque[ScoreRequest] = collections.deque()
        self.cache_kw = cache_keyword(base_model(model))
        self.plain_cache = plain_layers(model.config)
        """Every cache layer is plain full attention: rows can join a running batch and prompts can
        share a prefix (a sliding-window layer keeps only its window)."""
        self.decode_attention = use_for_decoding(model)
        """Whether one-token steps use the packed grouped-query attention (CPU models on `sdpa`)."""
        self.share_prefix = True
        """With `decode_attention`: a decode batch holds the prompt prefixes its rows share once (see
        `DecodeBatch`); False gives every row its own copy (for comparisons)."""
        self.merge_lora = True
        """CPU generation under one plain LoRA adapter runs on merged copies of the adapted weights
        (see `merged_lora`); False keeps peft's separate adapter path (for comparisons)."""
        self.batch_invariant = False
        """True: greedy rows decode batch-invariantly and their prompts are prefilled in fixed chunks
        (`invariant`), so a greedy run gives the same tokens whatever shares its batch, at ~0.63x greedy
        decode throughput (docs/benchmarks.md); `envace eval` turns it on. False: greedy rows are batched
        like the others."""
        dense_head_input(model)
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        if kv_budget_gb == "auto":
            kv_budget_gb = 2.0 if next(model.parameters()).device.type == "cpu" else None
        self.kv_budget_gb: float | None = kv_budget_gb
        """See the class docstring. In long multi-turn runs (up to 12 calls, ~5k-token contexts), 16 rows
        of fp32 keys/values (46 KB a token for the embedded model) are the largest memory cost of a GRPO
        step."""
        self.stats: dict[str, float] = {"prompt_tokens": 0, "reused_tokens": 0, "prefill_s": 0.0, "decode_s": 0.0,
                                        "decode_steps": 0, "decode_rows": 0, "kv_waits": 0, "grouped_rows": 0,
                                        "abandoned": 0, "scored_reused_tokens": 0}
        """Running totals: prompt tokens seen, of them reused from the prefix cache, seconds spent,
        decode steps (forward passes) and the rows they fed (rows / steps: the mean batch), requests that
        waited for room under `kv_budget_gb`, rows that joined a decode batch's prefix group (their
        shared prompt prefix held once, see `DecodeBatch`), rows dropped because their caller gave up, and
        prompt tokens `score(reuse_prefix=True)` took from the prefix cache."""
        self.kv_peak_slots = 0
        """The most key/value slots a decode batch held (`DecodeBatch.slots`), for benchmarks and tests."""
        self.max_rows = max(max_batch_size, 32)
        """The most rows `generate` decodes together (`submit`: `max_batch_size`); the row tile of batch-invariant
        steps holds up to this many (`invariant.row_tile`)."""
        self.batcher: Batcher[Job, Completion] = Batcher(self.stream, max_batch=max_batch_size, window_s=batch_window_s)

    async def submit(self, job: Job) -> Completion:
        """Generate one job in the shared decode batch (it joins a running batch at the next token step)."""
        return await self.batcher.submit(job)

    def generate(self, jobs: list[Job]) -> list[Completion]:
        """Generate every job (synchronous; rows join and leave one decode batch as in `stream`)."""
        feed: ListFeed[Job, Completion] = ListFeed(jobs)
        self.stream(feed, max(min(len(jobs), self.max_rows), 1))
        return feed.results()

    def weights_changed(self) -> None:
        """Call after changing the weights (an optimizer step): waits for a running generation to leave
        (a stream's worker thread delivers its last result before it leaves the merged LoRA weights) and
        frees the prefix cache's keys/values of the old weights now, so an update's activations never sit
        next to them. (The cache would also notice the change at the next generation and drop them.)"""
        self.wait_idle()
        self.prefix_cache.clear()

    def wait_idle(self) -> None:
        """Block until no generation runs."""
        with self._lock:
            pass

    def stream(self, feed: Any, max_rows: int) -> int:
        """Continuous batching (the batcher calls this in a worker thread): take jobs from `feed`,
        decode up to `max_rows` together, admit newly arrived jobs at every token step, deliver each
        result when its row finishes, drop a row whose caller gave up; return when no job is left.
        Returns the most rows decoded together."""
        with self._lock, torch.inference_mode():
            self.prefix_cache.for_weights(weights_key(self.model))  # before the merge swaps weights in
            with merged_lora(self.model, self.merge_lora):
                return self._stream(feed, max_rows)

    def _stream(self, feed: Any, max_rows: int) -> int:
        # Each prompt is prefilled alone (no padding waste, shared prefixes from the prefix cache),
        # then decoded with the other rows over one cache: one forward pass per token for all rows.
        device = next(self.model.parameters()).device
        tile = self.row_tile if self.batch_invariant else 1
        batch = DecodeBatch(self.model, self.cache_kw, device, max_rows, joinable=self.plain_cache,
                             shared_prefix=self.decode_attention and self.share_prefix,
                             budget_bytes=None if self.kv_budget_gb is None else self.kv_budget_gb * 2**30,
                             row_tile=tile or 1)
        # without the packed decode attention, or a row tile, a greedy row cannot attend alone in a batch:
        # it decodes with no other row beside it (`solo`)
        solo = self.batch_invariant and (tile is None or not self.decode_attention)
        if not batch.joinable:  # sliding-window layers keep per-layer lengths: one row at a time, its own cache
            max_rows = 1
        rows: list[_Row] = []
        waiting: collections.deque[tuple[Job, Any]] = collections.deque()  # taken, not admitted: over the KV budget
        blocked = None  # the request now waiting for room (counted once)
        peak = 0
        while True:
            if self._scores:  # a reply scored after its prompt's cached keys/values, between two steps
                self._serve_scores()
            started = time.perf_counter()
            if len(rows) + len(waiting) < max_rows and (batch.joinable or not rows):
                waiting.extend(feed.take(max_rows - len(rows) - len(waiting)))
            admitted = 0
            while waiting and len(rows) < max_rows and (batch.joinable or not rows):
                job, ticket = waiting[0]
                if not feed.wanted(ticket):  # its caller gave up while it waited for room
                    waiting.popleft()
                    continue
                alone = self.batch_invariant and job.sampling.temperature == 0
                if solo and rows and (alone or any(row.alone for row in rows)):
                    break  # a greedy row decodes by itself here: it waits for the batch to drain, others for it
                remaining = [row.remaining() for row in rows]
                if rows and not batch.fits(job.prompt_ids, job.sampling.max_new_tokens, remaining, alone):
                    if ticket != blocked:
                        blocked = ticket
                        self.stats["kv_waits"] += 1
                    break  # first come, first served: it waits for rows to leave, and so do those behind it
                waiting.popleft()
                admitted += 1
                # room first, then the prompt's keys/values go straight in (no prefilled copy next to a regrown batch)
                group = (batch.make_room([job.prompt_ids], [job.sampling.max_new_tokens], remaining, [alone])[0]
                         if batch.joinable else None)
                try:
                    kv, logits, cache = self.prefill(job.prompt_ids, device, canonical=alone)
                except Exception as exc:  # this job fails; the others go on
                    batch.forget(group)
                    feed.fail(ticket, exc)
                    continue
                rows.append(_Row(job, ticket, numpy.random.default_rng(job.seed), logits, alone))
                if batch.joinable:
                    batch.place(kv, group, alone and not solo)
                    self.stats["grouped_rows"] += group is not None
                else:
                    batch.start_alone(cache, len(job.prompt_ids))
                del kv, cache  # copied into the batch: not kept alive through the decode (a 3k-token prompt: 0.14 GB in fp32)
            decode_started = time.perf_counter()
            self.stats["prefill_s"] += decode_started - started
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
                if not feed.wanted(row.ticket):  # its caller gave up (cancelled, timed out, a stop): no more tokens
                    self.stats["abandoned"] += 1
                    row.finish = "abandoned"
                else:
                    if row.job.restrict is not None:
                        row.job.restrict(row.tokens, row.logits)
                    token, logprob = sample(row.logits, row.job.sampling, row.generator)
                    row.tokens.append(token)
                    row.logprobs.append(logprob)
                    if token in self.eos_ids or self._hit_stop(row.tokens, row.job.sampling.stop):
                        row.finish = "stop"
                    elif len(row.tokens) >= row.job.sampling.max_new_tokens:
                        row.finish = "length"
                if row.finish is not None:
                    if row.finish != "abandoned":
                        feed.deliver(row.ticket, self._result(row))
                    batch.remove(slot)
                    rows[slot] = rows[-1]
                    rows.pop()
            if rows:
                logits = batch.step([row.tokens[-1] for row in rows], [row.position() for row in rows])
                self.stats["decode_steps"] += 1
                self.stats["decode_rows"] += len(rows)
                for row, row_logits in zip(rows, logits):
                    row.logits = row_logits
            self.stats["decode_s"] += time.perf_counter() - decode_started

    @functools.cached_property
    def row_tile(self) -> int | None:
        """`invariant.row_tile` of this model for up to `max_rows` rows: one per engine, whatever a call's
        batch size, so a row's numbers never depend on how many jobs came with it."""
        return row_tile(self.model, self.max_rows)

    def _result(self, row: _Row) -> Completion:
        return Completion(text=self.decode(row.tokens), prompt_ids=row.job.prompt_ids, completion_ids=row.tokens,
                          logprobs=row.logprobs, finish_reason=row.finish or "length")  # type: ignore[arg-type]

    def prefill(self, prompt_ids: list[int], device: torch.device, *, canonical: bool = False,
                ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, Any]:
        """Per-layer (keys, values) of one prompt, the logits after its last token, and the cache.
        `canonical` (a batch-invariant row's prompt): prefilled in `PREFILL_CHUNK`-token chunks at fixed
        positions, reusing only whole chunks that were prefilled so (`invariant`)."""
        if not prompt_ids:
            raise UserError("cannot generate from an empty prompt")
        plain = self.plain_cache  # (a sliding-window layer keeps only its window: no prefix to reuse)
        reused, kv, source = self.prefix_cache.lookup(prompt_ids, canonical=canonical) if plain else (0, [], None)
        chunk = PREFILL_CHUNK if canonical else len(prompt_ids)
        if canonical:  # whole chunks only: a token's keys/values then never depend on the prompt that made them
            reused -= reused % chunk
        cache = cache_of(self.model.config, kv, reused)
        del kv  # the cache holds them now; each layer's goes once the forward extends it
        for start in range(reused, len(prompt_ids), chunk):
            end = min(start - start % chunk + chunk, len(prompt_ids))  # chunks at fixed positions
            rest = torch.tensor([prompt_ids[start:end]], dtype=torch.long, device=device)
            positions = torch.arange(start, end, device=device)[None, :]
            # logits of the last position only: the LM head over every prompt position would cost ~20 % of
            # the prefill's compute and a (prompt length x vocabulary) tensor (334 MB for 1,700 tokens, fp32)
            out = self.model(input_ids=rest, position_ids=positions, use_cache=True, logits_to_keep=1,
                             **{self.cache_kw: cache})
        layers = cache_layers(cache)
        if plain:  # what a batch-invariant prompt may reuse of it: its whole chunks, or the canonical part it reused
            kept = len(prompt_ids) if canonical else min(reused, source.canonical if source is not None else 0)
            self.prefix_cache.store(prompt_ids, layers, reused, source, canonical=kept - kept % PREFILL_CHUNK)
        self.stats["prompt_tokens"] += len(prompt_ids)
        self.stats["reused_tokens"] += reused
        return layers, out.logits[0, -1, :].float(), cache

    def _hit_stop(self, tokens: list[int], stops: tuple[str, ...]) -> bool:
        if not stops:
            return False
        tail = self.tokenizer.decode(tokens[-_STOP_TAIL_TOKENS:], skip_special_tokens=False)
        return any(stop in tail for stop in stops)

    def decode(self, tokens: list[int]) -> str:
        """The text of sampled tokens (a final end-of-turn token left out)."""
        body = tokens[:-1] if tokens and tokens[-1] in self.eos_ids else tokens
        return self.tokenizer.decode(body, skip_special_tokens=False)

    # ------------------------------------------------------------------ scoring

    def score(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0, *,
              reuse_prefix: bool = False) -> list[float]:
        """Logprobs of `completion_ids` after `prompt_ids` from one fresh forward pass (no cache). With
        `reuse_prefix`, the keys/values of the prompt's longest prefix the prefix cache holds (a generation
        from this prompt just stored them) are reused and only the rest runs, on the weights generation
        uses (`merged_lora`), between two decode steps of a running generation rather than after it: the
        same logprobs up to rounding, for a tenth of the tokens where a world model's ~900-token rehearse
        prompt is scored on its ~80-token reply, and a batch that stays full (a measurement; the fresh
        pass stays what training compares with)."""
        if reuse_prefix and self.plain_cache and prompt_ids:
            return self._score_beside_generation(ScoreRequest(prompt_ids, completion_ids, temperature))
        with self._lock, torch.inference_mode():
            device = next(self.model.parameters()).device
            ids = torch.tensor([prompt_ids + completion_ids], dtype=torch.long, device=device)
            logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
            return logprobs_of(logits, completion_ids, temperature)

    def _score_beside_generation(self, request: ScoreRequest) -> list[float]:
        """Queue `request` for the running generation to serve between two steps (`_serve_scores`), or,
        with none running, serve it here."""
        self._scores.append(request)
        while not request.done.is_set():
            if self._lock.acquire(blocking=False):
                try:
                    with torch.inference_mode():
                        self.prefix_cache.for_weights(weights_key(self.model))
                        with merged_lora(self.model, self.merge_lora):
                            self._serve_scores()
                finally:
                    self._lock.release()
            else:
                request.done.wait(0.005)
        if request.error is not None:
            raise request.error
        return request.result or []

    def _serve_scores(self) -> None:
        """Score the queued requests (the caller holds the lock, in inference mode, on generation's weights)."""
        while self._scores:
            try:
                request = self._scores.popleft()
            except IndexError:  # (another thread took the last one)
                return
            try:
                logits, reused = logits_after_cached(self.model, self.cache_kw, self.prefix_cache, request.prompt_ids,
                                                     request.completion_ids)
                request.result = logprobs_of(logits, request.completion_ids, request.temperature)
                self.stats["scored_reused_tokens"] += reused
            except Exception as exc:  # that caller's failure, raised in its thread
                request.error = exc
            finally:
                request.done.set()

    def next_token_logprobs(self, prefix_ids: list[int], suffixes: list[list[int]], candidates: list[int]) -> list[list[float]]:
        """For each suffix, the logprobs (temperature 1, over the whole vocabulary) of `candidates` as the
        token after `prefix_ids + suffix`: the shared prefix is run once and each suffix continues a copy
        of its cache (a judge scoring each attempt of a group it read once)."""
        from transformers import DynamicCache

        with self._lock, torch.inference_mode():
            device = next(self.model.parameters()).device
            keep = torch.tensor(candidates, device=device)
            prefix = DynamicCache(config=self.model.config)
            self.model(input_ids=torch.tensor([prefix_ids], device=device), use_cache=True, logits_to_keep=1,
                       **{self.cache_kw: prefix})
            rows = []
            for suffix in suffixes:
                positions = torch.arange(len(prefix_ids), len(prefix_ids) + len(suffix), device=device)[None, :]
                out = self.model(input_ids=torch.tensor([suffix], device=device), position_ids=positions,
                                 use_cache=True, logits_to_keep=1, **{self.cache_kw: copy.deepcopy(prefix)})
                rows.append(torch.log_softmax(out.logits[0, -1].float(), dim=-1)[keep].tolist())
            return rows


@dataclass
class _Row:
    """One request being decoded."""

    job: Job
    ticket: Any
    generator: numpy.random.Generator
    logits: torch.Tensor
    alone: bool = False
    """Batch-invariant (greedy, `Engine.batch_invariant`)."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None

    def position(self) -> int:
        """Position id of the token being fed (its prompt's length plus the tokens before it)."""
        return len(self.job.prompt_ids) + len(self.tokens) - 1

    def remaining(self) -> int:
        return self.job.sampling.max_new_tokens - len(self.tokens)

"""The trainable backend: any Hugging Face causal LM, batched, with exact token ids and logprobs.

- Prompts are rendered with the model's own chat template, with `tools=` when the template takes
  them (Qwen3: `<tool_call>` format and the `enable_thinking` switch); otherwise the conversation
  is rewritten into the same text protocol (see `prompts.plain_chat`); a tokenizer without any
  template gets plain ChatML.
- Generation is our own loop over a KV cache, so every sampled token's logprob is recorded as
  log_softmax(logits / temperature)[token] — what a trainer recomputes from the same tokens
  (top-k / top-p only narrow the sampling, not the recorded distribution). Greedy (temperature 0)
  records log_softmax(logits).
- Concurrent requests are coalesced into one left-padded batch (`Batcher`); each row samples with
  its own seeded generator, so results do not depend on which requests shared a batch.
- The rehearse role is a fresh chat (EnvACE), so there is no act prefix to reuse across roles; within
  one generation the prompt is encoded once and every new token reuses the KV cache.
"""

from __future__ import annotations

import inspect
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from envace_mcp.errors import UserError
from envace_mcp.policy._batching import Batcher
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
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        # transformers 5.2x renamed `past_key_values` to `cache`; accept both generations of the API
        self._cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.prefill_stats: dict[str, float] = {"prompt_tokens": 0, "reused_tokens": 0, "prefill_s": 0.0, "decode_s": 0.0}
        """Running totals: prompt tokens seen, of them reused from the prefix cache, seconds spent."""
        self.batcher: Batcher[_Job, RawCompletion] = Batcher(self.generate_batch, max_batch=max_batch_size,
                                                             window_s=batch_window_s)

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

            lm = PeftModel.from_pretrained(lm, str(adapter))
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
        """Generate every job in one left-padded batch (synchronous; the batcher calls it in a thread)."""
        with self._lock, torch.inference_mode():
            return self._generate(jobs)

    def _generate(self, jobs: list[_Job]) -> list[RawCompletion]:
        from transformers import DynamicCache

        device = next(self.model.parameters()).device
        batch = len(jobs)
        # Prefill one prompt at a time (no padding waste, the fast causal kernel, and shared
        # prefixes reused from the prefix cache), then decode all rows together over one
        # left-padded cache.
        started = time.perf_counter()
        prefilled = [self._prefill(job.prompt_ids, device) for job in jobs]
        decode_started = time.perf_counter()
        self.prefill_stats["prefill_s"] += decode_started - started
        lengths = [len(job.prompt_ids) for job in jobs]
        width = max(lengths)
        cache = DynamicCache(config=self.model.config)
        for layer in range(len(prefilled[0][0])):
            keys = torch.cat([F.pad(kv[layer][0], (0, 0, width - n, 0)) for (kv, _), n in zip(prefilled, lengths)])
            values = torch.cat([F.pad(kv[layer][1], (0, 0, width - n, 0)) for (kv, _), n in zip(prefilled, lengths)])
            cache.update(keys, values, layer)
        mask = torch.zeros((batch, width), dtype=torch.long, device=device)
        for row, n in enumerate(lengths):
            mask[row, width - n:] = 1
        logits = torch.stack([last for _, last in prefilled])
        next_pos = torch.tensor(lengths, dtype=torch.long, device=device)[:, None]
        generators = [torch.Generator(device="cpu").manual_seed(job.seed) for job in jobs]
        tokens: list[list[int]] = [[] for _ in jobs]
        logprobs: list[list[float]] = [[] for _ in jobs]
        finish: list[str | None] = [None] * batch
        for _step in range(max(j.sampling.max_new_tokens for j in jobs)):
            step_tokens = torch.full((batch, 1), self.pad_id, dtype=torch.long, device=device)
            for row, job in enumerate(jobs):
                if finish[row] is not None:
                    continue
                token, logprob = _sample(logits[row], job.sampling, generators[row])
                tokens[row].append(token)
                logprobs[row].append(logprob)
                step_tokens[row, 0] = token
                if token in self.eos_ids or self._hit_stop(tokens[row], job.sampling.stop):
                    finish[row] = "stop"
                elif len(tokens[row]) >= job.sampling.max_new_tokens:
                    finish[row] = "length"
            if all(f is not None for f in finish):
                break
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long, device=device)], dim=1)
            out = self.model(input_ids=step_tokens, attention_mask=mask, position_ids=next_pos,
                             use_cache=True, **{self._cache_kw: cache})
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        self.prefill_stats["decode_s"] += time.perf_counter() - decode_started
        return [
            RawCompletion(text=self._decode(tokens[row]), prompt_ids=job.prompt_ids, completion_ids=tokens[row],
                          logprobs=logprobs[row], finish_reason=finish[row] or "length")  # type: ignore[arg-type]
            for row, job in enumerate(jobs)
        ]

    def _prefill(self, prompt_ids: list[int], device: torch.device) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Per-layer (keys, values) of one prompt and the logits after its last token."""
        from transformers import DynamicCache

        if not prompt_ids:
            raise UserError("cannot generate from an empty prompt")
        reused, kv = self.prefix_cache.lookup(prompt_ids)
        cache = DynamicCache(config=self.model.config)
        for layer, (keys, values) in enumerate(kv):
            cache.update(keys[:, :, :reused], values[:, :, :reused], layer)
        rest = torch.tensor([prompt_ids[reused:]], dtype=torch.long, device=device)
        positions = torch.arange(reused, len(prompt_ids), device=device)[None, :]
        out = self.model(input_ids=rest, position_ids=positions, use_cache=True, **{self._cache_kw: cache})
        layers = _cache_layers(cache)
        self.prefix_cache.store(prompt_ids, layers)
        self.prefill_stats["prompt_tokens"] += len(prompt_ids)
        self.prefill_stats["reused_tokens"] += reused
        return layers, out.logits[0, -1, :].float()

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
    conversation extend the previous turn's prompt. Bounded by a total token budget (LRU).
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.entries: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []

    def lookup(self, ids: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Length of the longest stored prefix of `ids` (leaving at least one token to run) and its KV."""
        best, best_kv = 0, []
        for index, (stored, kv) in enumerate(self.entries):
            n = _common_prefix(stored, ids, limit=len(ids) - 1)
            if n > best:
                best, best_kv, hit = n, kv, index
        if best:
            self.entries.append(self.entries.pop(hit))
        return best, best_kv

    def store(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if self.max_tokens <= 0 or len(ids) > self.max_tokens:
            return
        self.entries = [(s, k) for s, k in self.entries if s != ids]
        self.entries.append((list(ids), kv))
        while sum(len(s) for s, _ in self.entries) > self.max_tokens:
            self.entries.pop(0)


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


def _sample(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
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
    probs = torch.softmax(filtered, dim=-1)
    token = int(torch.multinomial(probs.cpu(), 1, generator=generator))
    return token, float(logprobs[token])


def _chatml(chat: list[ChatMessage]) -> str:
    """Documented fallback for tokenizers with no chat template at all: ChatML."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)
    return text + "<|im_start|>assistant\n"

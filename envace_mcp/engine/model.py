"""Loading a model, and what the engine needs to know about it or change in it."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from envace_mcp.errors import UserError

logger = logging.getLogger(__name__)


BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""CPU flags (Linux `/proc/cpuinfo`, as `lscpu` shows them) of native bf16 arithmetic: with them bf16 runs
1.6-2.2x faster than fp32 here; without them PyTorch emulates it, ~1.9x slower."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where `/proc/cpuinfo` does not exist)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((row for row in text.splitlines() if row.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def native_bf16(device: str = "cpu") -> bool:
    """Whether `device` does bf16 natively (an accelerator that supports it, or a CPU with `BF16_FLAGS`)."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return any(flag in cpu_flags() for flag in BF16_FLAGS)


def machine() -> str:
    """One line for benchmark headers: the CPU's bf16 flags and torch's threads (figures depend on both)."""
    flags = [f for f in BF16_FLAGS if f in cpu_flags()]
    return (f"CPU bf16: {'native (' + ', '.join(flags) + ')' if flags else 'emulated (no amx_bf16 / avx512_bf16)'}; "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads")


DTYPE_ENV = "ENVACE_DTYPE"
"""Set (e.g. `float32`) to pin what "auto" picks, everywhere: generation dtype and training autocast."""


def resolve_dtype(dtype: str | torch.dtype, device: str = "cpu") -> torch.dtype | str:
    """A torch dtype for a name. "auto": bfloat16 where `device` does it natively, else float32 (the
    choice is logged; `ENVACE_DTYPE` pins it); "checkpoint": the checkpoint's own (transformers' "auto")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "checkpoint":
        return "auto"
    if dtype == "auto":
        pinned = os.environ.get(DTYPE_ENV, "").strip()
        if pinned and pinned != "auto":
            return resolve_dtype(pinned, device)
        chosen = torch.bfloat16 if native_bf16(device) else torch.float32
        logger.info("dtype auto -> %s on %s (%s)", str(chosen).removeprefix("torch."), device, machine())
        return chosen
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16}[dtype]
    except KeyError:
        raise UserError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16, float16 or checkpoint") from None


def autocast_bf16(setting: bool | str, device: str = "cpu") -> bool:
    """Whether a training pass runs under bf16 autocast: True / False as given, "auto" where `device`
    does bf16 natively (`resolve_dtype("auto")`)."""
    if setting == "auto":
        return resolve_dtype("auto", device) == torch.bfloat16
    return bool(setting)


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Loading and wrapping a model without transformers' "Loading weights" bar and peft's FutureWarning
    about transformers' renamed `is_gradient_checkpointing`: library noise, not something a user of
    ours can act on, whether they came through the CLI or Python. `ENVACE_VERBOSE=1` shows it."""
    if os.environ.get("ENVACE_VERBOSE"):
        yield
        return
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def load_model(model: str | Path, *, adapter: str | Path | None = None, dtype: str | torch.dtype = "float32",
               device: str | None = None, trainable: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) for a Hugging Face id or local folder (`policy.embedded.embedded_model_dir()`
    is the embedded default), under a LoRA `adapter` folder if given (`trainable`: its weights train).
    Every loader of the project comes here, so a bad name, folder or adapter gives the same clear error
    everywhere."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        with quiet_loading():
            lm = AutoModelForCausalLM.from_pretrained(str(model), dtype=resolve_dtype(dtype, device or "cpu"))
    except OSError as exc:
        raise UserError(f"could not load model {str(model)!r}: {exc}") from exc
    if adapter is not None:
        from peft import PeftModel

        try:
            with quiet_loading():
                lm = PeftModel.from_pretrained(lm, str(adapter), is_trainable=trainable)
        except (OSError, ValueError) as exc:  # no adapter_config.json there, or not an adapter of this model
            raise UserError(f"could not load adapter {str(adapter)!r}: {exc}") from exc
    if device is not None:
        lm.to(device)
    return lm, tokenizer


def cache_keyword(base: Any) -> str:
    """transformers 5.2x renamed `past_key_values` to `cache`; accept both generations of the API."""
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def weights_key(model: Any) -> int:
    """Changes whenever a parameter is changed in place (an optimizer step, `load_state_dict`) or
    replaced: PyTorch counts in-place writes per tensor (`_version`). ~0.1 ms for 500 parameters."""
    return hash(tuple((id(p), _version(p)) for p in model.parameters()))


def _version(tensor: torch.Tensor) -> int:
    try:
        return tensor._version
    except RuntimeError:  # an inference tensor (a model loaded under inference_mode) keeps no count
        return 0



def dense_head_input(model: Any) -> None:
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


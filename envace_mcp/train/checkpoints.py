"""Checkpoints that resume bit-for-bit: trainable weights, optimizer, RNG states and the data order.

`state.safetensors` holds the tensors (weights, optimizer moments, torch's RNG) and, in its metadata,
the rest as JSON (step, the data order and its RNG, the config): nothing in a checkpoint is unpickled,
so a planted one cannot run code. The pickle `state.pt` of older versions is refused, never loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from envace_mcp._files import write_atomic
from envace_mcp.errors import UserError
from envace_mcp.policy.tool_text import adapter_formats, write_adapter_format

STATE = "state.safetensors"
OLD_STATE = "state.pt"
FORMAT = 1
"""The layout of the JSON in a checkpoint's metadata (`envace`); another one is refused."""


class Checkpoints:
    """One checkpoint under `folder` (`state.safetensors`, written atomically, and the model's own
    `save_pretrained`)."""

    def __init__(self, folder: Path, rank: int = 0) -> None:
        self.folder, self.rank = folder, rank

    def save(self, *, step: int, model: Any, optimizer: torch.optim.Optimizer, order: dict[str, Any],
             config: dict[str, Any]) -> None:
        if self.rank != 0:
            return
        self._publish(self.snapshot(step=step, model=model, optimizer=optimizer, order=order, config=config),
                      model, config)

    @staticmethod
    def snapshot(*, step: int, model: Any, optimizer: torch.optim.Optimizer, order: dict[str, Any],
                 config: dict[str, Any]) -> bytes:
        """What `save` would write to `state.safetensors` now, serialised in memory (later steps cannot change it)."""
        from safetensors.torch import save

        trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        tensors: dict[str, torch.Tensor] = {}
        meta = {"format": FORMAT, "step": step, "rng": _encode(order["rng"], "rng", tensors),
                "order": order["order"], "config": _encode(config, "config", tensors),
                "params": sorted(trainable), "optimizer": _encode(optimizer.state_dict(), "optimizer", tensors)}
        tensors.update({f"param/{n}": p.detach().cpu().contiguous().clone() for n, p in trainable.items()})
        tensors["torch_rng"] = torch.get_rng_state()
        return save(tensors, metadata={"envace": json.dumps(meta)})

    def save_snapshot(self, snapshot: bytes, *, model: Any, optimizer: torch.optim.Optimizer) -> None:
        """Put the model, optimizer and torch's RNG back as `snapshot` holds them, and save it as the checkpoint."""
        if self.rank != 0:
            return
        meta, tensors = _read(snapshot, "the snapshot")
        _restore(meta, tensors, model, optimizer)
        self._publish(snapshot, model, meta["config"])

    def _publish(self, data: bytes, model: Any, config: dict[str, Any]) -> None:
        """`data` becomes `state.safetensors` (atomically), beside the model's own files."""
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.folder / STATE, data)
        model.save_pretrained(self.folder / "model")
        adapter = config.get("adapter")
        if adapter:  # the prompt formats the starting adapter learned travel on (`envace.json`)
            formats = adapter_formats(adapter)
            if formats:
                write_adapter_format(self.folder / "model", **formats)  # type: ignore[arg-type]

    def load(self, *, model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Restore weights, optimizer and torch's RNG; returns `{"step", "order": {"rng", "order"}}`, or
        None when there is no checkpoint. An old pickle checkpoint is a `UserError` (it is never read)."""
        path = self.folder / STATE
        if not path.exists():
            old = self.folder / OLD_STATE
            if old.exists() or old.is_symlink():
                raise UserError(f"{old} is a checkpoint in the old pickle format, which envace no longer loads "
                                f"(unpickling can run code); delete {self.folder} to train afresh, or use another --out")
            return None
        meta, tensors = _read(path, str(path))
        _restore(meta, tensors, model, optimizer)
        rng = tuple(tuple(part) if isinstance(part, list) else part for part in meta["rng"])  # random.setstate wants tuples
        return {"step": meta["step"], "order": {"rng": rng, "order": meta["order"]}}


def read_checkpoint(source: bytes | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A checkpoint's JSON part (tensors inside it restored) and its trainable weights by name."""
    meta, tensors = _read(source if isinstance(source, bytes) else Path(source), str(source)[:80])
    return meta, {name: tensors[f"param/{name}"] for name in meta["params"]}


def _read(source: bytes | Path, what: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The JSON metadata (its tensor references resolved) and the tensors of a checkpoint."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        data = source if isinstance(source, bytes) else source.read_bytes()
        tensors = load(data)
        size = int.from_bytes(data[:8], "little")
        meta = json.loads(json.loads(data[8: 8 + size])["__metadata__"]["envace"])
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format') if isinstance(meta, dict) else meta!r}, not {FORMAT}")
        for key in ("rng", "config", "optimizer"):
            meta[key] = _decode(meta[key], tensors)
        missing = [n for n in meta["params"] if f"param/{n}" not in tensors] + [k for k in ("torch_rng",) if k not in tensors]
        if missing:
            raise ValueError(f"no tensor {missing[0]!r}")
    except (SafetensorError, ValueError, KeyError, TypeError, OSError) as exc:
        raise UserError(f"{what}: not a checkpoint this envace-mcp wrote ({type(exc).__name__}: {exc}); "
                        "delete it to train afresh") from None
    return meta, tensors


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """`value` as JSON: tensors become `{"__tensor__": key}` (stored in `tensors`), dicts with other than
    string keys (an optimizer's state by parameter index) `{"__items__": [[key, value], ...]}`, tuples lists."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().cpu().contiguous().clone()
        return {"__tensor__": path}
    if isinstance(value, dict):
        items = [[k, _encode(v, f"{path}/{k}", tensors)] for k, v in value.items()]
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return dict(items)
        return {"__items__": items}
    if isinstance(value, (list, tuple)):
        return [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # a Path or an enum in a config: as its text


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__tensor__"}:
            return tensors[value["__tensor__"]]
        if set(value) == {"__items__"}:
            return {k: _decode(v, tensors) for k, v in value["__items__"]}
        return {k: _decode(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    return value


def _restore(meta: dict[str, Any], tensors: dict[str, torch.Tensor], model: Any,
             optimizer: torch.optim.Optimizer) -> None:
    named = dict(model.named_parameters())
    unknown = [n for n in meta["params"] if n not in named]
    if unknown:
        raise UserError(f"the checkpoint holds weights this model has not ({unknown[0]!r}): another model's run")
    with torch.no_grad():
        for name in meta["params"]:
            named[name].copy_(tensors[f"param/{name}"])
    optimizer.load_state_dict(meta["optimizer"])
    torch.set_rng_state(tensors["torch_rng"])

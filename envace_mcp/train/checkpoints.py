"""Checkpoints that resume bit-for-bit: trainable weights, optimizer, RNG states and the data order."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch


class Checkpoints:
    """One checkpoint under `folder` (`state.pt`, written atomically, and the model's own `save_pretrained`)."""

    def __init__(self, folder: Path, rank: int = 0) -> None:
        self.folder, self.rank = folder, rank

    def save(self, *, step: int, model: Any, optimizer: Any, order: dict[str, Any], config: dict[str, Any]) -> None:
        if self.rank != 0:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.save(_state(step, model, optimizer, order, config), self.folder / "state.pt.tmp")
        self._publish(model, config)

    @staticmethod
    def snapshot(*, step: int, model: Any, optimizer: Any, order: dict[str, Any], config: dict[str, Any]) -> bytes:
        """What `save` would write to `state.pt` now, serialised in memory (later steps cannot change it)."""
        buffer = io.BytesIO()
        torch.save(_state(step, model, optimizer, order, config), buffer)
        return buffer.getvalue()

    def save_snapshot(self, snapshot: bytes, *, model: Any, optimizer: Any) -> None:
        """Put the model, optimizer and torch's RNG back as `snapshot` holds them, and save it as the checkpoint."""
        if self.rank != 0:
            return
        state = torch.load(io.BytesIO(snapshot), weights_only=False, map_location="cpu")
        _restore(state, model, optimizer)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "state.pt.tmp").write_bytes(snapshot)
        self._publish(model, state["config"])

    def _publish(self, model: Any, config: dict[str, Any]) -> None:
        """`state.pt.tmp` becomes `state.pt` (atomically), beside the model's own files."""
        (self.folder / "state.pt.tmp").replace(self.folder / "state.pt")
        model.save_pretrained(self.folder / "model")
        adapter = config.get("adapter")
        if adapter:  # the prompt formats the starting adapter learned travel on (`envace.json`)
            from envace_mcp.policy.tool_text import adapter_formats, write_adapter_format

            formats = adapter_formats(adapter)
            if formats:
                write_adapter_format(self.folder / "model", **formats)  # type: ignore[arg-type]

    def load(self, *, model: Any, optimizer: Any) -> dict[str, Any] | None:
        """Restore weights, optimizer and torch's RNG; returns `{"step", "order": {"rng", "order"}}`, or
        None when there is no checkpoint."""
        path = self.folder / "state.pt"
        if not path.exists():
            return None
        state = torch.load(path, weights_only=False, map_location="cpu")
        _restore(state, model, optimizer)
        return {"step": state["step"], "order": {"rng": state["rng"], "order": state["order"]}}


def _state(step: int, model: Any, optimizer: Any, order: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return {"step": step, "params": trainable, "optimizer": optimizer.state_dict(), "rng": order["rng"],
            "torch_rng": torch.get_rng_state(), "order": order["order"], "config": config}


def _restore(state: dict[str, Any], model: Any, optimizer: Any) -> None:
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state["params"].items():
            named[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])

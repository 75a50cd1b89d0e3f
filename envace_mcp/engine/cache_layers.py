"""The cache layers a decode batch works with: whether a model's cache is all plain full-attention layers
(only those join one shared batch), and the layer that decodes into the batch's own buffers.

transformers is imported when these are first called, like everywhere in the engine (importing the
package does not import it)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def plain_layers(config: PretrainedConfig) -> bool:
    """Whether every layer of the model's cache is the library's plain full-attention `DynamicLayer`."""
    from transformers import DynamicCache

    layers = getattr(DynamicCache(config=config), "layers", None)  # older caches have no layer objects
    return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)


@functools.cache
def preallocated_layer() -> type:
    """`DynamicLayer` (imported lazily, like the rest of transformers here) over a `DecodeBatch` buffer."""
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


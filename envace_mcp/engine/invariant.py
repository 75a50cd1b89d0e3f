"""Batch-invariant decoding: a greedy row gets the same logits, bit for bit, whatever else the decode batch
holds and whatever the prefix cache held, so a greedy evaluation gives the same tokens run after run.

Three things made a row's numbers depend on its companions (measured on the embedded model, 2-core AMD
EPYC with avx512_bf16, torch 2.13):
- the linear layers: a CPU GEMM takes rows in tiles (4 for the fp32 kernel here, 2 for bf16); a row in
  a partial last tile goes through another kernel, so in fp32 most of a row's outputs changed with the
  number of rows, in bf16 a few (most differences vanish in the rounding to bf16). Padding the step's
  rows to a whole number of tiles gives every row the full-tile result (`row_tile`, measured once per
  process for the model's layer shapes);
- the attention: one kernel call over every row's columns sums a row's keys in another order when
  other rows pad it on the left (fp32 and bf16), and a shared-prefix group splits its softmax in two.
  A batch-invariant row attends alone, over its own columns only (`attention.RowColumns`), and joins no
  prefix group;
- the prefill: a prompt that reuses a cached prefix computes its other tokens in a forward of another
  length than one that does not. Greedy prompts are prefilled in `PREFILL_CHUNK`-token chunks at fixed
  positions, and reuse only whole chunks prefilled so, so a token's keys and values come out the same
  whichever prompt computed them.

Sampled rows are left as they were (batched attention, shared prefixes, one prefill forward): their
sampler is not moved by last-bit noise, and GRPO rollouts keep their speed. The price is paid by greedy
generation: about 0.62x the tokens per CPU-second of batched greedy decoding (8 rows sharing a
1,500-token prompt prefix, embedded model, bf16), mostly from attending alone and from the chunked
prefill.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

PREFILL_CHUNK = 128
"""Tokens per prefill forward of a greedy prompt, at positions 0, 128, 256, ...: what the prefix cache
reuses is cut to a multiple of it (up to 127 more tokens to prefill), and each chunk is a forward of its
own. Of 64, 128 and 256, 128 prefilled 8 prompts of 1,800 tokens sharing 1,500 fastest (embedded model,
bf16, 2 cores): 1.3-1.45x the CPU time of unchunked prefill, 1.6x with 64 or 256."""

TILES = (1, 2, 4, 8, 16, 32)


def row_tile(model: Any, max_rows: int) -> int | None:
    """The fewest rows to pad a decode step to a multiple of so that each row's linear-layer outputs do
    not depend on how many rows there are or where it sits among them (for every weight shape of
    `model`, up to `max_rows` rows); None when no tile up to 32 does (then greedy rows decode alone)."""
    shapes = sorted({(tuple(m.weight.shape), m.weight.dtype, m.weight.device) for m in model.modules()
                     if isinstance(m, torch.nn.Linear)}, key=lambda k: k[0][0] * k[0][1])  # cheap failures first
    for tile in TILES:
        if all(_tile_holds(shape, dtype, device, tile, max_rows) for shape, dtype, device in shapes):
            return tile
    return None


@functools.cache
def _tile_holds(shape: tuple[int, int], dtype: torch.dtype, device: torch.device, tile: int, max_rows: int) -> bool:
    """Whether rows padded to a multiple of `tile` give every row the same output through a `shape` weight.

    The kernel a GEMM takes depends on the shapes, not the values, so the probe uses values that show
    its order of summation: each row's big terms (±2**26) cancel, and the ±1 terms survive or vanish in
    the float32 accumulator depending on whether they are added next to a big one. Random values would
    hide it: in bf16 two orders round to the same output almost always (the embedded model's down_proj
    gave equal outputs on random inputs and not on real activations)."""
    out_features, in_features = shape
    top = -(-max(max_rows, 2) // tile) * tile
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(0, 2, shape, generator=generator).float() * 2 - 1  # ±1: products are exact
    x = torch.randint(0, 2, (top, in_features), generator=generator).float() * 2 - 1
    pairs = max(1, min(8, in_features // 4))
    for row in range(top):
        at = torch.randperm(in_features, generator=generator)[: 2 * pairs]
        weight[:, at] = 1.0  # every output sees the big terms with the same sign: they cancel in pairs
        x[row, at[:pairs]], x[row, at[pairs:]] = 2.0**26, -(2.0**26)
    weight, x = weight.to(dtype=dtype, device=device), x.to(dtype=dtype, device=device)
    with torch.inference_mode():
        reference = F.linear(x, weight)
        for rows in range(tile, top, tile):
            if not torch.equal(F.linear(x[:rows], weight), reference[:rows]):
                return False
        for shift in (1, top // 2):  # the same rows in other slots (rows leave by swapping)
            order = torch.roll(torch.arange(top, device=device), shift)
            if not torch.equal(F.linear(x[order], weight), reference[order]):
                return False
    return True

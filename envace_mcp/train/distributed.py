"""Running the GRPO trainers under `torchrun --nproc_per_node N` (torch.distributed DDP).

Every rank draws the same seeded group order, takes its share of each step's groups
(`groups[rank::world]`: whole groups, so role-wise baselines stay local), runs forward/backward on
them, and DDP all-reduces the gradients once per step (the other micro-batches run under
`no_sync`). Losses are normalised by the *global* token / row counts and multiplied by the world
size (DDP averages gradients), so the update equals the single-process update on the same global
batch. gloo on CPU, nccl on GPU. Rank 0 alone writes checkpoints, metrics and the plot.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def setup() -> tuple[int, int]:
    """(rank, world size); joins the process group when launched by torchrun with more than one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce(value: float, op: str = "sum") -> float:
    """A scalar summed (or maxed) over ranks; itself when not distributed."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return float(tensor.item())


def reduce_all(values: dict[str, float]) -> dict[str, float]:
    """Each value summed over ranks, in one all-reduce; a copy of `values` when not distributed."""
    if not dist.is_initialized():
        return {k: float(v) for k, v in values.items()}
    keys = sorted(values)  # the same order on every rank
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device())
    dist.all_reduce(tensor)
    return dict(zip(keys, tensor.tolist()))


def gather(values: list[float]) -> list[float]:
    """Every rank's list, concatenated in rank order."""
    if not dist.is_initialized():
        return list(values)
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, list(values))
    return [v for part in out for v in part]


def wrap(model: torch.nn.Module) -> torch.nn.Module:
    """DDP around `model` when distributed (parameters are broadcast from rank 0), else `model`."""
    if not dist.is_initialized():
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [torch.cuda.current_device()] if device().type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()

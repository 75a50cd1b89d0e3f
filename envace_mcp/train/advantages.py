"""A step's advantages: EnvACE's per-(task, role) baselines or standard GRPO's per-run ones, by group."""

from __future__ import annotations

from collections import defaultdict

import torch

from envace_mcp.train import distributed
from envace_mcp.train.config import GRPOConfig
from envace_mcp.train.grpo import _std, role_advantages, trajectory_advantages
from envace_mcp.train.rows import ROLE_INDEX, Segment


def group_key(row: Segment) -> str:
    return row.group_id or row.task_id or row.run_id


def groups_of(rows: list[Segment]) -> list[list[Segment]]:
    grouped: dict[str, list[Segment]] = defaultdict(list)
    for row in rows:
        grouped[group_key(row)].append(row)
    return [grouped[k] for k in sorted(grouped)]


def step_advantages(groups: list[list[Segment]], config: GRPOConfig) -> torch.Tensor:  # [S]
    """Advantages of every segment of a step's groups (in order): role-wise or trajectory baselines
    inside each group; "batch" std scaling over every segment of the step on every rank."""
    rows = [r for g in groups for r in g]
    if not rows:
        return torch.zeros(0)
    extra = config.experimental
    rewards = torch.tensor([float(r.reward) + (extra.fidelity_weight * r.fidelity
                                               if r.role == "rehearse" and r.fidelity is not None else 0.0)
                            + extra.call_f1_weight * (r.call_f1 or 0.0) for r in rows])  # [S]
    group_index = torch.tensor([i for i, g in enumerate(groups) for _ in g])  # [S]
    scale = config.scale_rewards
    if config.advantage == "role":
        roles = torch.tensor([ROLE_INDEX[r.role] for r in rows])  # [S]
        advantages = role_advantages(rewards, group_index, roles, scale="none" if scale == "batch" else scale)
    else:
        run_ids = {run: i for i, run in enumerate(dict.fromkeys(r.run_id for r in rows))}
        runs = torch.tensor([run_ids[r.run_id] for r in rows])  # [S]
        advantages = trajectory_advantages(rewards, group_index, runs, scale="none" if scale == "batch" else scale)
    if scale == "batch":
        everything = torch.tensor(distributed.gather(rewards.tolist()))  # the global step's segments
        advantages = advantages / (_std(everything) + 1e-4)
    return advantages

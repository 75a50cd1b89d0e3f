"""The GRPO math as small pure functions: tensors in, tensors (and metrics) out.

Shapes: S segments (one act turn or one rehearsal each), B rows in a batch, T completion positions,
V vocabulary. Role-wise advantages follow EnvACE; the loss follows TRL's `_compute_loss` (1.16) term
for term, with EnvACE's defaults (token-mean aggregation, ε = 0.2, no KL).
"""

from __future__ import annotations

from typing import Literal

import torch

LossType = Literal["token_mean", "sequence_mean", "dr_grpo", "dapo"]
Scale = Literal["none", "group", "batch"]


def _std(values: torch.Tensor) -> torch.Tensor:
    """Bessel-corrected std, 0 for a single value (TRL's nanstd on finite values)."""
    if values.numel() < 2:
        return torch.zeros((), dtype=values.dtype)
    return values.std(unbiased=True)


def role_advantages(
    rewards: torch.Tensor,  # [S] the trajectory reward of each segment's run
    groups: torch.Tensor,  # [S] group index (one group per task in a step)
    roles: torch.Tensor,  # [S] role index (0 = act, 1 = rehearse)
    *,
    scale: Scale = "none",
    eps: float = 1e-4,
) -> torch.Tensor:  # [S]
    """EnvACE's role-wise advantage: A = R − mean of R over all segments of that role in the group.

    Segments, not trajectories, are averaged, so longer runs weigh more (as in EnvACE). `scale`
    adds TRL-style std division: per (group, role) ("group"), over the whole batch ("batch"), or
    none (EnvACE's default).
    """
    advantages = torch.zeros_like(rewards)  # [S]
    keys = torch.stack([groups, roles], dim=1)  # [S, 2]
    for key in torch.unique(keys, dim=0):  # each (group, role) cell
        cell = (keys == key).all(dim=1)  # [S] bool
        centred = rewards[cell] - rewards[cell].mean()  # [s]
        if scale == "group":
            centred = centred / (_std(rewards[cell]) + eps)
        advantages[cell] = centred
    if scale == "batch":
        advantages = advantages / (_std(rewards) + eps)  # [S]
    return advantages


def trajectory_advantages(
    rewards: torch.Tensor,  # [S] the reward of each segment (its run's, + any per-segment bonus)
    groups: torch.Tensor,  # [S] group index
    runs: torch.Tensor,  # [S] run index: segments of one run share it
    *,
    scale: Scale = "none",
    eps: float = 1e-4,
) -> torch.Tensor:  # [S]
    """Standard GRPO's baseline for segmented runs: A = R − mean over the group's *runs* (each run counted
    once, whatever its number of segments), every segment of a run taking its run's advantage. Equal to
    `group_advantages` on the runs' rewards. `scale="group"`: over the std of the group's run rewards."""
    advantages = torch.zeros_like(rewards)  # [S]
    for group in torch.unique(groups):
        cell = groups == group  # [S] bool
        cell_runs = runs[cell]  # [s]
        first = torch.stack([torch.nonzero(cell_runs == r)[0, 0] for r in torch.unique(cell_runs)])  # [k]
        per_run = rewards[cell][first]  # [k] one reward per run
        centred = rewards[cell] - per_run.mean()  # [s]
        if scale == "group":
            centred = centred / (_std(per_run) + eps)
        advantages[cell] = centred
    if scale == "batch":
        advantages = advantages / (_std(rewards) + eps)  # [S]
    return advantages


def group_advantages(
    rewards: torch.Tensor,  # [G*K] K runs per group, grouped contiguously
    group_size: int,
    *,
    scale: Scale = "group",
    eps: float = 1e-4,
) -> torch.Tensor:  # [G*K]
    """Standard (trajectory-level) GRPO advantages, exactly TRL's: R − group mean, over std + 1e-4."""
    grouped = rewards.view(-1, group_size)  # [G, K]
    mean = grouped.mean(dim=1).repeat_interleave(group_size)  # [G*K]
    advantages = rewards - mean  # [G*K]
    if scale == "group":
        std = torch.stack([_std(g) for g in grouped]).repeat_interleave(group_size)  # [G*K]
        advantages = advantages / (std + eps)
    elif scale == "batch":
        advantages = advantages / (_std(rewards) + eps)
    return advantages


def token_logprobs(
    logits: torch.Tensor,  # [B, T, V] logits predicting each completion token
    tokens: torch.Tensor,  # [B, T] the completion tokens
    temperature: float = 1.0,
) -> torch.Tensor:  # [B, T]
    """log p(token) under logits / temperature — what the sampler recorded."""
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)  # [B, T, V]
    picked = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return picked - torch.logsumexp(scaled, dim=-1)  # [B, T]: log_softmax at the token, without a [B, T, V] copy


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:  # [B, T] each
    """Schulman's k3 estimator of KL(π‖π_ref), per token: exp(r − l) − (r − l) − 1 ≥ 0."""
    delta = ref_logp - logp  # [B, T]
    return torch.exp(delta) - delta - 1  # [B, T]


def grpo_loss(
    logp: torch.Tensor,  # [B, T] current policy logprobs of the completion tokens
    old_logp: torch.Tensor,  # [B, T] logprobs recorded when sampling
    advantages: torch.Tensor,  # [B]
    mask: torch.Tensor,  # [B, T] 1 on model-generated tokens, 0 on padding and tool output
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,  # [B, T] reference policy, needed when beta > 0
    loss_type: LossType = "token_mean",
    max_completion_length: int | None = None,
    num_items_in_batch: float | None = None,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate −min(ρA, clip(ρ, 1−ε, 1+ε_high)A) (+ β·k3 KL), aggregated by `loss_type`:

    - `token_mean`: masked mean over all tokens of the batch (EnvACE; TRL `bnpo`);
    - `sequence_mean`: mean per sequence, then over sequences (TRL `grpo`);
    - `dr_grpo`: sum over tokens / (B · max_completion_length) (TRL `dr_grpo`);
    - `dapo`: sum over tokens / tokens in the whole generation batch (TRL `dapo`).

    `tis_cap`: the completions were sampled by another engine (a vLLM server) at the weights being
    trained, and `old_logp` are that engine's. Its kernels differ from ours, so the ratio is taken
    against our own logprobs, detached (1 in value: one update per batch of rollouts), and each token's
    surrogate is weighted by the truncated importance ratio min(π_ours / π_engine, cap) — truncated
    importance sampling, as verl and TRL correct rollout-engine mismatch. The metrics then add the
    mismatch: mean |Δ logp|, its KL (k3, engine → ours) and the fraction of tokens truncated.
    """
    mask = mask.to(logp.dtype)  # [B, T]
    weight = None
    if tis_cap is not None:
        engine_logp, old_logp = old_logp, logp.detach()
        importance = torch.exp(old_logp - engine_logp)  # [B, T] π_ours / π_engine
        weight = importance.clamp(max=tis_cap)  # [B, T]
    ratio = torch.exp(logp - old_logp)  # [B, T]
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + (epsilon_high if epsilon_high is not None else epsilon))  # [B, T]
    adv = advantages.unsqueeze(1)  # [B, 1]
    per_token = -torch.min(ratio * adv, clipped * adv)  # [B, T]
    if weight is not None:
        per_token = per_token * weight
    kl = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        kl = kl_k3(logp, ref_logp)  # [B, T]
        per_token = per_token + beta * kl
    tokens = mask.sum().clamp(min=1.0)  # []
    if loss_type == "token_mean":
        loss = (per_token * mask).sum() / tokens
    elif loss_type == "sequence_mean":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length")
        loss = (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    elif loss_type == "dapo":
        loss = (per_token * mask).sum() / (torch.tensor(num_items_in_batch) if num_items_in_batch else tokens).clamp(min=1.0)
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}")
    with torch.no_grad():
        low = (ratio < 1 - epsilon) & (adv < 0)  # [B, T] clipped from below
        high = (ratio > 1 + (epsilon_high if epsilon_high is not None else epsilon)) & (adv > 0)  # [B, T]
        metrics = {
            "loss": float(loss),
            "ratio_mean": float((ratio * mask).sum() / tokens),
            "clip_low": float((low.to(mask.dtype) * mask).sum() / tokens),
            "clip_high": float((high.to(mask.dtype) * mask).sum() / tokens),
            "kl": float((kl * mask).sum() / tokens) if kl is not None else 0.0,
            "tokens": float(tokens),
        }
        if weight is not None:
            delta = engine_logp - old_logp  # [B, T] log(π_engine / π_ours)
            metrics |= {"mismatch_abs": float((delta.abs() * mask).sum() / tokens),
                        "mismatch_kl": float(((importance + delta - 1) * mask).sum() / tokens),
                        "tis_truncated": float(((importance > tis_cap).to(mask.dtype) * mask).sum() / tokens)}
    return loss, metrics

"""GRPO math on hand-computed tensors, and against TRL 1.16's formulas on identical inputs."""

import math

import pytest
import torch

from envace_mcp.train.grpo import grpo_loss, group_advantages, kl_k3, role_advantages, token_logprobs


def test_role_wise_baselines_average_segments_per_group_and_role():
    # group 0: run A (reward 1) has 2 act + 1 rehearse segments, run B (reward 0) has 1 act + 1 rehearse
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 0])
    roles = torch.tensor([0, 0, 1, 0, 1])
    adv = role_advantages(rewards, groups, roles)
    # act baseline = (1 + 1 + 0) / 3 = 2/3 (segments, not runs); rehearse baseline = (1 + 0) / 2
    assert torch.allclose(adv, torch.tensor([1 / 3, 1 / 3, 0.5, -2 / 3, -0.5]))


def test_groups_are_independent_and_scaling_options_divide_by_std():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 1, 1])
    roles = torch.zeros(4, dtype=torch.long)
    assert torch.allclose(role_advantages(rewards, groups, roles), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    scaled = role_advantages(rewards, groups, roles, scale="group")
    std = math.sqrt(0.5)  # Bessel std of [1, 0]
    assert torch.allclose(scaled, torch.tensor([0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 0.0, 0.0]))
    batch = role_advantages(rewards, groups, roles, scale="batch")
    assert torch.allclose(batch, torch.tensor([0.5, -0.5, 0.0, 0.0]) / (rewards.std() + 1e-4))


def test_token_logprobs_and_k3():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # p = [0.25, 0.75]
    assert torch.allclose(token_logprobs(logits, torch.tensor([[1]])), torch.tensor([[math.log(0.75)]]))
    assert torch.allclose(token_logprobs(logits, torch.tensor([[1]]), temperature=2.0),
                          torch.log_softmax(logits / 2, -1)[..., 1])
    assert float(kl_k3(torch.tensor(-1.0), torch.tensor(-1.0))) == 0.0
    assert float(kl_k3(torch.tensor(-1.0), torch.tensor(-2.0))) == pytest.approx(math.exp(-1) + 1 - 1)


def test_the_clipped_surrogate_on_hand_computed_numbers():
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.75, 0.25]]))  # ratios 1.5 and 0.5
    mask = torch.tensor([[1.0, 1.0]])
    loss, metrics = grpo_loss(new, old, torch.tensor([1.0]), mask)
    # A > 0: token 1 min(1.5, 1.2) = 1.2; token 2 min(0.5, 0.8) = 0.5 → −(1.2 + 0.5) / 2
    assert float(loss) == pytest.approx(-0.85)
    assert metrics["clip_high"] == pytest.approx(0.5) and metrics["clip_low"] == 0.0
    loss, metrics = grpo_loss(new, old, torch.tensor([-1.0]), mask)
    # A < 0: −min(−1.5, −1.2) = 1.5; −min(−0.5, −0.8) = 0.8 → (1.5 + 0.8) / 2
    assert float(loss) == pytest.approx(1.15) and metrics["clip_low"] == pytest.approx(0.5)
    loss, _ = grpo_loss(new, old, torch.tensor([1.0]), mask, epsilon_high=0.28)
    assert float(loss) == pytest.approx(-(1.28 + 0.5) / 2)


def test_masked_tokens_carry_no_loss_and_no_gradient():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([1.0]), torch.tensor([[1.0, 0.0, 1.0]]))
    loss.backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 0] != 0


# ---- TRL 1.16 GRPOTrainer._compute_loss / advantage code, transcribed term for term --------------

def trl_loss(per_token_logps, old_per_token_logps, advantages, completion_mask, loss_type, *, epsilon_low=0.2,
             epsilon_high=0.2, beta=0.0, ref_per_token_logps=None, max_completion_length=None, num_items_in_batch=None):
    log_ratio = per_token_logps - old_per_token_logps
    coef_1 = torch.exp(log_ratio)
    if beta != 0.0:
        per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss1 = coef_1 * advantages.unsqueeze(1)
    per_token_loss2 = coef_2 * advantages.unsqueeze(1)
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    mask = completion_mask
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type == "dapo":
        return (per_token_loss * mask).sum() / torch.tensor(num_items_in_batch).clamp(min=1.0)
    raise ValueError(loss_type)


def trl_advantages(rewards, num_generations, scale_rewards):
    mean_grouped = rewards.view(-1, num_generations).mean(dim=1).repeat_interleave(num_generations, dim=0)
    if scale_rewards == "group":
        std = rewards.view(-1, num_generations).std(dim=1).repeat_interleave(num_generations, dim=0)
    else:
        std = rewards.std().expand_as(rewards)
    advantages = rewards - mean_grouped
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return advantages


@pytest.mark.parametrize(("ours", "theirs"), [("token_mean", "bnpo"), ("sequence_mean", "grpo"),
                                              ("dr_grpo", "dr_grpo"), ("dapo", "dapo")])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_every_loss_type_equals_trls_formula(ours, theirs, beta):
    gen = torch.Generator().manual_seed(0)
    B, T = 6, 9
    logp = -torch.rand(B, T, generator=gen) * 3
    old = logp + (torch.rand(B, T, generator=gen) - 0.5) * 0.8
    ref = logp + (torch.rand(B, T, generator=gen) - 0.5) * 0.4
    mask = (torch.rand(B, T, generator=gen) > 0.3).float()
    mask[2] = 0  # a row with no generated tokens
    adv = torch.randn(B, generator=gen)
    kwargs = dict(max_completion_length=T, num_items_in_batch=float(mask.sum() + 5))
    mine, _ = grpo_loss(logp, old, adv, mask, epsilon=0.2, epsilon_high=0.28, beta=beta, ref_logp=ref,
                        loss_type=ours, **kwargs)
    reference = trl_loss(logp, old, adv, mask, theirs, epsilon_high=0.28, beta=beta, ref_per_token_logps=ref, **kwargs)
    assert torch.allclose(mine, reference, atol=1e-7)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_trajectory_level_advantages_equal_trls(scale):
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25, 0.0, 0.0, 1.0, 1.0])
    assert torch.allclose(group_advantages(rewards, 4, scale=scale), trl_advantages(rewards, 4, scale))


def test_truncated_importance_sampling_weights_each_token_by_the_capped_engine_ratio():
    """Rollouts sampled by another engine (`tis_cap`): the surrogate's ratio is against our own detached
    logprobs and each token is weighted by min(π_ours / π_engine, cap); hand-computed, with its metrics."""
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)  # [1, 3]
    engine = torch.tensor([[-1.0, -2.0 - math.log(3.0), -0.5 + math.log(2.0)]])  # ratios 1, 3 (capped to 2), 0.5
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    adv = torch.tensor([0.8])
    loss, metrics = grpo_loss(logp, engine, adv, mask, tis_cap=2.0)
    assert loss.item() == pytest.approx(-(0.8 * 1 + 0.8 * 2 + 0.8 * 0.5) / 3)
    (grad,) = torch.autograd.grad(loss, logp)  # d/dlogp of -A·w·exp(logp - sg(logp)) = -A·w
    assert torch.allclose(grad, torch.tensor([[-0.8 * 1, -0.8 * 2, -0.8 * 0.5]]) / 3)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["tis_truncated"] == pytest.approx(1 / 3)
    assert metrics["mismatch_abs"] == pytest.approx((math.log(3.0) + math.log(2.0)) / 3)
    k3 = lambda d: math.exp(-d) + d - 1  # noqa: E731 - d = log(π_engine / π_ours)
    assert metrics["mismatch_kl"] == pytest.approx((k3(-math.log(3.0)) + k3(math.log(2.0))) / 3)
    same, plain = grpo_loss(logp, logp.detach(), adv, mask, tis_cap=2.0)[0], grpo_loss(logp, logp.detach(), adv, mask)[0]
    assert same.item() == pytest.approx(plain.item())  # no mismatch: plain GRPO

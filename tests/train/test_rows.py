"""Trace fixtures → rows → one real GRPO update on the tiny Qwen3 that recorded them."""

from pathlib import Path

import pytest
import torch

from envace_mcp.traces import TraceStore
from envace_mcp.train import batch_logprobs, collate, grpo_loss, role_advantages, segments
from envace_mcp.train.rows import ROLE_INDEX

FIXTURES = Path(__file__).parent.parent / "fixtures" / "traces"


def test_segments_carry_tokens_rewards_groups_and_roles():
    rows = segments(TraceStore(FIXTURES).read())
    assert {r.role for r in rows} == {"act", "rehearse"}
    assert {r.group_id for r in rows} == {"fixture-group"}
    assert {r.reward for r in rows} == {0.0, 1.0}
    assert all(len(r.old_logprobs) == len(r.completion_ids) for r in rows)


def test_collate_masks_everything_but_completion_tokens():
    rows = segments(TraceStore(FIXTURES).read())[:3]
    batch = collate(rows, pad_id=0)
    for i, row in enumerate(rows):
        assert int(batch.completion_mask[i].sum()) == len(row.completion_ids)
        positions = batch.completion_mask[i].nonzero().squeeze(-1)
        assert batch.targets[i, positions].tolist() == row.completion_ids
        assert torch.allclose(batch.old_logprobs[i, positions], torch.tensor(row.old_logprobs))


def test_a_grpo_step_from_recorded_traces_starts_on_policy_and_moves_the_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    from envace_mcp.testing import build_tiny_qwen3

    model = AutoModelForCausalLM.from_pretrained(build_tiny_qwen3(tmp_path / "m"))  # same seed as the fixtures
    rows = segments(TraceStore(FIXTURES).read())
    batch = collate(rows, pad_id=0)
    rewards = torch.tensor([r.reward for r in rows])
    groups = torch.zeros(len(rows), dtype=torch.long)
    roles = torch.tensor([ROLE_INDEX[r.role] for r in rows])
    advantages = role_advantages(rewards, groups, roles)
    assert advantages.abs().sum() > 0
    model.train()
    logp = batch_logprobs(model, batch)
    loss, metrics = grpo_loss(logp, batch.old_logprobs, advantages, batch.completion_mask)
    # the fixtures were recorded by this very model: the first ratio is 1 (the trace contract holds)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and metrics["clip_low"] == metrics["clip_high"] == 0
    before = [p.detach().clone() for p in model.parameters()]
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))

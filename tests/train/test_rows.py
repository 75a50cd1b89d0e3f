"""Trace fixtures → rows → one real GRPO update on the tiny Qwen3 that recorded them."""

import subprocess
import sys
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
    packed = batch.input_ids[0]
    assert len(packed) == sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)  # no padding at all
    for i, row in enumerate(rows):
        k = len(row.completion_ids)
        assert int(batch.completion_mask[i].sum()) == k
        assert batch.targets[i, :k].tolist() == row.completion_ids
        assert packed[batch.positions[i, :k] + 1].tolist() == row.completion_ids  # position t predicts token t+1
        assert torch.allclose(batch.old_logprobs[i, :k], torch.tensor(row.old_logprobs))
    # each row sees only itself: its first token attends to nothing before it
    first_of_second = len(rows[0].prompt_ids) + len(rows[0].completion_ids)
    assert batch.attention_mask[0, 0, first_of_second].sum() == 1


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


@pytest.mark.parametrize("lora,parts", [(False, False), (True, False), (False, True), (True, True)])
def test_a_shared_prefix_batch_gives_the_same_logprobs_and_gradients(tmp_path, lora, parts):
    """The prefix runs once for every row: same numbers, less work — through transformers' `sdpa` with
    a block mask, and (`parts`) through our attention, which attends prefix and rows part by part."""
    from transformers import AutoModelForCausalLM

    from envace_mcp.testing import build_tiny_qwen3
    from envace_mcp.train.rows import _takes_packed_rows, prefix_order, prepare_for_training, shared_prefix_length

    model = AutoModelForCausalLM.from_pretrained(build_tiny_qwen3(tmp_path / "m"))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    if parts:
        prepare_for_training(model, gradient_checkpointing=True)  # switches the attention; recomputes in backward
    assert _takes_packed_rows(model) == parts
    all_rows = segments(TraceStore(FIXTURES).read())
    acts = [all_rows[i] for i in prefix_order(all_rows) if all_rows[i].role == "act"]
    assert shared_prefix_length(acts) > 0.5 * min(len(r.prompt_ids) for r in acts)  # system + tools + task
    params = [p for p in model.parameters() if p.requires_grad]
    results = []
    for share in (False, True):
        batch = collate(acts, pad_id=0, share_prefix=share)
        assert (batch.prefix_len > 0) == share
        logp = batch_logprobs(model, batch)
        mask = batch.completion_mask.bool()
        loss = -(logp * batch.completion_mask).sum()
        grads = torch.autograd.grad(loss, params)
        results.append((logp[mask], batch.old_logprobs[mask], grads, batch.input_ids.numel()))
    (plain, old_plain, g_plain, n_plain), (shared, old_shared, g_shared, n_shared) = results
    assert n_shared < 0.5 * n_plain  # the rows carry only what follows the prefix
    assert torch.equal(old_plain, old_shared)
    assert torch.allclose(plain, shared, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(g_plain, g_shared))
    with torch.no_grad():  # and both equal each row run alone, unpacked (plain causal attention)
        alone = torch.cat([batch_logprobs(model, collate([row]))[0, :len(row.completion_ids)] for row in acts])
    assert torch.allclose(alone, plain, atol=1e-5)


def test_rows_packed_without_a_prefix_attend_only_to_themselves(tmp_path):
    """Several rows in one sequence, nothing shared: our part-by-part attention (plain causal per row)
    gives each row what it gets alone, gradients included."""
    from transformers import AutoModelForCausalLM

    from envace_mcp.testing import build_tiny_qwen3
    from envace_mcp.train.rows import prepare_for_training

    model = AutoModelForCausalLM.from_pretrained(build_tiny_qwen3(tmp_path / "m"))
    prepare_for_training(model, gradient_checkpointing=False)
    rows = segments(TraceStore(FIXTURES).read())[:4]
    batch = collate(rows)
    assert batch.spans is not None and batch.prefix_len == 0
    params = list(model.parameters())
    packed = batch_logprobs(model, batch)
    grads = torch.autograd.grad(-(packed * batch.completion_mask).sum(), params)
    alone, alone_grads = [], [torch.zeros_like(p) for p in params]
    for row in rows:
        one = collate([row])
        assert one.spans is None and one.attention_mask is None
        logp = batch_logprobs(model, one)
        alone.append(logp[0])
        for total, g in zip(alone_grads, torch.autograd.grad(-logp.sum(), params)):
            total += g
    for i, row in enumerate(rows):
        k = len(row.completion_ids)
        assert torch.allclose(packed[i, :k], alone[i][:k], atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(grads, alone_grads))


_HEAP_PATTERN = """
import os, sys, torch
from envace_mcp.train.heap import cap_heap_blocks
print(cap_heap_blocks(1.0 if sys.argv[1] == "cap" else None))
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
big = torch.ones(20 * 2**20 // 4); del big  # a freed 20 MB mmapped block: glibc's threshold rises to it
base = rss()
kept, freed = [], []
for _ in range(40):  # activations of a pass: 10 MB blocks, with small tensors that outlive them above
    freed.append(torch.ones(10 * 2**20 // 4))
    kept.append(torch.ones(50_000))
del freed
print((rss() - base) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_capping_heap_blocks_hands_freed_activations_back_to_the_os():
    out = {}
    for mode in ("default", "cap"):  # a fresh process each: the setting is process-wide
        lines = subprocess.run([sys.executable, "-c", _HEAP_PATTERN, mode], capture_output=True, text=True,
                               check=True).stdout.split()
        out[mode] = (lines[0] == "True", float(lines[1]))
    assert out["default"][0] is False and out["cap"][0] is True
    assert out["default"][1] > 300  # glibc kept the 400 MB of freed 10 MB blocks
    assert out["cap"][1] < 50  # each had its own mmap, returned when freed


def _trajectory_rows():
    """The fixtures' act and rehearse rows, plus a turn whose prompt repeats the first row's prompt and
    completion (how a trajectory's next turn extends the last one): it must nest, not be re-read."""
    from dataclasses import replace

    rows = segments(TraceStore(FIXTURES).read())
    first, second = rows[0], rows[1]
    later = replace(first, prompt_ids=first.prompt_ids + first.completion_ids + second.prompt_ids[:40],
                    completion_ids=second.completion_ids[:20], old_logprobs=second.old_logprobs[:20])
    return rows + [later]


@pytest.mark.parametrize("lora,parts", [(False, True), (True, True), (False, False)])
def test_a_prefix_tree_pass_equals_every_row_alone_for_both_roles(tmp_path, lora, parts):
    """One forward/backward over a tree of a group's rows (turns nested in the turns that repeat them,
    branches sharing the tokens up to where they differ): each row's logprobs and the summed gradients
    equal those of every row run alone, act and rehearse rows alike — through our part-by-part
    attention and through a block mask."""
    from transformers import AutoModelForCausalLM

    from envace_mcp.testing import build_tiny_qwen3
    from envace_mcp.train.rows import prepare_for_training

    model = AutoModelForCausalLM.from_pretrained(build_tiny_qwen3(tmp_path / "m"))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    if parts:
        prepare_for_training(model, gradient_checkpointing=True)
    rows = _trajectory_rows()
    assert {r.role for r in rows} == {"act", "rehearse"}
    batch = collate(rows, share_prefix=True)
    unshared = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    assert batch.input_ids.numel() < 0.3 * unshared
    assert len(batch.spans) < len(rows)  # the extending turn has no tokens of its own
    assert any(batch.contexts)  # some part branches off another
    _assert_packed_equals_alone(model, rows, batch)


def _assert_packed_equals_alone(model, rows, batch):
    params = [p for p in model.parameters() if p.requires_grad]
    logp = batch_logprobs(model, batch)
    weights = torch.linspace(0.5, 1.5, len(rows))[:, None]  # per-row "advantages": the rows must not mix
    grads = torch.autograd.grad(-(logp * batch.completion_mask * weights).sum(), params)
    alone_grads = [torch.zeros_like(p) for p in params]
    for i, row in enumerate(rows):
        one = batch_logprobs(model, collate([row]))[0]
        k = len(row.completion_ids)
        assert torch.allclose(logp[i, :k], one[:k], atol=1e-5), row.role
        for total, g in zip(alone_grads, torch.autograd.grad(-one[:k].sum() * weights[i, 0], params)):
            total += g
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(grads, alone_grads))


def test_short_branches_off_long_contexts_read_only_their_own_queries_and_equal_rows_alone(tmp_path, monkeypatch):
    """A part with more context than tokens of its own (an inline rehearsal off a long trajectory) is
    attended as its own queries over context + own keys, causal aligned bottom-right, in query blocks
    (here 5 queries, so blocks split mid-part): logprobs and gradients still equal every row alone."""
    from transformers import AutoModelForCausalLM

    from envace_mcp.engine.attention import PackedRows
    from envace_mcp.testing import build_tiny_qwen3
    from envace_mcp.train.rows import prepare_for_training

    model = AutoModelForCausalLM.from_pretrained(build_tiny_qwen3(tmp_path / "m"))
    prepare_for_training(model, gradient_checkpointing=True)
    calls = []
    branch = PackedRows._branch.__func__

    def spy(cls, module, query, key, value, seen, *args, **kwargs):
        calls.append((query.shape[2], seen))
        return branch(cls, module, query, key, value, seen, *args, **kwargs)

    monkeypatch.setattr(PackedRows, "BRANCH_QUERIES", 5)
    monkeypatch.setattr(PackedRows, "_branch", classmethod(spy))
    rows = _trajectory_rows()
    batch = collate(rows, share_prefix=True)
    _assert_packed_equals_alone(model, rows, batch)
    assert calls and all(own < seen for own, seen in calls)
    assert any(own > 5 for own, _ in calls)  # at least one part took several query blocks


def test_micro_batches_count_a_trajectory_once_and_keep_to_their_token_budget():
    from envace_mcp.train.rows import micro_batches

    rows = _trajectory_rows()
    ordered = [rows[i] for i in prefix_order_of(rows)]
    longest = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    assert micro_batches(ordered, 0, None) == [list(range(len(rows)))]
    assert micro_batches(ordered, 3, None) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]][: (len(rows) + 2) // 3]
    def packed(p):
        return collate([ordered[i] for i in p], share_prefix=True).input_ids.numel()

    for budget in (longest - 50, longest, 2 * longest, 4 * longest):  # the first: the longest rows fit no pass
        passes = micro_batches(ordered, 0, budget)
        assert sorted(i for p in passes for i in p) == list(range(len(rows)))
        too_long = [[i] for i, r in enumerate(ordered) if len(r.prompt_ids) + len(r.completion_ids) > budget]
        assert [p for p in passes if packed(p) > budget] == too_long, budget  # each alone; every other pass fits
    assert len(micro_batches(ordered, 0, 4 * longest)) == 1 < len(micro_batches(ordered, 0, longest))
    assert len(micro_batches(ordered, 0, 1)) == len(rows)  # every row alone when nothing fits


def prefix_order_of(rows):
    from envace_mcp.train.rows import prefix_order

    return prefix_order(rows)


def test_checkpointing_recomputes_the_layers_but_not_their_attention(tmp_path):
    """Under gradient checkpointing the backward pass recomputes each decoder layer, except the
    attention kernel, whose outputs were kept: on a prefix-tree pass the kernel runs once per part and
    layer (not twice), and the gradients equal those of a pass that recomputes nothing."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import AutoModelForCausalLM

    from envace_mcp.testing import build_tiny_qwen3
    from envace_mcp.train.rows import prepare_for_training

    class Calls(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.flash = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.flash += func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
            return func(*args, **(kwargs or {}))

    rows = _trajectory_rows()
    batch = collate(rows, share_prefix=True)
    folder = build_tiny_qwen3(tmp_path / "m")
    results = []
    for checkpointing in (True, False):
        model = AutoModelForCausalLM.from_pretrained(folder)
        prepare_for_training(model, gradient_checkpointing=checkpointing)
        model.train()
        with torch.no_grad(), Calls() as forward_only:
            batch_logprobs(model, batch)
        with Calls() as calls:
            logp = batch_logprobs(model, batch)
            grads = torch.autograd.grad(-(logp * batch.completion_mask).sum(), list(model.parameters()))
        assert forward_only.flash > 0 and calls.flash == forward_only.flash
        results.append(grads)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*results))

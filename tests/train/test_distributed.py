"""The GRPO trainer under torchrun: 2 CPU processes (gloo) make the same update as one process on
the same global batch, and the ranks stay identical."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from envace_mcp.traces import TraceStore

FIXTURES = Path(__file__).parent.parent / "fixtures" / "traces"
WORKER = Path(__file__).parent / "ddp_worker.py"
CONFIGS = [{}, {"loss_type": "sequence_mean", "scale_rewards": "batch", "advantage": "trajectory",
            "performance": {"share_prefix": False}},
           {"groups_per_step": 1}]  # rank 1 gets no group: it must still join the all-reduce


def two_groups(folder: Path) -> Path:
    """The fixture group twice: as recorded (rewards 1, 1, 0, 0), and with other rewards."""
    store = TraceStore(folder)
    traces = list(TraceStore(FIXTURES).read())
    for name, values in (("g1", [t.reward("task").value for t in traces]), ("g2", [0.0, 1.0, 0.5, 0.0])):
        for trace, value in zip(traces, values):
            copy = trace.model_copy(deep=True)
            copy.run_id, copy.group_id = f"{trace.run_id}-{name}", name
            copy.rewards = [r.model_copy(update={"value": value}) for r in copy.rewards]
            store.append(copy)
    return folder


def test_two_processes_make_the_single_process_update(tmp_path):
    from envace_mcp.testing import build_tiny_qwen3

    model = build_tiny_qwen3(tmp_path / "model")
    traces = two_groups(tmp_path / "traces")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("WORLD_SIZE", None)
    args = [str(WORKER), str(model), str(traces), str(tmp_path / "out"), json.dumps(CONFIGS)]
    single = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          *args], env=env, capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    for index in range(len(CONFIGS)):
        one, rank0, rank1 = (torch.load(tmp_path / "out" / f"{tag}-{index}.pt") for tag in ("single", "rank0", "rank1"))
        # the ranks stay in sync: same all-reduced gradients, same parameters
        assert all(torch.equal(rank0["params"][n], rank1["params"][n]) for n in rank0["params"])
        assert all(torch.equal(rank0["grads"][n], rank1["grads"][n]) for n in rank0["grads"])
        # and the all-reduced (clipped) gradient is the single-process one, up to float summation order
        g_one = torch.cat([g.flatten() for g in one["grads"].values()])
        g_ddp = torch.cat([g.flatten() for g in rank0["grads"].values()])
        assert g_one.abs().max() > 1e-4  # the step had something to learn
        assert torch.allclose(g_one, g_ddp, atol=1e-6 * float(g_one.abs().max()), rtol=1e-4), \
            f"config {CONFIGS[index]}: max gradient gap {float((g_one - g_ddp).abs().max())}"
        # Adam turns tiny float noise in near-zero gradients into visible steps, so parameters are
        # compared where the gradient is clearly non-zero
        p_one = torch.cat([p.flatten() for p in one["params"].values()])
        p_ddp = torch.cat([p.flatten() for p in rank0["params"].values()])
        clear = g_one.abs() > 1e-3 * float(g_one.abs().max())
        assert torch.allclose(p_one[clear], p_ddp[clear], atol=1e-6)
        metrics = [json.loads(line) for tag in ("single", "rank0")
                   for line in (tmp_path / "out" / f"{tag}-{index}" / "metrics.jsonl").read_text().splitlines()]
        assert metrics[0]["segments"] == metrics[1]["segments"] == 8 * CONFIGS[index].get("groups_per_step", 2)
        assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], abs=1e-5)
    assert not (tmp_path / "out" / "rank1-0" / "metrics.jsonl").exists()  # rank 0 alone writes

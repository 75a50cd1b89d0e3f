"""Loading a policy from Python prints nothing of the libraries' own: no weight-loading bar, no
deprecation warning about transformers' renamed API (the CLI hid them; Python users saw both)."""

import os
import subprocess
import sys

from helpers import random_lora

SCRIPT = """
import sys
from envace_mcp.policy import load_policy
load_policy(sys.argv[1], adapter=sys.argv[2])
from envace_mcp.train.config import GRPOConfig
from envace_mcp.train.learner import GRPOLearner
GRPOLearner(GRPOConfig(model=sys.argv[1]))
print("loaded")
"""


def test_loading_a_policy_and_a_learner_from_python_prints_no_library_noise(tiny_qwen3_dir, tmp_path):
    adapter = random_lora(tiny_qwen3_dir, tmp_path / "adapter", 0)
    out = subprocess.run([sys.executable, "-W", "default", "-c", SCRIPT, str(tiny_qwen3_dir), str(adapter)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "loaded"
    assert "Loading weights" not in out.stderr and "is_gradient_checkpointing" not in out.stderr, out.stderr

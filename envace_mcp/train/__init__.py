"""Training: traces → rows, EnvACE role-wise GRPO math, SFT / GRPO trainers."""

from envace_mcp.train.grpo import grpo_loss, group_advantages, kl_k3, role_advantages, token_logprobs
from envace_mcp.train.rows import Batch, Segment, batch_logprobs, collate, segments

__all__ = ["role_advantages", "group_advantages", "grpo_loss", "kl_k3", "token_logprobs",
           "Segment", "segments", "Batch", "collate", "batch_logprobs"]

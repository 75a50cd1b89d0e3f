"""Teach the world model your tools: fit the rehearse role to a user's recorded calls, measure it tool by
tool on runs it never saw, and give the gate a trust table of what it earned (docs/training.md)."""

from envace_mcp.worldmodel.calls import Observed, observed_calls, split_episodes
from envace_mcp.worldmodel.fit import fit, measure, read_calls, split, write_report

__all__ = ["Observed", "observed_calls", "split_episodes", "fit", "measure", "read_calls", "split", "write_report"]

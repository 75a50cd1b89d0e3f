"""Evaluation: suite registry and task episodes (metrics and reports arrive with [F])."""

from envace_mcp.eval.suites import Episode, Suite, get_suite, run_reference, suites

__all__ = ["Suite", "Episode", "suites", "get_suite", "run_reference"]

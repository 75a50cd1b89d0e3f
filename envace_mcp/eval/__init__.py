"""Evaluation: suites (bundled, τ², BFCL), episodes, runs, metrics and reports (`envace eval`)."""

from envace_mcp.eval.registry import external_suites, get_suite, suites
from envace_mcp.eval.suites import Episode, Suite, TaskSuite, run_reference

__all__ = ["Suite", "TaskSuite", "Episode", "external_suites", "suites", "get_suite", "run_reference", "run_task", "TaskRun"]


def __getattr__(name: str):  # noqa: ANN202 - the runner imports the graph; load it only when asked
    if name in ("run_task", "TaskRun"):
        from envace_mcp.eval import runner

        return getattr(runner, name)
    raise AttributeError(name)

"""Evaluation: metrics, reports and comparisons over runs of a suite (`envace eval`).

The suites, episodes and `run_task` live in `envace_mcp.envs`; the names below are re-exported from there
for code written against this package."""

from envace_mcp.envs import Episode, Suite, TaskSuite, external_suites, get_suite, run_reference, suites

__all__ = ["Suite", "TaskSuite", "Episode", "external_suites", "suites", "get_suite", "run_reference", "run_task", "TaskRun"]


def __getattr__(name: str):  # noqa: ANN202 - the runner imports the graph; load it only when asked
    if name in ("run_task", "TaskRun"):
        from envace_mcp.envs import runner

        return getattr(runner, name)
    raise AttributeError(name)

"""The environment: tasks and their checks, suites, episodes, and running a task on the `Policy` and
tool-backend protocols (`run_task`). The bundled domains, τ², BFCL and your own suites plug in here."""

from envace_mcp.envs.episode import EPISODE_KEY, STATE_URI, TASK_KEY, Episode, EpisodeToolbox, TaskEpisode
from envace_mcp.envs.registry import external_suites, get_suite, suites
from envace_mcp.envs.rewards import call_f1
from envace_mcp.envs.suites import (
    Suite,
    TaskSuite,
    find_task,
    require_sandbox,
    run_reference,
    split_tasks,
    tasks_of_kinds,
)
from envace_mcp.envs.task import Action, Check, CheckResult, DomainError, Requirement, Task, check_task, replay

_LAZY = {"run_task": "runner", "TaskRun": "runner", "reference_roles": "reference", "calls_made": "reference"}


def __getattr__(name: str):  # noqa: ANN202 - running a task loads the graph (langgraph): only when asked
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"envace_mcp.envs.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'envace_mcp.envs' has no attribute {name!r}")


__all__ = [
    # tasks and their checks
    "Task", "Action", "Requirement", "Check", "CheckResult", "DomainError", "replay", "check_task", "call_f1",
    # suites
    "TaskSuite", "Suite", "get_suite", "suites", "external_suites", "split_tasks", "tasks_of_kinds", "find_task",
    "require_sandbox",
    # episodes and runs (run_task, TaskRun, reference_roles, calls_made: loaded on first use)
    "Episode", "TaskEpisode", "EpisodeToolbox", "EPISODE_KEY", "TASK_KEY", "STATE_URI", "run_reference",
    "run_task", "TaskRun", "reference_roles", "calls_made",
]

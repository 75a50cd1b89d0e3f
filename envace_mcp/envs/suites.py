"""Task suites: what `run_task` and `envace eval` need from one (`TaskSuite`), the bundled domains'
suite (`Suite`), splits, and running a task's reference solution as one episode."""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType
from typing import Any, Literal, Protocol

from envace_mcp._sync import run_sync
from envace_mcp.envs.episode import Episode, EpisodeToolbox, TaskEpisode
from envace_mcp.envs.launch import free_port, module_args, wait_for_port
from envace_mcp.envs.task import Action, CheckResult, DomainError, Task, replay
from envace_mcp.errors import UserError
from envace_mcp.toolbox.validation import ArgumentValidator
from envace_mcp.traces.schema import STOPPED, Trace


VALIDATION_EVERY = 8
"""Every 8th train task of each kind is held out as `validation`: 24 of bank's 264, 30 of retail's 240."""


def split_tasks(tasks: Sequence[Task], split: str) -> list[Task]:
    """A suite's tasks of one split. Besides the suite's own `train` and `test`: `validation`, carved out
    of `train` (every `VALIDATION_EVERY`-th task of each kind, in the suite's order, so each kind is
    represented and the carve never changes), for choosing checkpoints, arms and hyperparameters without
    touching `test`; and `fit`, the rest of `train`, to train on when `validation` decides."""
    if split not in ("validation", "fit"):
        return [t for t in tasks if t.split == split]
    seen: dict[str, int] = {}
    out = []
    for task in tasks:
        if task.split == "train":
            seen[task.kind] = seen.get(task.kind, 0) + 1
            if (seen[task.kind] % VALIDATION_EVERY == 0) == (split == "validation"):
                out.append(task)
    return out


def tasks_of_kinds(tasks: list[Task], kinds: list[str] | None, split: str) -> list[Task]:
    """`tasks` of the given kinds (None: all), in their order; a kind the split does not have is an error."""
    if kinds is None:
        return tasks
    known = sorted({t.kind for t in tasks})
    unknown = sorted(set(kinds) - set(known))
    if unknown or not kinds:
        raise UserError(f"kinds {unknown or '[]'}: not among the {split!r} split's task kinds {known}")
    return [t for t in tasks if t.kind in kinds]


class TaskSuite(Protocol):
    """What `run_task` and `envace eval` need from a suite (bundled, τ², BFCL, or your own).

    - `name`, `tasks`, `split(name)`, `task(id)`, `instructions` (the agent's system instructions);
    - `transports` (the first is the default) and `servers(transport)`: a context manager yielding the
      `mcpServers` mapping for a `Toolbox` (empty when the suite has no server);
    - `episode(task)`: one run's handle, whose `scope(toolbox)` is the agent's view of the tools;
    - `async score(episode, toolbox, state) -> CheckResult` (`state` has `messages`, `final_answer`
      and, for multi-turn tasks, `turn_traces`);
    - `reference_result(task, done, name, arguments)`: a perfect world model, for reference runs;
    - optional: `score_replayed(task, trace)` (scoring a run without a server: simulated rollouts), `judge_required(task)`, `reference_act(task)`, `run_one(task, ...)` (suites that run
      one act turn without a graph, such as BFCL's AST categories).
    """

    name: str

    @property
    def tasks(self) -> Sequence[Task]: ...

    def split(self, split: str) -> list[Task]: ...

    def task(self, task_id: str) -> Task: ...

    @property
    def instructions(self) -> str: ...

    @property
    def transports(self) -> tuple[str, ...]: ...

    def servers(self, transport: str) -> AbstractContextManager[dict[str, Any]]: ...

    def episode(self, task: Task) -> TaskEpisode: ...

    async def score(self, episode: Any, toolbox: EpisodeToolbox, state: dict[str, Any]) -> CheckResult:
        """`episode` is one this suite's `episode()` made."""
        ...

    def reference_result(self, task: Task, done: Sequence[Action], name: str, arguments: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class Suite:
    """A domain: its server module, its task generator and its checker."""

    name: str
    seed: int = 0

    @cached_property
    def _tasks_module(self) -> ModuleType:
        return importlib.import_module(f"envace_mcp.servers.{self.name}_tasks")

    @cached_property
    def server_module(self) -> ModuleType:
        return importlib.import_module(f"envace_mcp.servers.{self.name}")

    @property
    def tasks(self) -> Sequence[Task]:
        return self._tasks_module.generate_suite(self.seed)

    def split(self, split: Literal["train", "test", "validation", "fit"]) -> list[Task]:
        return split_tasks(self.tasks, split)

    def task(self, task_id: str) -> Task:
        return find_task(self, task_id)

    def check(self, task: Task, final_state: dict[str, Any] | None, answer: str) -> CheckResult:
        return self._tasks_module.check(task, final_state, answer)

    @property
    def instructions(self) -> str:
        """The domain policy the agent is given as its system instructions."""
        return self.server_module.POLICY

    @property
    def transports(self) -> tuple[str, ...]:
        return ("inprocess", "stdio", "http")

    @contextmanager
    def servers(self, transport: str = "inprocess") -> Iterator[dict[str, Any]]:
        """The `mcpServers` mapping that serves this suite over `transport` (for `Toolbox`)."""
        if transport == "inprocess":
            yield {self.name: self.build_server()}
        elif transport == "stdio":
            yield {self.name: self.stdio_config()}
        elif transport == "http":
            with self.serve_http() as url:
                yield {self.name: {"url": url}}
        else:
            raise UserError(f"suite {self.name!r} is served over {', '.join(self.transports)}, not {transport!r}")

    def episode(self, task: Task) -> Episode:
        return Episode(task, self.name)

    async def score(self, episode: Episode, toolbox: EpisodeToolbox, state: dict[str, Any]) -> CheckResult:
        """The checker's verdict on an episode's final server state and the run's final answer."""
        return self.check(episode.task, await episode.final_state(toolbox), state.get("final_answer") or "")

    def score_replayed(self, task: Task, trace: Trace) -> CheckResult:
        """Score a run that had no server (simulated mode, EnvACE's training): its executed or simulated
        calls are applied with the domain's own functions to the task's initial state, then checked."""
        state = copy.deepcopy(task.initial_state)
        for step in trace.steps:
            if step.role != "tool" or step.decision not in ("simulate", "execute") or step.tool is None:
                continue
            if step.result is not None and step.result.get("is_error"):
                continue
            try:
                self.server_module.apply(state, step.tool, dict(step.arguments or {}))
            except (DomainError, KeyError, TypeError):
                continue
        return self.check(task, state, trace.final_answer or "")

    def destructive_calls(self, task: Task, trace: Trace) -> list[dict[str, Any]]:
        """Each state-changing call a real-mode run proposed, what the gate did with it, and what it would
        have done: the call is tried with the domain's own functions on a copy of the state the run had
        reached (its executed calls replayed on the task's initial state), never on a server.

        `would`: "fail" (the server would refuse it: arguments its tool's schema rejects, an error, a policy
        the server enforces), "unrequested" (it would run, but it is none of the task's reference writes
        still to do: a policy violation the server lets through, a duplicate, a wrong amount), or
        "requested" (one of them). A call is tried as the server runs it (`server_arguments`): arguments
        its tool does not declare are dropped, not held against it. Calls the gate simulated (simulated /
        mixed mode) are left out: nothing real was at stake."""
        state = copy.deepcopy(task.initial_state)
        todo = [(a.tool, dict(a.arguments)) for a in task.write_actions]
        out = []
        for step in trace.steps:
            if step.role != "tool" or step.tool is None or step.decision == "simulate":
                continue
            arguments = self.server_arguments(step.tool, step.arguments or {})
            executed = step.decision not in STOPPED
            trial = copy.deepcopy(state)
            try:
                if arguments is None:
                    raise DomainError("the tool's input schema refuses the arguments")
                self.server_module.apply(trial, step.tool, arguments)
                ran = True
            except (DomainError, KeyError, TypeError, ValueError, AttributeError):
                ran = False
            if step.tool in task.writes:
                requested = ran and (step.tool, arguments) in todo
                out.append({"tool": step.tool, "decision": step.decision or "execute", "stopped": not executed,
                            "would": "requested" if requested else "unrequested" if ran else "fail"})
                if requested and executed:
                    todo.remove((step.tool, arguments))
            if executed and ran and not (step.result or {}).get("is_error"):
                state = trial
        return out

    @cached_property
    def input_validators(self) -> dict[str, ArgumentValidator]:
        """Each tool's argument check, built once from the input schema this suite's server declares (what
        the toolbox validates calls against before the server sees them)."""
        tools = run_sync(self.build_server().list_tools())  # async, and callers may be inside an event loop
        return {t.name: ArgumentValidator(dict(t.input_schema or {})) for t in tools}

    def server_arguments(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        """`arguments` as the server's tool receives them: None where the toolbox refuses them against the
        tool's declared schema; otherwise without the ones the tool does not declare, which the server's
        argument model ignores (the call runs as if they were not there)."""
        validator = self.input_validators.get(tool)
        if validator is None:
            return dict(arguments)
        if validator.errors(arguments):
            return None
        declared = validator.schema.get("properties") or {}
        return {k: v for k, v in arguments.items() if k in declared}

    def reference_result(self, task: Task, done: Sequence[Action], name: str, arguments: dict[str, Any]) -> Any:
        """What the server returns for a call after the actions `done`: a perfect world model."""
        state = replay(task.initial_state, list(done), self.server_module.apply)
        try:
            return self.server_module.apply(state, name, dict(arguments))
        except DomainError as exc:
            return {"error_tool_call": {"code": "EXECUTION_ERROR", "message": str(exc)}}
        except (KeyError, TypeError) as exc:
            return {"error_tool_call": {"code": "INVALID_PARAMETERS", "details": str(exc)}}

    def build_server(self) -> Any:
        """A fresh in-process server object for this suite (tests, fast rollouts)."""
        return self.server_module.build_server(seed=self.seed)

    def stdio_config(self, python: str | None = None) -> dict[str, Any]:
        """An `mcpServers` entry that launches this suite's server over stdio."""
        return {"command": python or sys.executable,
                "args": module_args(f"envace_mcp.servers.{self.name}", "--seed", str(self.seed))}

    @contextmanager
    def serve_http(self, port: int = 0, *, startup_timeout: float = 30.0) -> Iterator[str]:
        """Run this suite's server over streamable HTTP on loopback in a subprocess; yield its URL."""
        port = port or free_port()
        proc = subprocess.Popen(
            [sys.executable, *module_args(f"envace_mcp.servers.{self.name}", "--transport", "http",
                                         "--port", str(port), "--seed", str(self.seed))],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            wait_for_port(port, proc, startup_timeout)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def require_sandbox(suite: TaskSuite) -> Suite:
    """`suite`, if calls can be tried on it freely: a bundled domain with its own in-process server and a
    perfect world model (`Suite.reference_result`), as probes need; a clear error otherwise (τ², BFCL)."""
    if not hasattr(suite, "reference_result") or not hasattr(suite, "server_module"):
        raise UserError(f"suite {suite.name!r} has no sandbox server to probe (bank and retail do)")
    return suite


def find_task(suite: TaskSuite, task_id: str) -> Task:
    """A suite's task by id, or a clear error naming a few that exist."""
    for task in suite.tasks:
        if task.id == task_id:
            return task
    some = ", ".join(t.id for t in list(suite.tasks)[:5])
    raise UserError(f"no task {task_id!r} in suite {suite.name!r} (ids look like: {some}, ...)")


async def run_reference(toolbox: EpisodeToolbox, suite: Suite, task: Task, *, server: str | None = None,
                        drop_last_write: bool = False, extra: Sequence[Action] = ()) -> tuple[Episode, CheckResult]:
    """Replay a task's reference actions through the toolbox as one episode, then check it.

    `drop_last_write` and `extra` (more actions) exist to show the checker catches incomplete or
    harmful runs.
    """
    episode = Episode(task, server or suite.name)
    actions = list(task.actions)
    if drop_last_write:
        writes = [i for i, a in enumerate(actions) if a.tool in task.writes]
        if writes:
            del actions[writes[-1]]
    scope = toolbox.scoped(episode.meta)
    for action in [*actions, *extra]:
        spec = toolbox.catalog.lookup(episode.server, action.tool)
        episode.results.append(await scope.call(spec.name if spec else action.tool, action.arguments))
    state = await episode.final_state(toolbox)
    return episode, suite.check(task, state, task.answer)

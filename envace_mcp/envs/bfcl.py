"""BFCL-v4 multi-turn categories (base, miss_func, miss_param, long_context) as suites.

    pip install 'envace-mcp[bfcl]'
    envace eval --suite bfcl-base --limit 20 --out runs/bfcl

The tasks and ground truth come from the `bfcl-eval` package; the agent reaches BFCL's stateful
backends through our MCP bridge (`envace_mcp.servers.bfcl`), one episode per run. Each task is a
conversation: the first user message is the instruction, later ones are sent each time the agent
answers (`Task.turns`). In `miss_func` tasks, functions held out until a turn are hidden from the
agent until then, and that turn's user message is BFCL's "I have updated some more functions ...".

Scoring is bfcl-eval's own multi-turn checker: the calls the agent made, grouped per turn and per
model step, are re-executed on fresh backends beside the ground truth, and after every turn the
backends' states and the calls' outputs must match. Each run gets its own model id, so the checker's
instances (kept in module globals) never mix runs, and they are dropped after scoring.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import re
import sys
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from types import ModuleType
from typing import Any

from langchain_core.messages import HumanMessage

from envace_mcp.envs.episode import EPISODE_KEY, TASK_KEY, EpisodeToolbox
from envace_mcp.envs.launch import module_args
from envace_mcp.envs.reference import calls_made
from envace_mcp.envs.suites import find_task
from envace_mcp.envs.task import Action, Check, CheckResult, Task
from envace_mcp.errors import UserError
from envace_mcp.policy.prompts import tool_call_text
from envace_mcp.policy.types import ActRequest
from envace_mcp.toolbox import ToolboxScope
from envace_mcp.traces.schema import Trace

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
NEW_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
"""What BFCL says at a turn that reveals held-out functions (its function-calling-mode wording)."""
BRIDGE = "envace_mcp.servers.bfcl"
"""Our MCP bridge to BFCL's backends, loaded by name only when a BFCL suite is used (it needs bfcl-eval)."""


def load_bridge() -> ModuleType:
    """The bundled bridge server's module (`envace_mcp.servers.bfcl`): BFCL's data, backends and schemas."""
    return importlib.import_module(BRIDGE)


class EvalOnlySuite:
    """What both BFCL suite kinds share: BFCL is an evaluation set (every task is a test task, none is
    for training), and the same system instructions."""

    category: str
    tasks: list[Task]

    @property
    def name(self) -> str:
        return f"bfcl-{self.category}"

    def split(self, split: str) -> list[Task]:
        return list(self.tasks) if split == "test" else []

    def task(self, task_id: str) -> Task:
        return find_task(self, task_id)

    @property
    def instructions(self) -> str:
        return load_bridge().INSTRUCTIONS


@dataclass(frozen=True)
class BfclSuite(EvalOnlySuite):
    """One BFCL multi-turn category."""

    category: str

    @property
    def transports(self) -> tuple[str, ...]:
        return ("inprocess", "stdio")

    @cached_property
    def bridge(self) -> ModuleType:
        module = load_bridge()
        module.data_dir()  # the install hint, early
        return module

    @cached_property
    def entries(self) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.bridge.entries().items() if k.startswith(f"multi_turn_{self.category}_")}

    @cached_property
    def ground_truth(self) -> dict[str, list[list[str]]]:
        path = self.bridge.data_dir() / "possible_answer" / f"BFCL_v4_multi_turn_{self.category}.json"
        return {e["id"]: e["ground_truth"] for e in self.bridge.read_jsonl(path)}

    @cached_property
    def tasks(self) -> list[Task]:
        return [to_task(entry, self.ground_truth[i]) for i, entry in self.entries.items()]

    def servers(self, transport: str = "inprocess") -> AbstractContextManager[dict[str, Any]]:
        if transport == "inprocess":
            return nullcontext({"bfcl": self.bridge.build_server()})
        if transport == "stdio":
            return nullcontext({"bfcl": {"command": sys.executable, "args": module_args(BRIDGE)}})
        raise UserError(f"suite {self.name!r} runs over {', '.join(self.transports)}, not {transport!r}")

    def episode(self, task: Task) -> BfclEpisode:
        entry = self.entries[task.id]
        owners = self.bridge.owner_of()
        involved = set(entry["involved_classes"])
        return BfclEpisode(task, "bfcl", uninvolved=[n for n, c in owners.items() if c not in involved],
                           held_out={int(k): list(v) for k, v in (entry.get("missed_function") or {}).items()})

    # ------------------------------------------------------------------ scoring

    def decoded(self, turn_traces: list[Trace]) -> list[list[list[str]]]:
        """The calls each turn's model steps made that reached a backend, as BFCL call strings."""
        out = []
        for trace in turn_traces:
            steps: list[list[str]] = []
            for step in trace.steps:
                if step.role == "act":
                    steps.append([])
                elif step.ran and step.tool and steps:
                    steps[-1].append(call_string(step.tool, step.arguments or {}))
            out.append([s for s in steps if s])
        return out

    def check_calls(self, task: Task, decoded: list[list[list[str]]]) -> CheckResult:
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

        truth = self.ground_truth[task.id]
        if len(decoded) != len(truth):
            return CheckResult(0.0, (Check("turns", False, f"the run covered {len(decoded)} of {len(truth)} turns"),))
        model = f"envace_{uuid.uuid4().hex}"
        try:
            verdict = multi_turn_checker(decoded, truth, copy.deepcopy(self.entries[task.id]),
                                         f"multi_turn_{self.category}", model)
        finally:
            prefix = re.sub(r"[-./:]", "_", model)
            for name in [n for n in vars(multi_turn_utils) if n.startswith(prefix)]:
                del vars(multi_turn_utils)[name]
        if verdict.get("valid"):
            return CheckResult(1.0, (Check("bfcl_multi_turn", True),))
        detail = f"{verdict.get('error_type', '')}: {verdict.get('error_message', '')}"[:500]
        return CheckResult(0.0, (Check("bfcl_multi_turn", False, detail),))

    async def score(self, episode: BfclEpisode, toolbox: EpisodeToolbox, state: dict[str, Any]) -> CheckResult:
        return self.check_calls(episode.task, self.decoded(state.get("turn_traces") or []))

    def reference_result(self, task: Task, done: Sequence[Action], name: str, arguments: dict[str, Any]) -> Any:
        """What the backends answer after the ground-truth calls `done`: fresh instances, replayed."""
        episodes = self.bridge.Episodes(capacity=1)
        made = episodes.instances("reference", task.id)
        owners = self.bridge.owner_of()

        def run(tool: str, args: dict[str, Any]) -> Any:
            cls = owners.get(tool)
            if cls not in made:
                raise KeyError(f"Tool '{tool}' is not available in this task")
            return getattr(made[cls], tool)(**args)

        for action in done:
            try:
                run(action.tool, dict(action.arguments))
            except Exception:  # noqa: BLE001 - the bridge reports these as errors and moves on
                pass
        try:
            text = self.bridge.render(run(name, dict(arguments)))
        except Exception as exc:  # noqa: BLE001
            return {"error_tool_call": {"code": "EXECUTION_ERROR", "message": f"Error during execution: {exc}"}}
        try:
            return json.loads(text)
        except ValueError:
            return text

    def reference_act(self, task: Task) -> Callable[[ActRequest], str]:
        """The ground truth's calls turn by turn (one call per model step), then a short answer."""
        per_turn = [[parse_call(c, self.bridge) for c in turn] for turn in self.ground_truth[task.id]]

        def act(request: ActRequest) -> str:
            # the first user message is the request's `task`; later ones are in the conversation
            users = [i for i, m in enumerate(request.messages) if isinstance(m, HumanMessage)]
            turn = len(users)
            since = request.messages[users[-1]:] if users else request.messages
            done = calls_made(since)
            calls = per_turn[turn] if 0 <= turn < len(per_turn) else []
            if done < len(calls):
                return tool_call_text(calls[done].tool, calls[done].arguments)
            return "Done."

        return act


@dataclass
class BfclEpisode:
    task: Task
    server: str
    uninvolved: list[str] = field(default_factory=list)
    held_out: dict[int, list[str]] = field(default_factory=dict)
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    turn: int = 0

    @property
    def meta(self) -> dict[str, str]:
        return {EPISODE_KEY: self.key, TASK_KEY: self.task.id}

    def scope(self, toolbox: EpisodeToolbox) -> ToolboxScope:
        """The task's classes' tools, without those still held out at this turn."""
        hidden = set(self.uninvolved)
        for turn, names in self.held_out.items():
            if self.turn < turn:
                hidden.update(names)
        return toolbox.scoped(self.meta, hide=hidden)


def to_task(entry: dict[str, Any], truth: list[list[str]]) -> Task:
    held = {int(k) for k in entry.get("missed_function") or {}}
    said = []
    for i, turn in enumerate(entry["question"]):
        text = "\n".join(str(m.get("content", "")) for m in turn if m.get("role") == "user").strip()
        said.append(text or (NEW_FUNCTIONS_PROMPT if i in held else ""))
    actions = tuple(parse_call(c, load_bridge()) for turn in truth for c in turn)
    return Task(id=entry["id"], domain="bfcl", split="test", kind=entry["id"].rsplit("_", 1)[0],
                instruction=said[0], turns=tuple(said[1:]), initial_state={}, actions=actions, answer="Done.")


def parse_call(text: str, bridge: ModuleType) -> Action:
    """`mv(source='a', destination='b')` (positional arguments named from the backend's signature)."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a BFCL call: {text!r}")
    name = node.func.id
    arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    if node.args:
        params = _parameters(name, bridge)
        for param, value in zip(params, node.args):
            arguments[param] = ast.literal_eval(value)
    return Action(name, arguments)


def _parameters(name: str, bridge: ModuleType) -> list[str]:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    cls = bridge.owner_of()[name]
    method = getattr(getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls]), cls), name)
    return [p for p in inspect.signature(method).parameters if p != "self"]


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """A call as the Python expression bfcl-eval's checker executes."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


BFCL_SUITES = {f"bfcl-{c}": c for c in CATEGORIES}

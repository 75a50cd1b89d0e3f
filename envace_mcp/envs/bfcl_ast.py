"""BFCL-v4 single-turn AST categories (simple, multiple, parallel, parallel_multiple, irrelevance) as suites:
one request, the functions it may call, no execution; the calls are scored by bfcl-eval's own AST checker."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage

from envace_mcp.envs.bfcl import EvalOnlySuite, load_bridge
from envace_mcp.envs.runner import TaskRun
from envace_mcp.envs.task import Action, Check, CheckResult, Task
from envace_mcp.errors import UserError
from envace_mcp.policy.base import Policy
from envace_mcp.policy.prompts import tool_call_text
from envace_mcp.policy.types import ActRequest, Role, SamplingParams
from envace_mcp.toolbox import ToolAnnotations, ToolSpec
from envace_mcp.traces import Reward, TraceRecorder, TraceStore

AST_CATEGORIES = {"simple": "simple_python", "multiple": "multiple", "parallel": "parallel",
                  "parallel_multiple": "parallel_multiple", "irrelevance": "irrelevance"}
CHECKER_MODEL = "envace-mcp"
"""The model id we register with bfcl-eval's checker (dotted function names kept as they are)."""


@dataclass(frozen=True)
class BfclAstSuite(EvalOnlySuite):
    """A BFCL single-turn category: one request, the functions it may call, no execution.

    The act role answers once, with the task's functions as its tools; its calls are scored by
    bfcl-eval's AST checker (`irrelevance`: valid when no function is called). Each run is recorded as
    a one-step trace. There is no server: these functions exist only as descriptions.
    """

    category: str

    @property
    def transports(self) -> tuple[str, ...]:
        return ("none",)

    @cached_property
    def _file(self) -> str:
        return f"BFCL_v4_{AST_CATEGORIES[self.category]}.json"

    @cached_property
    def entries(self) -> dict[str, dict[str, Any]]:
        bfcl = load_bridge()
        return {e["id"]: e for e in bfcl.read_jsonl(bfcl.data_dir() / self._file)}

    @cached_property
    def answers(self) -> dict[str, list[dict[str, Any]]]:
        bfcl = load_bridge()
        path = bfcl.data_dir() / "possible_answer" / self._file
        if not path.exists():  # irrelevance: the answer is "no call"
            return {}
        return {e["id"]: e["ground_truth"] for e in bfcl.read_jsonl(path)}

    @cached_property
    def tasks(self) -> list[Task]:
        out = []
        for task_id, entry in self.entries.items():
            request = "\n".join(m["content"] for turn in entry["question"] for m in turn if m.get("role") == "user")
            docs = {f["name"]: f for f in entry["function"]}
            calls = tuple(Action(name, reference_arguments(args, docs.get(name)))
                          for answer in self.answers.get(task_id, []) for name, args in answer.items())
            out.append(Task(id=task_id, domain="bfcl", split="test", kind=self.category, instruction=request,
                            initial_state={}, actions=calls, answer="I cannot do that with these functions."
                            if self.category == "irrelevance" else "Done."))
        return out

    def servers(self, transport: str = "none") -> AbstractContextManager[dict[str, Any]]:
        return nullcontext({})

    def tools(self, task: Task) -> list[ToolSpec]:
        json_schema = load_bridge().json_schema
        return [ToolSpec.create(remote_name=f["name"], server="bfcl", description=f.get("description", ""),
                                input_schema=json_schema(f.get("parameters") or {}), output_schema=None,
                                annotations=ToolAnnotations()) for f in self.entries[task.id]["function"]]

    def reference_act(self, task: Task) -> Callable[[ActRequest], str]:
        def act(request: ActRequest) -> str:
            if not task.actions:
                return task.answer
            return "\n".join(tool_call_text(a.tool, a.arguments) for a in task.actions)

        return act

    def reference_result(self, task: Task, done: Sequence[Action], name: str, arguments: dict[str, Any]) -> Any:
        raise UserError(f"{self.name} has no backend to simulate: its functions exist only as descriptions")

    def check_calls(self, task: Task, calls: list[dict[str, Any]]) -> CheckResult:
        """bfcl-eval's AST checker on `[{name: arguments}, ...]`."""
        if self.category == "irrelevance":
            ok = not calls
            return CheckResult(float(ok), (Check("no_call", ok, "" if ok else f"called {len(calls)} function(s)"),))
        if not calls:
            return CheckResult(0.0, (Check("ast", False, "no function call"),))
        ast_checker, language = _ast_checker()
        verdict = ast_checker(self.entries[task.id]["function"], calls, self.answers[task.id], language,
                              AST_CATEGORIES[self.category], CHECKER_MODEL)
        ok = bool(verdict.get("valid"))
        detail = "" if ok else f"{verdict.get('error_type', '')}: {'; '.join(map(str, verdict.get('error', [])))}"[:500]
        return CheckResult(float(ok), (Check("ast", ok, detail),))

    async def run_one(self, task: Task, *, policy: Policy, sampling: dict[Role, SamplingParams],
                      store: TraceStore | None = None, group_id: str | None = None) -> TaskRun:
        """One act turn with the task's functions; recorded as a trace, scored by the AST checker."""
        recorder = TraceRecorder(task_id=task.id, suite=self.name, group_id=group_id, task=task.instruction,
                                 model=getattr(policy, "name", None),
                                 sampling={k: v.model_dump(mode="json") for k, v in sampling.items()})
        try:
            generation = await policy.act(ActRequest(task=task.instruction, tools=self.tools(task),
                                                     instructions=self.instructions), sampling.get("act"))
        except BaseException as exc:
            trace = recorder.finish({}, status="failed", error=f"{type(exc).__name__}: {exc}")
            if store is not None:
                store.append(trace)
            raise
        recorder.observe("custom", {"envace": "generation", "generation": generation, "node": "agent"})
        parsed = generation.parsed
        calls = [{c.name: dict(c.arguments)} for c in parsed.tool_calls]
        message = AIMessage(content=parsed.content or "", tool_calls=[c.as_langchain() for c in parsed.tool_calls])
        recorder.observe("updates", {"agent": {"messages": [message]}})
        answer = None if calls else (parsed.content or generation.text)
        state = {"messages": [HumanMessage(content=task.instruction), message], "final_answer": answer}
        trace = recorder.finish(state, status="finished")
        verdict = self.check_calls(task, calls)
        trace.rewards.append(Reward(name="task", value=verdict.score, details=verdict.to_dict()))
        if store is not None:
            store.append(trace)
        return TaskRun(task=task, episode=None, state=state, verdict=verdict, attempts=[], trace=trace)


def reference_arguments(options: dict[str, list[Any]], doc: dict[str, Any] | None) -> dict[str, Any]:
    """One valid call from a BFCL possible answer: each parameter takes its first allowed value
    (nested dicts of allowed values unwrapped); optional ones ("" allowed) are left out unless the
    function's description requires them."""
    required = set(((doc or {}).get("parameters") or {}).get("required") or [])
    out = {}
    for name, allowed in options.items():
        allowed = allowed if isinstance(allowed, list) else [allowed]
        values = [v for v in allowed if v != ""]
        if not values or ("" in allowed and name not in required):
            continue
        out[name] = _unwrap(values[0])
    return out


def _unwrap(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unwrap(next((o for o in v if o != ""), v[0]) if isinstance(v, list) and v else v)
                for k, v in value.items() if not (isinstance(v, list) and v and all(o == "" for o in v))}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _ast_checker() -> tuple[Any, Any]:
    """bfcl-eval's AST checker with our model id registered.

    Its module imports bfcl-eval's model registry, which imports every vendor's client library (the
    dependencies a `--no-deps` install leaves out). The checker reads one flag from that registry, so
    when the registry cannot be imported a minimal stand-in holding only our entry takes its place."""
    import importlib
    import sys
    import types

    try:
        registry = importlib.import_module("bfcl_eval.constants.model_config")
    except ImportError:
        registry = types.ModuleType("bfcl_eval.constants.model_config")
        registry.MODEL_CONFIG_MAPPING = {}
        sys.modules["bfcl_eval.constants.model_config"] = registry
    registry.MODEL_CONFIG_MAPPING.setdefault(CHECKER_MODEL, types.SimpleNamespace(underscore_to_dot=False))
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker, Language.PYTHON


AST_SUITES = {f"bfcl-{c}": c for c in AST_CATEGORIES}

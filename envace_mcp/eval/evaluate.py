"""`envace eval`: run a suite's tasks (× repeats) through the EnvACE graph, record every run, measure.

    results = await evaluate(get_suite("bank"), tasks, policy, out=Path("runs/bank"), repeats=2)

Writes `out/results.json` (configuration, summary, one record per run), `out/results.md` and
`out/results.png`, and every run as a trace in `out/traces/`. A run that crashes is recorded as
failed (score 0) and the evaluation goes on.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

from envace_mcp.eval.metrics import run_record, summarize
from envace_mcp.graph import GateConfig


@dataclass
class EvalSettings:
    """One configuration of an evaluation (what `--compare` varies)."""

    suite: str
    split: str = "test"
    limit: int | None = None
    tasks: list[str] | None = None
    model: str | None = None
    adapter: str | None = None
    policy: str = "model"
    """`model` (a transformers model: `model` + `adapter`), `reference` (the tasks' reference
    solutions and a perfect world model: the adapter's ceiling, and how its scoring is tested) or
    `noop` (answers at once without calling anything: the floor a suite gives for doing nothing)."""
    mode: str = "real"
    rehearse: int = 0
    """Test-time rehearsal: imagined runs before the real one (EnvACE's N)."""
    strategy: str = "parallel"
    repeats: int = 1
    concurrency: int = 8
    """Runs in flight together; their generations share batches in the policy."""
    transport: str | None = None
    """`inprocess` (bundled suites' default), `stdio`, `http`; the τ² suites are stdio only."""
    gate: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 160
    rehearse_max_new_tokens: int | None = None
    """The rehearse role's own budget (`None`: `max_new_tokens`). A tool's reply can be far longer than a
    tool call: a retail order runs to ~360 tokens, and a rehearsal cut short parses as no prediction."""
    temperature: float = 0.0
    seed: int = 0

    def overridden(self, spec: str) -> EvalSettings:
        """A copy with `key=value,key=value` applied (`--compare rehearse=2`, `--compare adapter=DIR`)."""
        from envace_mcp.errors import UserError

        values = asdict(self)
        for item in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in values or key in ("suite", "split", "limit", "tasks", "gate"):
                raise UserError(f"--compare takes key=value pairs of: model, adapter, policy, mode, rehearse, "
                                f"strategy, repeats, max_new_tokens, rehearse_max_new_tokens, temperature, seed; "
                                f"got {item!r}")
            default = values[key]
            if key == "rehearse_max_new_tokens":
                values[key] = None if raw.strip().lower() in ("none", "") else int(raw)
            else:
                values[key] = (int(raw) if isinstance(default, int) and not isinstance(default, bool)
                               else float(raw) if isinstance(default, float)
                               else None if raw.lower() in ("none", "") and key in ("model", "adapter", "transport")
                               else raw)
            if key.endswith("max_new_tokens") and values[key] is not None and values[key] < 1:
                raise UserError(f"--compare: {key} must be at least 1, not {values[key]}")
        return EvalSettings(**values)

    def label(self) -> str:
        parts = [self.policy if self.policy != "model" else (self.model or "embedded")]
        if self.adapter:
            parts.append(f"adapter={Path(self.adapter).name}")
        parts += [f"mode={self.mode}", f"rehearse={self.rehearse}"]
        if self.rehearse_max_new_tokens is not None and self.rehearse_max_new_tokens != self.max_new_tokens:
            parts.append(f"rehearse_tokens={self.rehearse_max_new_tokens}")
        from envace_mcp.graph.gate import GateConfig

        default = asdict(GateConfig())  # two gates on one adapter are two configurations: name what differs
        changed = {k: v for k, v in sorted(self.gate.items()) if default.get(k) != v}
        if changed:
            parts.append("gate:" + ",".join(f"{k}={v}" for k, v in changed.items()))
        return " ".join(parts)


def select_tasks(suite: Any, settings: EvalSettings) -> list[Any]:
    tasks = [suite.task(t) for t in settings.tasks] if settings.tasks else suite.split(settings.split)
    return tasks[: settings.limit] if settings.limit else tasks


def make_policy(settings: EvalSettings, suite: Any, task: Any, base: Any) -> Any:
    """The policy for one run: the loaded model, or the task's reference solution."""
    if settings.policy == "reference":
        from envace_mcp.eval.reference import reference_roles
        from envace_mcp.policy.function import FunctionPolicy

        return FunctionPolicy(**reference_roles(suite, task))
    if settings.policy == "noop":
        from envace_mcp.policy.function import FunctionPolicy

        return FunctionPolicy(act=lambda request: "I cannot help with that.")
    return base


async def evaluate(suite: Any, tasks: Sequence[Any], settings: EvalSettings, *, out: Path, policy: Any = None,
                   on_run: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every task `settings.repeats` times; write results.json / .md / .png and traces under `out`."""
    from envace_mcp.eval.runner import run_task
    from envace_mcp.policy import SamplingParams
    from envace_mcp.policy.types import role_sampling
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.traces import TraceStore

    out.mkdir(parents=True, exist_ok=True)
    store = TraceStore(out / "traces")
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature, seed=settings.seed)
    sampling = role_sampling(params, settings.rehearse_max_new_tokens)
    gate = GateConfig(**settings.gate)
    judge = getattr(suite, "judge_required", lambda task: False)
    records: list[dict[str, Any]] = []
    started = time.perf_counter()
    transport = settings.transport or suite.transports[0]
    with suite.servers(transport) as servers:
        async with (Toolbox(servers) if servers else nullcontext()) as toolbox:  # BFCL's AST suites: no server
            limiter = anyio.Semaphore(max(1, settings.concurrency))

            async def one(task: Any, repeat: int) -> None:
                async with limiter:
                    try:
                        chosen = make_policy(settings, suite, task, policy)
                        if hasattr(suite, "run_one"):  # single-turn suites without a server (BFCL's AST)
                            run = await suite.run_one(task, policy=chosen, sampling=sampling, store=store,
                                                      group_id=task.id)
                        else:
                            run = await run_task(suite, task, policy=chosen, toolbox=toolbox, mode=settings.mode,
                                                 gate=gate, rehearse_n=settings.rehearse, strategy=settings.strategy,
                                                 sampling=sampling, store=store, group_id=task.id)
                        destructive = (suite.destructive_calls(task, run.trace)
                                       if hasattr(suite, "destructive_calls") and settings.mode == "real" else None)
                        record = run_record(run.trace, task, score=run.verdict.score, judge_required=judge(task),
                                            repeat=repeat, destructive=destructive)
                        record["checks"] = [c["name"] for c in run.verdict.to_dict()["checks"] if not c["passed"]]
                    except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others
                        record = failed_record(task, repeat, exc, judge(task))
                records.append(record)
                if on_run is not None:
                    on_run(record)

            async with anyio.create_task_group() as tg:
                for repeat in range(settings.repeats):
                    for task in tasks:
                        tg.start_soon(one, task, repeat)
    position = {task.id: i for i, task in enumerate(tasks)}
    records.sort(key=lambda r: (position[r["task_id"]], r["repeat"]))
    results = {"settings": asdict(settings), "label": settings.label(), "suite": suite.name,
               "wall_s": time.perf_counter() - started, "summary": summarize(records), "runs": records}
    write_results(out, results)
    return results


def failed_record(task: Any, repeat: int, exc: BaseException, judge_required: bool) -> dict[str, Any]:
    return {"task_id": task.id, "kind": getattr(task, "kind", None), "repeat": repeat, "run_id": None,
            "score": 0.0, "passed": False, "judge_required": judge_required, "status": "failed",
            "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:],
            "calls": {"made": 0, "reference": len(task.actions), "tp": 0, "tp_name": 0, "exact": not task.actions},
            "fidelity": [], "tokens": {}, "gate": {}, "real_calls": 0, "stopped_calls": 0, "wall_s": 0.0, "checks": []}


def write_results(out: Path, results: dict[str, Any]) -> None:
    from envace_mcp.eval.report import markdown, plot

    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2, default=str))
    tmp.replace(out / "results.json")  # never a torn results.json
    (out / "results.md").write_text(markdown([results]))
    plot([results], out / "results.png")

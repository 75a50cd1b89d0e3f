"""`envace eval`: run a suite's tasks (× repeats) through the EnvACE graph, record every run, measure.

    results = await evaluate(get_suite("bank"), tasks, policy, out=Path("runs/bank"), repeats=2)

Writes `out/results.json` (configuration, summary, one record per run), `out/results.md` and
`out/results.png`, and every run as a trace in `out/traces/`. A run that crashes is recorded as
failed (score 0) and the evaluation goes on.

Each finished run is also journaled to `out/runs.jsonl` as it ends, so an evaluation that is killed
(a timeout, a lost machine) loses only the runs in flight: the same command resumes it, running what
is not there yet. The same folder with more tasks (`--limit 96` after `--limit 48`) runs only the new
ones; another configuration in that folder is refused (`EvalSettings` fields other than the task
selection and the concurrency must match).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import anyio

from envace_mcp.eval.metrics import run_record, summarize
from envace_mcp.graph import GateConfig
from envace_mcp.graph.gate import UNATTENDED, gate_settings


@dataclass
class EvalSettings:
    """One configuration of an evaluation (what `--compare` varies)."""

    suite: str
    split: str = "test"
    limit: int | None = None
    tasks: list[str] | None = None
    model: str | None = None
    adapter: str | None = None
    rehearse_adapter: str | None = None
    """The rehearse role runs the model with this adapter instead of `adapter` (`policy.RolePolicies`)."""
    policy: Literal["model", "reference", "noop"] = "model"
    """`model` (a transformers model: `model` + `adapter`), `reference` (the tasks' reference
    solutions and a perfect world model: the adapter's ceiling, and how its scoring is tested) or
    `noop` (answers at once without calling anything: the floor a suite gives for doing nothing)."""
    mode: Literal["real", "simulated", "mixed"] = "real"
    rehearse: int = 0
    """Test-time rehearsal: imagined runs before the real one (EnvACE's N)."""
    strategy: Literal["parallel", "sequential"] = "parallel"
    repeats: int = 1
    concurrency: int = 8
    """Runs in flight together; their generations share batches in the policy."""
    transport: Literal["inprocess", "stdio", "http"] | None = None
    """`inprocess` (bundled suites' default), `stdio`, `http`; the τ² suites are stdio only."""
    gate: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 160
    rehearse_max_new_tokens: int | None = None
    """The rehearse role's own budget (`None`: `max_new_tokens`). A tool's reply can be far longer than a
    tool call: a retail order runs to ~360 tokens, and a rehearsal cut short parses as no prediction."""
    temperature: float = 0.0
    seed: int = 0
    constrain_calls: bool = False
    """Decode the act role's tool calls under the tools' schemas (`policy.constrained`)."""

    def overridden(self, spec: str) -> EvalSettings:
        """A copy with `key=value,key=value` applied (`--compare rehearse=2`, `--compare adapter=DIR`), each
        value parsed and checked as its field's type says; `none` clears a field that may be None."""
        from envace_mcp.errors import UserError

        values = asdict(self)
        varied = [key for key in values if key not in _SHARED]
        hints = get_type_hints(EvalSettings)
        for item in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in varied:
                raise UserError(f"--compare takes key=value pairs of: {', '.join(varied)}; got {item!r}")
            values[key] = _setting(key, hints[key], raw.strip())
        return EvalSettings(**values)

    def label(self) -> str:
        from envace_mcp._redact import redact

        parts = [self.policy if self.policy != "model" else redact(self.model or "embedded")]
        if self.adapter:
            parts.append(f"adapter={Path(self.adapter).name}")
        if self.rehearse_adapter:
            parts.append(f"rehearse_adapter={Path(self.rehearse_adapter).name}")
        parts += [f"mode={self.mode}", f"rehearse={self.rehearse}"]
        if self.rehearse_max_new_tokens is not None and self.rehearse_max_new_tokens != self.max_new_tokens:
            parts.append(f"rehearse_tokens={self.rehearse_max_new_tokens}")
        from envace_mcp.graph.gate import GateConfig

        default = asdict(GateConfig(**UNATTENDED))  # two gates on one adapter: two configurations; name what differs
        changed = {k: v for k, v in sorted(self.gate.items()) if default.get(k) != v}
        if changed:
            parts.append("gate:" + ",".join(f"{k}={v}" for k, v in changed.items()))
        if self.constrain_calls:
            parts.append("constrained")
        return " ".join(parts)


_SHARED = ("suite", "split", "limit", "tasks", "gate")
"""What both configurations of `--compare` share: the same tasks, under the same gate."""
_SELECTION = ("limit", "tasks", "concurrency")
"""What may change between an evaluation and its resumption in the same folder."""
JOURNAL = "runs.jsonl"
"""`{"settings": ...}`, the configuration, then one `{"run": record}` line per finished run."""
_AT_LEAST = {"rehearse": 0, "repeats": 1, "concurrency": 1, "max_new_tokens": 1, "rehearse_max_new_tokens": 1,
             "temperature": 0.0}


def _setting(key: str, hint: Any, raw: str) -> Any:
    """`raw` as the `EvalSettings` field `key` of type `hint` takes it: None (for `X | None`), a choice of a
    Literal, an int or float within the CLI's bounds, or a str."""
    from envace_mcp.errors import UserError

    if get_origin(hint) in (Union, UnionType):
        if raw.lower() in ("none", ""):
            return None
        hint = next(arg for arg in get_args(hint) if arg is not type(None))
    if get_origin(hint) is Literal:
        if raw not in get_args(hint):
            raise UserError(f"--compare: {key} is one of {', '.join(get_args(hint))}, not {raw!r}")
        return raw
    if hint is bool:
        if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise UserError(f"--compare: {key} is true or false, not {raw!r}")
        return raw.lower() in ("true", "1", "yes")
    try:
        value = hint(raw)
    except ValueError:
        what = {"int": "an integer", "float": "a number"}.get(hint.__name__, hint.__name__)
        raise UserError(f"--compare: {key} takes {what}, not {raw!r}") from None
    if key in _AT_LEAST and value < _AT_LEAST[key]:
        raise UserError(f"--compare: {key} must be at least {_AT_LEAST[key]:g}, not {value}")
    return value


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

    gate = GateConfig(**gate_settings(settings.gate, "EvalSettings.gate"))  # a bad one writes nothing; run_task: UNATTENDED
    done = finished_runs(out, settings)
    out.mkdir(parents=True, exist_ok=True)
    journal = _open_journal(out, settings)
    store = TraceStore(out / "traces")
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature, seed=settings.seed)
    sampling = role_sampling(params, settings.rehearse_max_new_tokens)
    judge = getattr(suite, "judge_required", lambda task: False)
    wanted = {(task.id, repeat) for task in tasks for repeat in range(settings.repeats)}
    records = [r for key, r in done.items() if key in wanted]
    for record in records:
        if on_run is not None:
            on_run(record)
    started = time.perf_counter()
    transport = settings.transport or suite.transports[0]
    with journal, suite.servers(transport) as servers:
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
                journal.write(json.dumps({"run": record}, default=str) + "\n")
                journal.flush()
                if on_run is not None:
                    on_run(record)

            async with anyio.create_task_group() as tg:
                for repeat in range(settings.repeats):
                    for task in tasks:
                        if (task.id, repeat) not in done:
                            tg.start_soon(one, task, repeat)
    position = {task.id: i for i, task in enumerate(tasks)}
    records.sort(key=lambda r: (position[r["task_id"]], r["repeat"]))
    results = {"settings": _shown(settings), "label": settings.label(), "suite": suite.name,
               "wall_s": time.perf_counter() - started, "resumed": len(wanted & set(done)),
               "summary": summarize(records), "runs": records}
    write_results(out, results)
    return results


def _shown(settings: EvalSettings) -> dict[str, Any]:
    """The settings as files record them: a model's address keeps no credentials (`_redact`)."""
    from envace_mcp._redact import redact

    values = asdict(settings)
    if values["model"]:
        values["model"] = redact(values["model"])
    return values


def _settings_key(settings: EvalSettings) -> dict[str, Any]:
    return json.loads(json.dumps({k: v for k, v in _shown(settings).items() if k not in _SELECTION}, default=str))


def finished_runs(out: Path, settings: EvalSettings) -> dict[tuple[str, int], dict[str, Any]]:
    """The runs `out/runs.jsonl` holds for this configuration, by (task id, repeat); crashed runs are
    left out, to be run again. Another configuration's journal is refused; a torn last line is skipped."""
    from envace_mcp.errors import UserError

    path = out / JOURNAL
    text = path.read_text() if path.exists() else ""
    if not text.strip():
        return {}  # none yet, or killed before its first line: a fresh start (`_open_journal` writes it anew)
    lines = text.splitlines()
    try:
        head = json.loads(lines[0])
    except ValueError:
        head = None
    if not isinstance(head, dict) or not isinstance(head.get("settings"), dict):
        raise UserError(f"{path}: not an evaluation journal (its first line names no configuration); "
                        "use another --out")
    mine = _settings_key(settings)
    differ = [k for k in sorted(set(mine) | set(head["settings"])) if mine.get(k) != head["settings"].get(k)]
    if differ:
        k = differ[0]
        raise UserError(f"{out} holds runs of another configuration ({k}: {head['settings'].get(k)!r} there, "
                        f"{mine.get(k)!r} now); use another --out, or the same settings to resume")
    done: dict[tuple[str, int], dict[str, Any]] = {}
    for number, line in enumerate(lines[1:], start=2):
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                break  # torn by a kill mid-write: that run is run again
            raise UserError(f"{path}:{number}: not a JSON line; move the file aside to start over") from None
        record = record.get("run") if isinstance(record, dict) else None
        if isinstance(record, dict) and "task_id" in record and record.get("status") != "failed":
            done[(record["task_id"], record["repeat"])] = record
    return done


def _open_journal(out: Path, settings: EvalSettings) -> Any:
    """`runs.jsonl` to append to, never through a link planted there (`_files.open_append`)."""
    from envace_mcp._files import open_append, write_atomic

    path = out / JOURNAL
    text = path.read_text() if path.exists() else ""
    if text.strip():
        if not text.endswith("\n"):  # a torn last line: cut it before appending
            write_atomic(path, text[: text.rfind("\n") + 1])
        return open_append(path)
    journal = open_append(path, truncate=True)
    journal.write(json.dumps({"settings": _settings_key(settings)}) + "\n")
    journal.flush()
    return journal


def failed_record(task: Any, repeat: int, exc: BaseException, judge_required: bool) -> dict[str, Any]:
    return {"task_id": task.id, "kind": getattr(task, "kind", None), "repeat": repeat, "run_id": None,
            "score": 0.0, "passed": False, "judge_required": judge_required, "status": "failed",
            "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:],
            "calls": {"made": 0, "reference": len(task.actions), "tp": 0, "tp_name": 0, "exact": not task.actions},
            "fidelity": [], "tokens": {}, "gate": {}, "real_calls": 0, "stopped_calls": 0, "wall_s": 0.0, "checks": []}


def write_results(out: Path, results: dict[str, Any]) -> None:
    from envace_mcp._files import write_atomic
    from envace_mcp.eval.report import markdown, plot

    write_atomic(out / "results.json", json.dumps(results, indent=2, default=str))  # never torn, never via a link
    write_atomic(out / "results.md", markdown([results]))
    plot([results], out / "results.png")

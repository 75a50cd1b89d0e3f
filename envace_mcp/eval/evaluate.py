"""`envace eval`: run a suite's tasks (× repeats) through the EnvACE graph, record every run, measure.

    results = await evaluate(get_suite("bank"), tasks, EvalConfig(suite="bank", repeats=2), out=Path("runs/bank"))

Writes `out/results.json` (configuration, summary, one record per run), `out/results.md` and
`out/results.png`, and every run as a trace in `out/traces/`. A run that crashes is recorded as
failed (score 0) and the evaluation goes on.

Each finished run is also journaled to `out/runs.jsonl` as it ends, so an evaluation that is killed
(a timeout, a lost machine) loses only the runs in flight: the same command resumes it, running what
is not there yet. The same folder with more tasks (`--limit 96` after `--limit 48`) runs only the new
ones; another configuration in that folder is refused, in one line naming what differs (`EvalConfig`
apart from the task selection and the concurrency, and the gate it resolved to, must match).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import anyio
from pydantic import Field, field_validator

from envace_mcp._files import open_append, write_atomic
from envace_mcp._redact import redact
from envace_mcp.config import Settings, build, differences, parse_text, settings_text
from envace_mcp.envs.reference import reference_roles
from envace_mcp.envs.runner import run_task
from envace_mcp.errors import UserError
from envace_mcp.eval.metrics import run_record, summarize
from envace_mcp.eval.report import markdown, plot
from envace_mcp.graph.gate import UNATTENDED, GateConfig, RunLimits, adapter_gate, gate_settings
from envace_mcp.policy import SamplingParams, load_policy
from envace_mcp.policy.embedded import default_adapter
from envace_mcp.policy.function import FunctionPolicy
from envace_mcp.policy.types import REHEARSE_MAX_NEW_TOKENS, role_sampling
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import TraceStore

if TYPE_CHECKING:
    from envace_mcp.envs.suites import TaskSuite
    from envace_mcp.envs.task import Task
    from envace_mcp.policy.base import Policy



class EvalConfig(Settings):
    """One configuration of an evaluation (what `--compare` varies). The defaults are what ships: the
    embedded model with its shipped adapter, the gate that adapter recommends (unattended: the bundled
    suites are sandboxes), the rehearse role's own token budget."""

    suite: str
    split: Literal["train", "test", "validation", "fit"] = "test"
    """`validation`: every 8th train task of each kind; `fit`: the rest of train (the lab's protocol)."""
    limit: int | None = Field(default=None, ge=1)
    tasks: list[str] | None = None
    model: str | None = None
    """Hugging Face id or folder, or `vllm:URL`; None: the embedded SmolLM2."""
    adapter: str | None = None
    """A LoRA adapter folder; None: the shipped one with the embedded model, none with others; "none": none."""
    rehearse_adapter: str | None = None
    """The rehearse role runs the model with this adapter instead of `adapter` (`policy.RolePolicies`)."""
    policy: Literal["model", "reference", "noop"] = "model"
    """`model` (a transformers model: `model` + `adapter`), `reference` (the tasks' reference
    solutions and a perfect world model: the adapter's ceiling, and how its scoring is tested) or
    `noop` (answers at once without calling anything: the floor a suite gives for doing nothing)."""
    mode: Literal["real", "simulated", "mixed"] = "real"
    rehearse: int = Field(default=0, ge=0)
    """Test-time rehearsal: imagined runs before the real one (EnvACE's N)."""
    strategy: Literal["parallel", "sequential"] = "parallel"
    repeats: int = Field(default=1, ge=1)
    concurrency: int = Field(default=8, ge=1)
    """Runs in flight together; their generations share batches in the policy."""
    transport: Literal["inprocess", "stdio", "http"] | None = None
    """`inprocess` (bundled suites' default), `stdio`, `http`; the τ² suites are stdio only."""
    gate: dict[str, Any] = Field(default_factory=dict)
    """Gate settings over the adapter's recommendation and `UNATTENDED` (`gate_config()`)."""
    limits: RunLimits = Field(default_factory=RunLimits)
    max_new_tokens: int = Field(default=160, ge=1)
    rehearse_max_new_tokens: int = Field(default=REHEARSE_MAX_NEW_TOKENS, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    seed: int = 0
    constrain_calls: bool = False
    """Decode the act role's tool calls under the tools' schemas (`policy.constrained`)."""
    unmeasured_world_model: bool = False
    """Research: evaluate a `rehearse_adapter` that has no trust table (`load_policy(unmeasured=True)`);
    its predictions are then acted on as the gate's settings say. Off, such an adapter is refused."""
    batch_invariant: bool = True
    """Greedy generations give the same tokens whatever shares their batch (`engine.invariant`), so the
    same command gives the same per-task results on one machine; it costs ~0.63x greedy decode
    throughput (docs/benchmarks.md). False: faster, and outcomes may move between runs (bf16 near-ties).
    Our engine only; a vLLM server decides for itself."""

    NESTED: ClassVar[dict[str, type]] = {"gate": GateConfig}
    MOVED: ClassVar[dict[str, str]] = {key: f"it is limits.{key}" for key in RunLimits.model_fields}

    @field_validator("gate", mode="before")
    @classmethod
    def _gate_settings(cls, value: Any) -> Any:
        try:  # typed and checked as every form of gate settings is
            return gate_settings(value, "gate")
        except UserError as exc:
            raise ValueError(str(exc).removeprefix("gate: ")) from None

    def adapter_folder(self) -> str | None:
        """The adapter the model runs with (`default_adapter`); None for the reference and noop policies."""
        if self.policy != "model":
            return None
        return default_adapter(self.model, self.adapter)

    def gate_config(self) -> GateConfig:
        """The gate the runs use: GateConfig's defaults, what the world model's adapter recommends (as
        `envace demo`, `envace run` and the served graph start from), `UNATTENDED`, then `gate`."""
        world = self.rehearse_adapter if self.rehearse_adapter is not None else self.adapter_folder()
        return build(GateConfig, adapter_gate(world), UNATTENDED, self.gate, where="EvalConfig.gate")

    def overridden(self, text: str) -> EvalConfig:
        """A copy with `key=value,...` applied (`--compare rehearse=2`, `--compare adapter=DIR`,
        `--compare gate.on_unusable=allow`), each value checked as its field's type says; `none` clears a
        field that may be None. The task selection is what both configurations share."""
        given = parse_text(text, EvalConfig, "--compare")
        shared = [key for key in given if key in _SHARED]
        if shared:
            raise UserError(f"--compare: both configurations run the same tasks; {shared[0]} cannot differ")
        return build(EvalConfig, self.model_dump(), given, where="--compare")

    def label(self) -> str:
        parts = [self.policy if self.policy != "model" else redact(self.model or "embedded")]
        folder = self.adapter_folder()
        if folder:
            parts.append(f"adapter={Path(folder).name}")
        if self.rehearse_adapter:
            parts.append(f"rehearse_adapter={Path(self.rehearse_adapter).name}")
        parts += [f"mode={self.mode}", f"rehearse={self.rehearse}"]
        if self.rehearse_max_new_tokens != REHEARSE_MAX_NEW_TOKENS:
            parts.append(f"rehearse_tokens={self.rehearse_max_new_tokens}")
        changed = {k: v for k, v in self.gate.items()}  # two gates on one adapter: two configurations
        if changed:
            parts.append("gate:" + settings_text(changed))
        if self.limits != RunLimits():
            parts.append("limits:" + settings_text(self.limits.model_dump(exclude_defaults=True)))
        if self.constrain_calls:
            parts.append("constrained")
        return " ".join(parts)


_SHARED = ("suite", "split", "limit", "tasks")
"""What both configurations of `--compare` share: the same tasks."""
_SELECTION = ("limit", "tasks", "concurrency")
"""What may change between an evaluation and its resumption in the same folder."""
JOURNAL = "runs.jsonl"
"""`{"settings": ..., "gate": ...}`, the configuration and the gate it resolved to, then one `{"run":
record}` line per finished run."""


def select_tasks(suite: TaskSuite, settings: EvalConfig) -> list[Task]:
    tasks = [suite.task(t) for t in settings.tasks] if settings.tasks else suite.split(settings.split)
    return tasks[: settings.limit] if settings.limit else tasks


def make_policy(settings: EvalConfig, suite: TaskSuite, task: Task, base: Policy | None) -> Policy | None:
    """The policy for one run: the loaded model, or the task's reference solution."""
    if settings.policy == "reference":
        return FunctionPolicy(**reference_roles(suite, task))
    if settings.policy == "noop":
        return FunctionPolicy(act=lambda request: "I cannot help with that.")
    return base


async def evaluate(suite: TaskSuite, tasks: Sequence[Task], settings: EvalConfig, *, out: Path,
                   policy: Policy | None = None,
                   on_run: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every task `settings.repeats` times; write results.json / .md / .png and traces under `out`."""
    gate = settings.gate_config()  # a bad one writes nothing
    done = finished_runs(out, settings)
    out.mkdir(parents=True, exist_ok=True)
    journal = _open_journal(out, settings)
    store = TraceStore(out / "traces")
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature, seed=settings.seed)

    def sampling_of(repeat: int) -> dict[str, SamplingParams]:
        """Repeat r samples with seed + r: a task's repeats differ where sampling does (temperature > 0;
        one seed for all of them made K copies of one run), and each is reproducible alone."""
        return role_sampling(params.model_copy(update={"seed": settings.seed + repeat}), settings.rehearse_max_new_tokens)

    policy = policy if policy is not None or settings.policy != "model" else load_model_policy(settings)
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

            async def one(task: Task, repeat: int) -> None:
                async with limiter:
                    try:
                        chosen = make_policy(settings, suite, task, policy)
                        if hasattr(suite, "run_one"):  # single-turn suites without a server (BFCL's AST)
                            run = await suite.run_one(task, policy=chosen, sampling=sampling_of(repeat), store=store,
                                                      group_id=task.id)
                        else:
                            run = await run_task(suite, task, policy=chosen, toolbox=toolbox, mode=settings.mode,
                                                 gate=gate, limits=settings.limits, rehearse_n=settings.rehearse, strategy=settings.strategy,
                                                 sampling=sampling_of(repeat), store=store, group_id=task.id)
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
    results = {"settings": _shown(settings), "gate": gate.model_dump(mode="json"), "label": settings.label(),
               "suite": suite.name,
               "wall_s": time.perf_counter() - started, "resumed": len(wanted & set(done)),
               "summary": summarize(records), "runs": records}
    write_results(out, results)
    return results


def load_model_policy(settings: EvalConfig) -> Policy:
    """The policy `settings` evaluate (`policy="model"`), loaded as every entry point loads one."""
    return load_policy(settings.model, adapter=settings.adapter_folder(), rehearse_adapter=settings.rehearse_adapter,
                       unmeasured=settings.unmeasured_world_model, constrain_calls=settings.constrain_calls,
                       batch_invariant=settings.batch_invariant)


def _shown(settings: EvalConfig) -> dict[str, Any]:
    """The settings as files record them: a model's address keeps no credentials (`_redact`)."""
    values = settings.model_dump(mode="json")
    if values["model"]:
        values["model"] = redact(values["model"])
    return values


def _settings_key(settings: EvalConfig) -> dict[str, Any]:
    """What a resumption must match: the configuration apart from the task selection, and the gate it
    resolved to (an adapter's envace.json may have changed since)."""
    key = {k: v for k, v in _shown(settings).items() if k not in _SELECTION}
    return {**key, "resolved_gate": settings.gate_config().model_dump(mode="json")}


def finished_runs(out: Path, settings: EvalConfig) -> dict[tuple[str, int], dict[str, Any]]:
    """The runs `out/runs.jsonl` holds for this configuration, by (task id, repeat); crashed runs are
    left out, to be run again. Another configuration's journal is refused; a torn last line is skipped."""
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
    differ = differences(head["settings"], _settings_key(settings))
    if differ:
        shown = "; ".join(differ[:3]) + (f"; and {len(differ) - 3} more" if len(differ) > 3 else "")
        raise UserError(f"{out} holds runs of another configuration ({shown}; there → now); use another "
                        "--out, or the same settings to resume")
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


def _open_journal(out: Path, settings: EvalConfig) -> Any:
    """`runs.jsonl` to append to, never through a link planted there (`_files.open_append`)."""
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


def failed_record(task: Task, repeat: int, exc: BaseException, judge_required: bool) -> dict[str, Any]:
    return {"task_id": task.id, "kind": getattr(task, "kind", None), "repeat": repeat, "run_id": None,
            "score": 0.0, "passed": False, "judge_required": judge_required, "status": "failed",
            "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:],
            "calls": {"made": 0, "reference": len(task.actions), "tp": 0, "tp_name": 0, "exact": not task.actions},
            "fidelity": [], "tokens": {}, "gate": {}, "real_calls": 0, "stopped_calls": 0, "wall_s": 0.0, "checks": []}


def write_results(out: Path, results: dict[str, Any]) -> None:
    write_atomic(out / "results.json", json.dumps(results, indent=2, default=str))  # never torn, never via a link
    write_atomic(out / "results.md", markdown([results]))
    plot([results], out / "results.png")

"""LangSmith: rehearse, gate and act as named steps of a traced run, and recorded runs as dataset
examples.

Live runs: with LangSmith tracing on (`LANGSMITH_TRACING=true`, `LANGSMITH_API_KEY`, optionally
`LANGSMITH_ENDPOINT`), LangGraph traces every node of the EnvACE graph as a run of its name (`agent`,
`rehearse`, `gate`, `act`). The drop-ins run inside a user's node (`RehearsingToolNode`'s tool node,
`create_agent`'s `tools` node), so they open the same three steps themselves with `named_step`: each
call's `rehearse`, `gate` and `act` are child runs of the node running it, and the real tool's own
run is a child of `act`. With tracing off a step costs one check.

Recorded runs: `write_examples` writes one LangSmith example per run (JSONL), the shape
`Client.create_examples` takes:

    {"inputs": {"task": ..., "tools": [...]}, "outputs": {"final_answer": ..., "steps": [...]},
     "metadata": {"source": "envace-mcp", "run_id": ..., "status": ..., "rewards": [...], ...}}

and `read_examples` reads such a file back into traces. Every field of the trace survives the round
trip except the token ids and logprobs of generations (`tokens=True` keeps them too): a dataset is
for reading and evaluating runs, the trace store for training on their tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace_mcp.errors import UserError
from envace_mcp.traces._jsonl import read_runs, why_invalid, write_runs
from envace_mcp.traces.exporting import FileExporter, register_exporter
from envace_mcp.traces.importing import SHOWN, json_object, skipped_lines
from envace_mcp.traces.schema import Trace, read_trace

if TYPE_CHECKING:
    from langsmith.run_trees import RunTree

SOURCE = "envace-mcp"
"""`metadata.source` of the examples written here."""
TOKEN_FIELDS = ("prompt_ids", "completion_ids", "logprobs")
_IN_INPUTS = ("task", "tools")
_IN_OUTPUTS = ("final_answer", "steps")


# ---------------------------------------------------------------------------- named steps of live runs


class NamedStep:
    """One named step's LangSmith run; `done(**outputs)` records what it came to (nothing when untraced)."""

    def __init__(self, run: RunTree | None = None) -> None:
        self.run = run

    def done(self, **outputs: object) -> None:
        if self.run is not None:
            self.run.end(outputs=_plain(outputs))


@contextlib.contextmanager
def named_step(name: str, **inputs: object) -> Iterator[NamedStep]:
    """A child run named `name` of the LangChain / LangGraph run in progress, when LangSmith tracing is
    on; LangChain runs started inside it (a tool's) become its children. A LangGraph interrupt (an
    approval pause) passing through ends the step without marking it failed."""
    from langsmith.utils import tracing_is_enabled

    if not tracing_is_enabled():
        yield NamedStep()
        return
    from langgraph.errors import GraphBubbleUp  # imported once tracing is on: langgraph costs a second to load
    from langsmith.run_helpers import trace

    with trace(name, "chain", inputs=_plain(inputs), exceptions_to_handle=(GraphBubbleUp,)) as run:
        yield NamedStep(run)


def _plain(value: object) -> Any:
    """JSON data for a run's inputs and outputs (models as their JSON, anything else as text)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


# ---------------------------------------------------------------------------- dataset examples


def to_example(trace: Trace, *, tokens: bool = False) -> dict[str, Any]:
    """One run as a LangSmith example: what the agent was given, what it did, everything else as metadata."""
    data = trace.model_dump(mode="json")
    steps = [step.model_dump(mode="json", exclude_none=True, exclude=None if tokens else set(TOKEN_FIELDS))
             for step in trace.steps]
    metadata = {k: v for k, v in data.items() if k not in _IN_INPUTS + _IN_OUTPUTS}
    return {"inputs": {"task": trace.task, "tools": data["tools"]},
            "outputs": {"final_answer": trace.final_answer, "steps": steps},
            "metadata": {"source": SOURCE, **metadata}}


def write_examples(traces: Iterable[Trace], path: str | Path, *, tokens: bool = False,
                   skipped: list[str] | None = None) -> int:
    """Write runs as LangSmith examples, one JSON object a line; returns how many. The file appears whole
    or not at all (written beside it, then renamed over it). A run that cannot be written as JSON (a
    tool's reply nested deeper than serialisation allows) is left out, and why is appended to `skipped`."""
    return write_runs(traces, path, lambda trace: to_example(trace, tokens=tokens), skipped=skipped)


@register_exporter
class LangSmithExporter(FileExporter):
    """`write_examples` as an `Exporter`: one example per run to `ExportConfig.out`, token ids and
    logprobs only with `ExportConfig.tokens`."""

    name = "langsmith"
    takes = frozenset({"out", "tokens"})

    def write(self, traces: Sequence[Trace], out: Path, skipped: list[str]) -> int:
        return write_examples(traces, out, tokens=self.config.tokens, skipped=skipped)


@dataclasses.dataclass
class ExamplesSummary:
    """What `read_examples` made of a file: runs read, and the lines skipped with why."""

    path: str
    runs: int = 0
    skipped: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    def report(self) -> list[str]:
        """The summary as lines of text; they quote the file, so a terminal shows them through `safe`."""
        lines = [f"imported {self.runs} run(s) from {self.path}"]
        if self.skipped:
            lines.append(skipped_lines(self.skipped))
        return lines


def read_examples(path: str | Path) -> tuple[list[Trace], ExamplesSummary]:
    """The runs of a LangSmith examples file (`write_examples`' shape) as traces. A malformed line, or a
    torn last one, is skipped and reported with its number; a file with no run at all is a `UserError`."""
    path = Path(path)
    traces, skipped = read_runs(path, lambda line, _: from_example(json_object(line, "an example object")),
                                what="examples file")
    summary = ExamplesSummary(str(path), len(traces), skipped)
    if not traces:
        why = "; ".join(f"line {n}: {w}" for n, w in summary.skipped[:SHOWN]) or "it is empty"
        raise UserError(f"no run to import from {str(path)!r}: {why}")
    return traces, summary


def from_example(example: dict[str, Any]) -> Trace:
    """The trace an example (`to_example`'s shape) holds; a `ValueError` saying what is missing or wrong."""
    parts = {}
    for key in ("inputs", "outputs", "metadata"):
        part = example.get(key)
        part = {} if part is None else part
        if not isinstance(part, dict):
            raise ValueError(f"'{key}' is a JSON {type(part).__name__}, not an object")
        parts[key] = part
    metadata = {k: v for k, v in parts["metadata"].items() if k != "source"}
    missing = [k for k in ("run_id", "started_at") if k not in metadata]
    if missing:
        raise ValueError(f"not an envace run: metadata lacks {', '.join(missing)} (write the file with "
                         "`envace traces export --format langsmith`)")
    data = {**metadata, **{k: parts["inputs"].get(k) for k in _IN_INPUTS},
            "final_answer": parts["outputs"].get("final_answer"), "steps": parts["outputs"].get("steps") or []}
    try:
        return read_trace(data)
    except Exception as exc:  # noqa: BLE001 - any shape of bad record is a reported line, never a crash
        raise ValueError(f"not a trace: {why_invalid(exc)}") from None

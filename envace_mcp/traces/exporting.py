"""One shape for every exporter of recorded runs, and the one registry `envace traces export` reads.

Recording and writing stay apart (as in openai-agents' tracing: processors record, exporters write): the
`TraceRecorder` records runs into a `TraceStore`; an `Exporter` takes finished runs and writes them
somewhere, returning an `ExportSummary`. Its configuration is one `ExportConfig`, whose fields are the
command's options, so an exporter says which it `takes` and the command needs no code of its own for it.

A new exporter is one file:

    @register_exporter
    class Parquet(FileExporter):
        name = "parquet"

        def write(self, traces, out, skipped):
            ...
            return written

It is found once its module is imported, or, from an installed package, through the entry point group
`envace_mcp.exporters` (the entry point names the module). The built-in formats are listed by module in
`BUILT_IN`, imported only when named, so the command starts without loading what they need.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from importlib.metadata import entry_points
from pathlib import Path
from typing import ClassVar, TypeVar

from envace_mcp.errors import UserError
from envace_mcp.traces.schema import Trace

ENTRY_POINTS = "envace_mcp.exporters"
BUILT_IN: dict[str, tuple[str, str]] = {
    # name: (the module that registers it, what it writes: the command's help)
    "otel": ("envace_mcp.traces.otel", "OpenTelemetry GenAI spans to an OTLP endpoint (--otlp, --content)"),
    "langsmith": ("envace_mcp.traces.langsmith", "one LangSmith dataset example per run, to a JSONL file (--out, "
                                                 "--tokens)"),
    "atif": ("envace_mcp.traces.atif_exporter", "one ATIF v1.8 trajectory per run, to a JSONL file (--out, "
                                                 "--tokens; extra `atif`)"),
    "trl": ("envace_mcp.traces.trl_exporter", "one row of TRL's conversational dataset with tools per run "
                                                "(messages, tools, the act turns' token ids and logprobs), to a "
                                                "JSONL file (--out)"),
}
"""The formats that ship with the package."""
OPTIONS = {"out": "--out", "endpoint": "--otlp", "content": "--content", "tokens": "--tokens"}
"""Each `ExportConfig` field and the command option that sets it."""


@dataclass(frozen=True)
class ExportConfig:
    """Everything an export can be told, in one place (each field is one option of `envace traces export`)."""

    out: Path | None = None  # a file exporter's file
    endpoint: str | None = None  # a network exporter's address (None: its own default, e.g. OTEL_* variables)
    content: bool = False  # also prompts, completions, arguments and results (opt-in where conventions say so)
    tokens: bool = False  # keep the generations' token ids and logprobs

    def given(self) -> set[str]:
        """The fields set to something other than their default."""
        return {f.name for f in fields(self) if getattr(self, f.name) != f.default}


@dataclass
class ExportSummary:
    """What an export did: how many things went out (runs written, or spans sent), a line saying so, and
    the runs left out with why. The lines quote paths, URLs and runs' own text: a terminal shows them
    through `safe`."""

    count: int
    done: str
    left_out: list[str] = field(default_factory=list)


class Exporter(ABC):
    """Writes finished runs somewhere. `takes` names the `ExportConfig` fields it reads; the others must be
    left at their defaults (`check`), so a misplaced option is an error, never silently ignored."""

    name: ClassVar[str]
    takes: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: ExportConfig | None = None) -> None:
        self.config = config or ExportConfig()
        self.check()

    def check(self) -> None:
        """Refuse a configuration this exporter cannot use, before any run is read (a `UserError`)."""
        misplaced = sorted(self.config.given() - self.takes)
        if misplaced:
            flags = ", ".join(OPTIONS[f] for f in misplaced)
            raise UserError(f"{flags}: not for --format {self.name}, which takes "
                            f"{', '.join(OPTIONS[f] for f in sorted(self.takes)) or 'no options'}")

    @abstractmethod
    def export(self, traces: Sequence[Trace]) -> ExportSummary:
        """Write the runs; a failure is an `EnvaceError` saying why."""


class FileExporter(Exporter):
    """An exporter that writes one file (`ExportConfig.out`), whole or not at all."""

    takes = frozenset({"out"})

    def check(self) -> None:
        super().check()
        if self.config.out is None:
            raise UserError(f"--format {self.name} writes a file: give --out FILE (e.g. runs.jsonl)")

    @abstractmethod
    def write(self, traces: Sequence[Trace], out: Path, skipped: list[str]) -> int:
        """Write the runs to `out`; returns how many, and appends to `skipped` why any was left out."""

    def export(self, traces: Sequence[Trace]) -> ExportSummary:
        out, left_out = self.config.out, []
        assert out is not None  # `check`
        try:
            count = self.write(traces, out, left_out)
        except OSError as exc:
            raise UserError(f"cannot write {out}: {exc.strerror or exc}") from exc
        return ExportSummary(count, f"wrote {count} run(s) to {out}", left_out)


_REGISTERED: dict[str, type[Exporter]] = {}
E = TypeVar("E", bound=type[Exporter])


def register_exporter(cls: E) -> E:
    """Class decorator: make `cls` the exporter of its `name` (a later registration of a name replaces it)."""
    _REGISTERED[cls.name] = cls
    return cls


def exporter_names() -> list[str]:
    """Every format that can be named: the built-in ones and those registered so far, without importing any."""
    return sorted({*BUILT_IN, *_REGISTERED})


def get_exporter(name: str) -> type[Exporter]:
    """The exporter registered under `name`, importing its module if it is built in or an entry point."""
    if name not in _REGISTERED and name in BUILT_IN:
        importlib.import_module(BUILT_IN[name][0])
    if name not in _REGISTERED:
        for point in entry_points(group=ENTRY_POINTS, name=name):
            point.load()  # its module registers the exporter
    if name not in _REGISTERED:
        raise UserError(f"no exporter named {name!r}: the formats are {', '.join(exporter_names())}")
    return _REGISTERED[name]

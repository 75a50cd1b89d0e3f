"""The ATIF format as an `Exporter` (`traces.exporting`), imported only when `atif` is named."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from envace_mcp.traces.atif import write_atif
from envace_mcp.traces.exporting import FileExporter, register_exporter
from envace_mcp.traces.schema import Trace


@register_exporter
class AtifExporter(FileExporter):
    """One ATIF trajectory per run (`write_atif`); token ids and logprobs only with `ExportConfig.tokens`."""

    name = "atif"
    takes = frozenset({"out", "tokens"})

    def write(self, traces: Sequence[Trace], out: Path, skipped: list[str]) -> int:
        return write_atif(traces, out, tokens=self.config.tokens, skipped=skipped)

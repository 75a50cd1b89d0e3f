"""TRL dataset rows as an `Exporter` (`traces.exporting`). Imported only when `trl` is named: the rows
render with the policy's prompts, and the policy imports `envace_mcp.traces`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from envace_mcp.traces.exporting import FileExporter, register_exporter
from envace_mcp.traces.schema import Trace
from envace_mcp.traces.trl import write_trl


@register_exporter
class TrlExporter(FileExporter):
    """One TRL conversational row per run (`write_trl`): the act turns' token ids are always in it."""

    name = "trl"

    def write(self, traces: Sequence[Trace], out: Path, skipped: list[str]) -> int:
        return write_trl(traces, out, skipped=skipped)

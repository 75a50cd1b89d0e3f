"""Traces: every graph run recorded (prompts, tokens, logprobs, predictions, real results, decisions,
rewards), stored crash-safely, read back for inspection and training, exported to OpenTelemetry
backends, LangSmith datasets and ATIF trajectories. TRL dataset rows are in `traces.trl`, not imported
here: they render with the policy's prompts, and the policy imports this package."""

from envace_mcp.traces.atif import AtifSummary, read_atif, write_atif
from envace_mcp.traces.importing import ImportSummary, load_catalog, read_log
from envace_mcp.traces.langsmith import ExamplesSummary, read_examples, write_examples
from envace_mcp.traces.mutating import MutationSummary, mutate_calls
from envace_mcp.traces.otel import export_otel
from envace_mcp.traces.recorder import RewardFunction, TraceRecorder, record_group, record_run, score
from envace_mcp.traces.schema import SCHEMA_VERSION, Comparison, Reward, Step, Trace, read_trace
from envace_mcp.traces.store import TraceStore, to_dataset

__all__ = [
    "Trace",
    "Step",
    "Reward",
    "Comparison",
    "SCHEMA_VERSION",
    "read_trace",
    "TraceRecorder",
    "record_run",
    "record_group",
    "RewardFunction",
    "score",
    "TraceStore",
    "to_dataset",
    # your own agents' tool-call logs
    "read_log",
    "load_catalog",
    "mutate_calls",
    "ImportSummary",
    "MutationSummary",
    # to other tools: OpenTelemetry backends (extra `otel`), LangSmith datasets, ATIF trajectories (extra `atif`)
    "export_otel",
    "write_examples",
    "read_examples",
    "ExamplesSummary",
    "write_atif",
    "read_atif",
    "AtifSummary",
]

"""The trace format: the contract between the graph (which records) and the trainer (which reads).

One `Trace` per graph run; its `steps` in order. A step is one of:
- `act` / `rehearse` / `critique`: a model generation — rendered prompt (text and token ids), completion
  token ids, per-token sampling logprobs, decoded text, the parsed output, sampling settings;
- `gate`: the gate's decision and reason for one proposed call, and how sure the rehearsal was of its outcome;
- `tool`: what answered a call — a real MCP result (content, structured content, is_error, error kind,
  latency) or, when simulated, the rehearsal — plus the prediction-vs-real comparison when both exist.

Versioned: `schema_version` is bumped on any change of meaning, and `read_trace` upgrades older
versions. Version 2 added the rehearse prompt format (`Trace.rehearse_format`, and on rehearse steps
`format` and, for inline rehearsals, `close`); version 1 traces are all EnvACE simulator prompts.
Version 3 split the run limits out of `gate` into `limits`, made the evidence rules one `evidence` list
and failing closed one `on_unusable` choice; version 2 gates are read in that shape.
`docs/trace.schema.json` is generated from these models (`python -m envace_mcp.traces.schema`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from envace_mcp._formats import RehearseFormat
from envace_mcp._redact import redact

SCHEMA_VERSION = 3

StepRole = Literal["act", "rehearse", "critique", "gate", "tool"]
RunStatus = Literal["finished", "interrupted", "failed"]
STOPPED = frozenset({"block", "feedback", "budget", "reject", "rejected_by_human"})
"""Gate decisions that kept a proposed call from running: its `tool` step's result is the gate's
message to the agent ("Not executed (block): ..."), not anything the environment said."""


class Comparison(BaseModel):
    """How a rehearsal compared with reality (`envace_mcp.policy.fidelity.compare`)."""

    score: float
    status_match: bool | None = None
    mismatches: list[str] = Field(default_factory=list)


RESULT_CHARS = 1 << 20
"""The most characters one stored tool result keeps: 64 times what a prompt shows of it
(`prompts.TOOL_OUTPUT_CHARS`), so a reply a model could have seen whole is stored whole, while a tool that
answers with 48 MB (a file, a table dump) makes a 1 MiB step, not a trace line no reader can hold."""


def bounded_result(result: dict[str, Any]) -> dict[str, Any]:
    """`result` (`ToolResult` JSON) as a trace stores it: as it is when its content (text, other blocks as
    JSON) and structured content together hold at most `RESULT_CHARS` characters. Past that it is kept
    once: structured content dropped (it repeats the reply as JSON, and cut JSON is not JSON), the content
    cut to `RESULT_CHARS` and closed by a text block saying so, and `truncated` giving the sizes."""
    content = result.get("content")
    if not isinstance(content, list) or result.get("truncated"):  # not a tool's reply, or cut already
        return result
    sizes = [len(block["text"]) if _is_text(block) else len(json.dumps(block, ensure_ascii=False, default=str))
             for block in content]
    structured = result.get("structured_content")
    structured_chars = None if structured is None else len(json.dumps(structured, ensure_ascii=False, default=str))
    if sum(sizes) + (structured_chars or 0) <= RESULT_CHARS:
        return result
    kept: list[Any] = []
    room = RESULT_CHARS
    for block, size in zip(content, sizes):
        if size > room and not _is_text(block):
            break
        kept.append({**block, "text": block["text"][:room]} if size > room else block)
        room -= min(size, room)
        if not room:
            break
    note = (f"[... result cut: its content had {sum(sizes):,} characters, the first {RESULT_CHARS - room:,} are kept"
            + (f"; its structured content ({structured_chars:,} characters) is left out" if structured is not None else "")
            + " ...]")
    return {**result, "content": [*kept, {"type": "text", "text": note}], "structured_content": None,
            "truncated": {"content_chars": sum(sizes), "structured_chars": structured_chars,
                          "kept_chars": RESULT_CHARS - room}}


def _is_text(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)


class Step(BaseModel):
    model_config = ConfigDict(extra="ignore")

    index: int
    role: StepRole
    node: str | None = None
    call_id: str | None = None
    time: float
    """Unix time the step was recorded."""
    # generations
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    text: str | None = None
    parsed: Any = None
    """`ActOutput` / `Prediction` / `Critique` as JSON for generations."""
    sampling: dict[str, Any] | None = None
    finish_reason: str | None = None
    format: RehearseFormat | None = None
    """Rehearse steps: "simulator" (EnvACE's fresh chat, `<execution_result>` answers) or "inline" (the
    act prompt + the call, continued with the tool's reply; the prompt extends the act step's tokens)."""
    close: str | None = None
    """Inline rehearse steps: the text the template closes a tool turn with after its content."""
    # calls
    tool: str | None = None
    arguments: Any = None
    result: dict[str, Any] | None = None
    """`ToolResult` as JSON for real calls; the rehearsal for simulated ones. At most `RESULT_CHARS` of it
    are kept (`bounded_result`)."""
    simulated: bool = False
    decision: str | None = None
    reason: str | None = None
    confidence: float | None = None
    """Gate steps: how sure the rehearsal was of the outcome it predicted (the probability of its first
    token), what `GateConfig.min_failure_confidence` compares; None: not rehearsed, or no logprobs."""
    comparison: Comparison | None = None
    approved: bool | None = None
    """Tool steps of calls put to a person (`decision` "ask"): whether they approved (None: not asked)."""
    edited: dict[str, Any] | None = None
    """Tool steps: the call the person approved instead of the proposed one, `{"name", "args"}`."""
    asked: list[dict[str, Any]] | None = None
    """Tool steps: each round of questions the tool's server asked during the call (`toolbox.asking`), and
    what was answered: `{"round", "questions", "answers"}` (`answers` None: not answered, `why`)."""

    @field_validator("result")
    @classmethod
    def _bounded(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return bounded_result(value) if value is not None else None

    @property
    def ran(self) -> bool:
        """A `tool` step whose call reached the real environment (not simulated, not stopped by the
        gate): its `result` is an observation, what a world model may learn."""
        return self.role == "tool" and not self.simulated and self.decision != "simulate" and self.decision not in STOPPED


class Reward(BaseModel):
    """A named score of a run; `value=None` means "could not score", never 0."""

    name: str
    value: float | None
    details: dict[str, Any] = Field(default_factory=dict)


class Trace(BaseModel):
    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    run_id: str
    task_id: str | None = None
    suite: str | None = None
    group_id: str | None = None
    """Runs of one GRPO group share it."""
    mode: Literal["real", "simulated", "mixed"] = "real"
    model: str | None = None
    model_revision: str | None = None
    adapter: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Per role (`act`, `rehearse`, `critique`)."""
    gate: dict[str, Any] = Field(default_factory=dict)
    """The gate's settings (`GateConfig`) the run was gated with."""
    limits: dict[str, Any] = Field(default_factory=dict)
    """The run's limits (`RunLimits`: turns, rehearsals, real calls)."""
    rehearsal: dict[str, Any] = Field(default_factory=dict)
    """Test-time rehearsal settings (`n`, `strategy`) when used."""
    rehearse_format: RehearseFormat = "simulator"
    """The rehearse role's prompt format in this run (what an adapter trained on it learns)."""
    task: str | None = None
    tools: list[dict[str, Any]] | None = None
    """The tool catalog the run saw (`ToolSpec.to_dict` per tool: schemas and annotations), so a world model
    can be fitted from the run without its servers (`envace world-model fit`); None: not recorded."""
    started_at: float
    ended_at: float | None = None
    final_answer: str | None = None
    status: RunStatus = "finished"
    error: str | None = None
    rewards: list[Reward] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("model", "error")
    @classmethod
    def _without_credentials(cls, value: str | None) -> str | None:
        """A model's address (`vllm:http://user:pass@host/v1`) or an error quoting one keeps no secret."""
        return redact(value) if value is not None else None

    def reward(self, name: str) -> Reward | None:
        return next((r for r in reversed(self.rewards) if r.name == name), None)

    def steps_of(self, role: StepRole) -> list[Step]:
        return [s for s in self.steps if s.role == role]


def read_trace(data: dict[str, Any]) -> Trace:
    """A trace from its JSON, upgrading older schema versions."""
    version = data.get("schema_version", 1)
    if version > SCHEMA_VERSION:
        raise ValueError(f"trace schema version {version} is newer than this envace-mcp reads ({SCHEMA_VERSION})")
    if version < 2:
        data = _from_v1(data)
    if version < 3:
        data = _from_v2(data)
    return Trace.model_validate(data)


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 had one rehearse prompt, EnvACE's simulator chat."""
    steps = [{**s, "format": "simulator"} if isinstance(s, dict) and s.get("role") == "rehearse" else s
             for s in data.get("steps", [])]
    return {**data, "schema_version": 2, "rehearse_format": "simulator", "steps": steps}


_LIMITS = ("max_steps", "max_rehearsals", "max_real_calls")
_EVIDENCE = ("repeated_failures", "repeated_writes", "ungrounded_arguments")


def _from_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 kept the run limits in `gate`, each evidence rule as a `block_<rule>` flag and failing
    closed as `block_destructive_on_unusable_rehearsal`."""
    old = data.get("gate") if isinstance(data.get("gate"), dict) else {}
    gate = {k: v for k, v in old.items() if k not in _LIMITS and not k.startswith("block_")
            or k == "block_destructive_on_predicted_failure"}
    if "block_destructive_on_unusable_rehearsal" in old:
        gate["on_unusable"] = "block" if old["block_destructive_on_unusable_rehearsal"] else "allow"
    if any(f"block_{rule}" in old for rule in _EVIDENCE):
        gate["evidence"] = [rule for rule in _EVIDENCE if old.get(f"block_{rule}")]
    limits = {k: old[k] for k in _LIMITS if k in old}
    return {**data, "schema_version": SCHEMA_VERSION, "gate": gate, "limits": {**limits, **data.get("limits", {})}}


def json_schema() -> dict[str, Any]:
    schema = Trace.model_json_schema()
    schema["$id"] = f"https://envace-mcp/trace/v{SCHEMA_VERSION}.json"
    schema["description"] = (__doc__ or "").strip().split("\n\n")[0]
    return schema


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/trace.schema.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(json_schema(), indent=2) + "\n")
    print(f"wrote {target}")

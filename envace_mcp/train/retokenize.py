"""SFT rows from runs whose act turns a foreign chat model wrote (a hosted model: text, no token ids).

Such a turn's prompt was the foreign model's, in its own format; we have its text and its calls. Each
act turn of a successful run is rebuilt as this policy would have seen it — the task, the recorded
conversation up to that turn (the calls and the real tool results), the tools you pass — rendered by
the policy's own renderer (`render_act`, its chat template) and tokenised; the target is the turn's
calls in the policy's tool-call format plus its text. So the tokens are the policy's, not the ones
the foreign model sampled: good for behaviour cloning (SFT), useless for GRPO, which needs the
sampling logprobs and refuses such runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from envace_mcp.policy.prompts import render_act, tool_call_text
from envace_mcp.policy.types import ActRequest
from envace_mcp.toolbox import ToolResult
from envace_mcp.traces.schema import Trace
from envace_mcp.train.rows import Segment


def retokenized_act_rows(traces: Iterable[Trace], policy: Any, tools: list[Any], *, instructions: str | None = None,
                         reward: str = "task", min_reward: float = 1.0) -> list[Segment]:
    """Act rows (prompt ids, target ids) for `policy` (a `TransformersPolicy`) from the text-only act
    turns of runs whose `reward` is at least `min_reward`; turns that carry token ids are left to
    `sft_rows`, which takes them as recorded."""
    end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    end = end if isinstance(end, int) and end in policy.engine.eos_ids else min(policy.engine.eos_ids)
    rows: list[Segment] = []
    for trace in traces:
        found = trace.reward(reward)
        if found is None or found.value is None or found.value < min_reward:
            continue
        conversation: list[BaseMessage] = []
        for step in trace.steps:
            if step.role == "act":
                calls = [c for c in (step.parsed or {}).get("tool_calls", [])]
                text = str((step.parsed or {}).get("content") or step.text or "")
                if step.prompt_ids is None:
                    chat, schemas = render_act(ActRequest(task=trace.task or "", messages=list(conversation),
                                                          tools=tools, instructions=instructions))
                    target = "\n".join([p for p in [text] if p] + [tool_call_text(c["name"], c.get("arguments", {}))
                                                                    for c in calls])
                    rows.append(Segment(run_id=trace.run_id, task_id=trace.task_id, group_id=trace.group_id, role="act",
                                        prompt_ids=policy.encode(policy.render(chat, schemas)),
                                        completion_ids=policy.encode(target) + [end], old_logprobs=None,
                                        reward=found.value))
                conversation.append(AIMessage(content=text, tool_calls=[
                    {"name": c["name"], "args": c.get("arguments", {}), "id": c.get("id") or f"call_{i}"}
                    for i, c in enumerate(calls)]))
            elif step.role == "tool" and step.call_id is not None:
                conversation.append(ToolMessage(content=_text(step.result), tool_call_id=step.call_id,
                                                name=step.tool or ""))
    return rows


def _text(result: dict[str, Any] | None) -> str:
    """The tool message the run's model saw (a result with structured content only: that, as JSON)."""
    if not result:
        return ""
    return ToolResult.text_of(result) or json.dumps(result.get("structured_content"), ensure_ascii=False)

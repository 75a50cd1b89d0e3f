"""Where the tokens a model reads per generation go, in saved `envace eval` runs: each act and rehearse
generation's prompt split into the part before the task (system prompt, domain policy, tools), the task,
the rehearsal memory and the rest (the conversation: calls, tool replies, the rehearse turn's opening),
averaged per folder beside its mean score. For comparing prompt formats on the same held-out tasks.

    python -m envace_mcp.lab.analyses.prompt_tokens runs/bank-test [more eval folders] [--model embedded|ID|DIR]

Token counts are the recorded prompt ids; the parts are counted by tokenizing each span of the recorded
prompt text with `--model`'s tokenizer (the model the runs used), so they add up to within a token or
two at each boundary; the conversation is what is left. Simulator-format rehearsals (a fresh chat with
sections of its own) count in tokens per generation but not in the parts.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from envace_mcp._text import visible
from envace_mcp.policy.prompts import MEMORY_HEADER
from envace_mcp.traces import TraceStore

PARTS = ("before the task", "task", "conversation", "memory")


def turn_close(tokenizer: Any) -> str | None:
    """The text the tokenizer's chat template ends a message with (`<|im_end|>` for ChatML, `<|eot_id|>`
    for Llama 3; whitespace for templates that end a turn with a blank line); plain ChatML for a tokenizer
    without a template (what `prompt_text` gives it). None: the template would not render one message."""
    if not getattr(tokenizer, "chat_template", None):
        return "<|im_end|>"
    marker = "\x00marker\x00"
    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    except Exception:  # a template that refuses a lone user message
        return None
    tail = rendered.split(marker, 1)[1] if marker in rendered else ""
    return tail.split()[0] if tail.strip() else (tail or None)


def split_prompt(text: str, task: str | None, close: str | None) -> dict[str, str] | None:
    """The prompt's spans, which add up to it: before the task (system prompt, policy, tools), the task,
    the rehearsal memory message's text and the rest (the conversation). The task is looked for after the
    first turn (the system prompt) and the memory from the end (it is the act prompt's last message, and a
    tool reply may quote its header). None: the task is not in the prompt after the first turn (a
    template that rewrote it)."""
    if not task:
        return None
    first = text.find(close) if close else -1
    at = text.find(task, first + len(close) if first >= 0 and close else 0)
    if at < 0:
        return None
    before, after = text[:at], text[at + len(task):]
    memory = ""
    start = after.rfind(MEMORY_HEADER)
    if start >= 0:
        end = after.find(close, start + len(MEMORY_HEADER)) if close else -1
        end = len(after) if end < 0 else end
        memory, after = after[start:end], after[:start] + after[end:]
    return {"before the task": before, "task": task, "memory": memory, "conversation": after}


def folder_figures(folder: Path, count: Any, close: str | None) -> dict[str, Any]:
    """Mean prompt tokens per generation (all act and rehearse generations), the mean of each part over
    the prompts that split, how many did not, and the folder's mean score."""
    totals = {role: [] for role in ("act", "rehearse")}
    parts: dict[str, list[int]] = {name: [] for name in PARTS}
    unsplit = 0
    for trace in TraceStore(folder / "traces" if (folder / "traces").is_dir() else folder).read():
        for step in trace.steps:
            if step.role not in totals or step.prompt_ids is None or step.prompt_text is None:
                continue
            n = len(step.prompt_ids)
            totals[step.role].append(n)
            simulator = step.role == "rehearse" and step.format != "inline"  # a fresh chat in sections of its own
            spans = None if simulator else split_prompt(step.prompt_text, trace.task, close)
            if spans is None:
                unsplit += 1
                continue
            known = {name: count(spans[name]) for name in ("before the task", "task", "memory")}
            for name, value in known.items():
                parts[name].append(value)
            parts["conversation"].append(n - sum(known.values()))
    try:  # scores are beside the traces in an eval folder; a missing or torn results.json leaves them out
        runs = json.loads((folder / "results.json").read_text()).get("runs", [])
    except (OSError, ValueError, AttributeError):
        runs = []
    runs = runs if isinstance(runs, list) else []
    scores = [r.get("score") for r in runs if isinstance(r, dict) and isinstance(r.get("score"), (int, float))]
    every = totals["act"] + totals["rehearse"]
    mean = lambda values: sum(values) / len(values) if values else float("nan")  # noqa: E731
    return {"generations": len(every), "mean": mean(every), "act": mean(totals["act"]),
            "rehearse": mean(totals["rehearse"]), "parts": {name: mean(v) for name, v in parts.items()},
            "unsplit": unsplit, "runs": len(scores), "score": mean(scores)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="`envace eval --out` folders (or trace folders)")
    parser.add_argument("--model", default="embedded", help="the tokenizer of the model the runs used (default: the embedded model's)")
    ns = parser.parse_args()
    missing = [str(f) for f in ns.folders if not f.is_dir()]
    if missing:
        parser.error(f"no such folder: {', '.join(visible(m) for m in missing)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from envace_mcp.policy.embedded import embedded_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir()) if ns.model == "embedded" else ns.model)
    close = turn_close(tokenizer)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0

    print(f"{'folder':32s} {'runs':>4s} {'score':>6s} {'gens':>5s} {'tokens/gen':>10s} {'act':>6s} {'rehearse':>8s} | "
          + " ".join(f"{name:>15s}" for name in PARTS))
    for folder in ns.folders:
        f = folder_figures(folder, count, close)
        print(f"{visible(str(folder))[-32:]:32s} {f['runs']:4d} {f['score']:6.3f} {f['generations']:5d} {f['mean']:10.0f} "
              f"{f['act']:6.0f} {f['rehearse']:8.0f} | " + " ".join(f"{f['parts'][name]:15.0f}" for name in PARTS))
        if f["unsplit"]:
            print(f"  {f['unsplit']} of {f['generations']} prompts are not in the parts (no task after the first turn: "
                  "simulator-format rehearsals, or a template that rewrote the task); the parts cover the rest")


if __name__ == "__main__":
    main()

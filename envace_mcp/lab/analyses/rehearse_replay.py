"""World models on an agent's own held-out calls: replay each recorded rehearsal with other adapters.

Every rehearsed call that ran in the given trace folders (`Step.ran`: its real reply is an
observation) is rehearsed again from the exact prompt token ids the run recorded, greedy, by each
adapter in turn; the first characters of the reply say the predicted status, as
`policy.parsing.parse_tool_turn` reads an inline rehearsal (a JSON object: a result; prose such as
"Error executing tool ...": an error). Same calls, same prompts, so the adapters differ only in their
weights. The first adapter is the baseline the others are compared with (the one that recorded the
runs, typically). Inline rehearse prompts only (a simulator prompt is a fresh chat and replays too, but
its reply opens with `<execution_result>`; not handled here).

    python -m envace_mcp.lab.analyses.rehearse_replay --adapter envace_mcp/policy/adapters/smollm2-bank \\
        --adapter runs/wm --traces evals/bank-test/traces [--traces ...] [--out replay.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def replayable(folders: list[str]) -> list[dict]:
    """The rehearsed calls that ran, with the recorded rehearse prompt and the real outcome."""
    from envace_mcp.traces import TraceStore

    calls = []
    for folder in folders:
        for trace in TraceStore(folder).read():
            prompts = {s.call_id: s for s in trace.steps if s.role == "rehearse" and s.prompt_ids and s.format == "inline"}
            for step in trace.steps:
                if step.ran and step.result and step.call_id in prompts:
                    calls.append({"task": trace.task_id, "tool": step.tool, "real_error": bool(step.result.get("is_error")),
                                  "prompt_ids": prompts[step.call_id].prompt_ids})
    return calls


def predicted_errors(adapter: str, calls: list[dict], max_new_tokens: int) -> tuple[list[bool], float]:
    from envace_mcp.engine.types import Job, SamplingParams
    from envace_mcp.policy import load_policy

    policy = load_policy(None, adapter=None if adapter == "none" else adapter)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, seed=0)
    start = time.perf_counter()
    done = policy.engine.generate([Job(c["prompt_ids"], greedy, 0) for c in calls])
    texts = [policy.tokenizer.decode(d.completion_ids, skip_special_tokens=True).strip() for d in done]
    return [not text.startswith(("{", "[", "<")) for text in texts], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", action="append", required=True, help="adapter folder ('none': the bare model); "
                        "the first is the baseline")
    parser.add_argument("--traces", action="append", required=True, help="a trace folder of recorded runs")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="enough to see how the reply opens")
    parser.add_argument("--out", type=Path, default=None, help="per-call predictions as JSON")
    args = parser.parse_args()
    calls = replayable(args.traces)
    errors = sum(c["real_error"] for c in calls)
    print(f"{len(calls)} rehearsed calls that ran ({errors} real errors) in {', '.join(args.traces)}")
    rows = []
    for adapter in args.adapter:
        predicted, seconds = predicted_errors(adapter, calls, args.max_new_tokens)
        caught = sum(p and c["real_error"] for p, c in zip(predicted, calls))
        false = sum(p and not c["real_error"] for p, c in zip(predicted, calls))
        rows.append({"adapter": adapter, "errors_predicted": caught, "successes_called_errors": false, "s": seconds,
                     "predicted": predicted})
        print(f"{adapter}: real errors predicted {caught}/{errors}, successes predicted as errors "
              f"{false}/{len(calls) - errors} ({seconds:.0f} s)")
    base = rows[0]
    for row in rows[1:]:
        ratio = row["errors_predicted"] / base["errors_predicted"] if base["errors_predicted"] else float("inf")
        print(f"{row['adapter']} vs {base['adapter']}: errors caught {row['errors_predicted']} vs "
              f"{base['errors_predicted']} ({ratio:.2f}x), false alarms {row['successes_called_errors']} vs "
              f"{base['successes_called_errors']}")
    if args.out:
        args.out.write_text(json.dumps({"calls": [{k: v for k, v in c.items() if k != "prompt_ids"} for c in calls],
                                        "adapters": rows}, indent=1))


if __name__ == "__main__":
    main()

"""The control for test-time rehearsal: the committed run gets a rehearsal memory with no rehearsal behind it.

`envace eval ... -c rehearse=N` imagines N runs and hands their condensed paths to the committed run. This
runs the same command with imagination replaced: no imagined run, and the memory is only the heading
test-time rehearsal writes. Paired against the plain run (`envace compare`), it measures what any memory
at the start of a run costs an act role (its prompt shift); paired against `-c rehearse=N`, what the
imagined paths themselves add. All arguments go to `envace eval` (give `-c rehearse=N`):

    python -m envace_mcp.lab.analyses.tts_memory_control --suite bank --split validation --adapter A -c rehearse=2 --out evals/control
"""

from __future__ import annotations

import runpy
import sys
from typing import Any

import envace_mcp.envs.runner as runner
import envace_mcp.graph.tts as tts


async def no_imagination(graph: Any, task: str, context: Any, *, n: int = 2, strategy: str = "parallel") -> list[Any]:
    return [None] * n  # placeholders: `condense` below reads only how many


def heading_only(attempts: list[Any]) -> str:
    return tts.HEADING.format(n=len(attempts)) if attempts else ""


def main() -> None:
    if not any(arg.startswith("rehearse=") or ",rehearse=" in arg for arg in sys.argv[1:]):
        print("give -c rehearse=N: the control replaces the N imagined runs", file=sys.stderr)
        sys.exit(2)
    runner.imagine, runner.condense = no_imagination, heading_only  # what run_task calls for test-time rehearsal
    sys.argv = ["envace", "eval", *sys.argv[1:]]
    runpy.run_module("envace_mcp.cli", run_name="__main__")  # the command, in this process, with the patch


if __name__ == "__main__":
    main()

"""Act-prompt tokens spent on tools, per bundled domain: the JSON `# Tools` block vs the compact one.

For chat templates without native tool support (the embedded SmolLM2) the act prompt carries the tool
list as text (`envace_mcp.policy.tool_text`). This counts, with the embedded model's tokenizer, the
tokens of the act prompt before the conversation (system prompt, domain policy, tools, the task) in
both formats, and of the tools alone; the ratio is against the JSON format, measured in the same run.

    python benchmarks/tool_rendering.py
"""

from __future__ import annotations

import os

import anyio

os.environ.setdefault("HF_HUB_OFFLINE", "1")


async def catalog(suite):
    from envace_mcp import Toolbox

    async with Toolbox({suite.name: suite.build_server()}) as toolbox:
        return list(toolbox.catalog)


def main() -> None:
    from transformers import AutoTokenizer

    from envace_mcp.eval import get_suite
    from envace_mcp.policy.embedded import embedded_model_dir
    from envace_mcp.policy.prompts import prompt_text, render_act, tool_for_template, tools_block
    from envace_mcp.policy.types import ActRequest

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir()))

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    print(f"tokenizer: embedded SmolLM2-135M-Instruct ({type(tokenizer).__name__})")
    print(f"{'domain':8} {'tools':>5} | {'prompt json':>11} {'compact':>8} {'ratio':>6} | {'tools json':>10} {'compact':>8} {'ratio':>6}")
    for name in ("bank", "retail"):
        suite = get_suite(name)
        specs = anyio.run(catalog, suite)
        task = suite.split("test")[0]
        chat, tools = render_act(ActRequest(task=task.instruction, tools=specs, instructions=suite.instructions))
        prompts = {fmt: count(prompt_text(tokenizer, chat, tools, tool_format=fmt)) for fmt in ("json", "compact")}
        blocks = {fmt: count(tools_block([tool_for_template(s) for s in specs], fmt)) for fmt in ("json", "compact")}
        print(f"{name:8} {len(specs):5} | {prompts['json']:11,} {prompts['compact']:8,} "
              f"{prompts['compact'] / prompts['json']:5.2f}x | {blocks['json']:10,} {blocks['compact']:8,} "
              f"{blocks['compact'] / blocks['json']:5.2f}x")


if __name__ == "__main__":
    main()

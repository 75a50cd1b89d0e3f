"""Act-prompt tokens spent on tools, per bundled domain: the JSON `# Tools` block vs the compact one.

For chat templates without native tool support (the embedded SmolLM2) the act prompt carries the tool
list as text (`envace_mcp.policy.tool_text`). This counts, with the embedded model's tokenizer, the
tokens of the act prompt before the conversation (system prompt, domain policy, tools, the task) in
both formats, and of the tools alone; the ratio is against the JSON format, measured in the same run.
Then the rehearse prompt for the task's first reference call: EnvACE's simulator chat (today's
format, JSON tools) vs the inline format (act prompt + call + the tool turn's opening, compact tools):
its tokens, and the tokens left to prefill once the act turn (prompt + the call) is in the prefix cache.

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

    from envace_mcp.envs import get_suite
    from envace_mcp.policy.embedded import embedded_model_dir
    from langchain_core.messages import HumanMessage

    from envace_mcp.policy.prompts import inline_prompt, prompt_text, render_act, render_inline, render_rehearse
    from envace_mcp.policy.prompts import tool_call_text, tool_for_template, tools_block
    from envace_mcp.policy.types import ActRequest, RehearseRequest, ToolCall
    from envace_mcp.train.rows import common_prefix

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
    print()
    print(f"{'domain':8} | {'rehearse simulator':>18} {'to prefill':>10} | {'inline':>7} {'to prefill':>10} | {'ratio':>6} {'prefill ratio':>13}")
    for name in ("bank", "retail"):
        suite = get_suite(name)
        specs = anyio.run(catalog, suite)
        task = suite.split("test")[0]
        action = task.actions[0]
        call = ToolCall(id="c1", name=action.tool, arguments=dict(action.arguments))
        context = ActRequest(task=task.instruction, tools=specs, instructions=suite.instructions)
        request = RehearseRequest(call=call, tool=next(x for x in specs if x.name == call.name), allowed=specs,
                                  history=[HumanMessage(content=task.instruction)],
                                  act_message=tool_call_text(call.name, call.arguments), context=context)
        act_turn = {}
        for fmt in ("json", "compact"):
            chat, tools = render_act(context)
            act_turn[fmt] = prompt_text(tokenizer, chat, tools, tool_format=fmt) + tool_call_text(call.name, call.arguments)
        simulator = prompt_text(tokenizer, render_rehearse(request), None)
        inline, _ = inline_prompt(prompt_text(tokenizer, *render_inline(request), tool_format="compact"))
        cached = {fmt: tokenizer(text, add_special_tokens=False)["input_ids"] for fmt, text in act_turn.items()}

        def left(text: str, fmt: str) -> int:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            return len(ids) - common_prefix(ids, cached[fmt])

        sim_n, inl_n = count(simulator), count(inline)
        sim_left, inl_left = left(simulator, "json"), left(inline, "compact")
        print(f"{name:8} | {sim_n:18,} {sim_left:10,} | {inl_n:7,} {inl_left:10,} | {inl_n / sim_n:5.2f}x "
              f"{inl_left / sim_left:12.3f}x")


if __name__ == "__main__":
    main()

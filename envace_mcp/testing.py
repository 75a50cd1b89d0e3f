"""Public test doubles and fixtures: policies without a model, and a tiny Qwen3 built offline.

    policy = ScriptedPolicy(
        act=['<tool_call>{"name": "get_balance", "arguments": {"account_id": "CHK-1"}}</tool_call>',
             "Your balance is $12.50."],
        rehearse=['<execution_result>{"balance": 12.5}</execution_result>'],
    )
    ... run the graph ...
    policy.assert_complete()

`FunctionPolicy` computes each turn from the request instead. Both parse text with the same parsers
as the real backends, so what a script says is exactly what a model would have said.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from envace_mcp.errors import UserError
from envace_mcp.policy import prompts
from envace_mcp.policy.base import PromptPolicy
from envace_mcp.policy.function import FunctionPolicy, Scripted, TextPolicy
from envace_mcp.policy.types import (
    ActOutput,
    ActRequest,
    Critique,
    CritiqueRequest,
    Generation,
    Prediction,
    RehearseRequest,
    Role,
    SamplingParams,
)

__all__ = ["ScriptedPolicy", "FunctionPolicy", "build_tiny_qwen3", "QWEN_STYLE_TEMPLATE"]


class ScriptedPolicy(TextPolicy):
    """Answers each role from its own script, in order. `.calls` records (role, request) pairs."""

    def __init__(self, act: Sequence[Scripted] = (), rehearse: Sequence[Scripted] = (),
                 critique: Sequence[Scripted] = ()) -> None:
        super().__init__()
        self.scripts: dict[Role, list[Scripted]] = {"act": list(act), "rehearse": list(rehearse),
                                                    "critique": list(critique)}
        self._used: dict[Role, int] = {"act": 0, "rehearse": 0, "critique": 0}

    def _next(self, role: Role) -> Scripted:
        script = self.scripts[role]
        if self._used[role] >= len(script):
            raise UserError(f"ScriptedPolicy ran out of {role} turns after {len(script)}; the run asked for more")
        self._used[role] += 1
        return script[self._used[role] - 1]

    async def act(self, request: ActRequest, sampling: SamplingParams | None = None) -> Generation[ActOutput]:
        return self._emit("act", request, self._next("act"), sampling)

    async def rehearse(self, request: RehearseRequest, sampling: SamplingParams | None = None) -> Generation[Prediction]:
        return self._emit("rehearse", request, self._next("rehearse"), sampling)

    async def critique(self, request: CritiqueRequest, sampling: SamplingParams | None = None) -> Generation[Critique]:
        return self._emit("critique", request, self._next("critique"), sampling)

    def assert_complete(self) -> None:
        """Every scripted turn was used."""
        left = {role: len(s) - self._used[role] for role, s in self.scripts.items() if len(s) > self._used[role]}
        if left:
            raise AssertionError(f"ScriptedPolicy has unused turns: {left}")


# ---------------------------------------------------------------------------- a tiny Qwen3, offline

QWEN_STYLE_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}"
    "{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if (loop.first and message.content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- set fn = tool_call.function if tool_call.function else tool_call %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}"
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
"""The structure of Qwen3's chat template: `# Tools` system block, `<tool_call>` assistant calls,
`<tool_response>` user turns, and the `enable_thinking=False` empty think block."""

QWEN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                       "<tool_response>", "</tool_response>", "<think>", "</think>"]


def _corpus() -> list[str]:
    import json

    # not at the top: this module is also imported beside langchain-mcp-adapters, on mcp < 2, where the
    # toolbox (which the suites import) cannot load (tests/graph/test_langchain_mcp_tools.py)
    from envace_mcp.envs import get_suite

    texts = [prompts.ACT_SYSTEM, prompts.SIMULATOR_SYSTEM, prompts.CRITIC_SYSTEM, prompts.TOOLS_BLOCK_HEAD,
             prompts.TOOLS_BLOCK_TAIL, "<execution_result></execution_result>", "0123456789.,:;{}[]\"'"]
    for name in ("bank", "retail"):
        suite = get_suite(name)
        for task in suite.tasks[:200]:
            texts.append(task.instruction)
            texts.append(task.answer)
            texts.extend(json.dumps({"name": a.tool, "arguments": a.arguments}) for a in task.actions)
    return texts


def build_tiny_qwen3(path: str | Path, *, vocab_size: int = 1024, hidden_size: int = 64, layers: int = 2,
                     seed: int = 0) -> Path:
    """Write a randomly initialised ~0.2M-parameter Qwen3 with a locally trained byte-level BPE
    tokenizer and a Qwen-style chat template to `path`. No downloads; a few seconds on a CPU."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=QWEN_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=QWEN_SPECIAL_TOKENS[3:])
    fast.chat_template = QWEN_STYLE_TEMPLATE
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(fast), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=hidden_size // 4, max_position_embeddings=8192, tie_word_embeddings=True,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, bos_token_id=None)
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


__all__ = ["ScriptedPolicy", "FunctionPolicy", "build_tiny_qwen3", "QWEN_STYLE_TEMPLATE", "PromptPolicy"]

"""The transformers backend on a tiny random Qwen3 built offline: the Qwen3 path, exact tokens and
logprobs, batching, seeds, adapters. Plumbing only; accuracy claims belong to the real model."""


import anyio
import pytest
import torch
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from envace_mcp.errors import UserError
from envace_mcp.policy import ActRequest, RehearseRequest, SamplingParams, ToolCall, load_policy
from envace_mcp.policy.prompts import render_act
from envace_mcp.policy.transformers import TransformersPolicy

pytestmark = pytest.mark.anyio
SHORT = SamplingParams(max_new_tokens=12, seed=7)


@pytest.fixture(scope="module")
def policy(tiny_qwen3_dir):
    return load_policy(str(tiny_qwen3_dir), batch_window_s=0.05)


def _conversation():
    call = {"name": "get_balance", "args": {"account_id": "CHK-1"}, "id": "c1"}
    return [AIMessage(content="", tool_calls=[call]),
            ToolMessage(content='{"balance": 12.5}', tool_call_id="c1", name="get_balance")]


async def test_the_qwen3_template_renders_tools_calls_responses_and_the_thinking_switch(policy, bank_catalog):
    assert policy.template_has_tools
    chat, tools = render_act(ActRequest(task="What is my balance?", tools=bank_catalog[:2], messages=_conversation()))
    text = policy.render(chat, tools)
    assert "<tools>\n" in text and '"name": "list_accounts"' in text
    assert '<tool_call>\n{"name": "get_balance", "arguments": {"account_id": "CHK-1"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"balance": 12.5}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    policy.enable_thinking = True
    try:
        assert policy.render(chat, tools).endswith("<|im_start|>assistant\n")
    finally:
        policy.enable_thinking = False


async def test_token_ids_decode_back_and_logprobs_match_a_fresh_forward_pass(policy, bank_catalog):
    gen = await policy.act(ActRequest(task="What is my balance?", tools=bank_catalog, messages=_conversation()), SHORT)
    assert gen.prompt_ids and gen.completion_ids and len(gen.logprobs) == len(gen.completion_ids)
    assert policy.tokenizer.decode(gen.prompt_ids) == gen.prompt_text
    assert policy.tokenizer.decode(gen.completion_ids).startswith(gen.text)
    fresh = policy.score(gen.prompt_ids, gen.completion_ids, temperature=gen.sampling.temperature)
    assert max(abs(a - b) for a, b in zip(fresh, gen.logprobs)) < 1e-4
    assert gen.sampling == SHORT and gen.finish_reason in {"stop", "length"}


async def test_concurrent_requests_are_coalesced_into_one_batch_with_exact_logprobs(policy, bank_catalog):
    call = ToolCall(id="c", name="get_balance", arguments={"account_id": "CHK-1"})
    before = len(policy.engine.batcher.batch_sizes)
    results = {}

    async def one(i):
        request = RehearseRequest(call=call, tool=bank_catalog[1], allowed=bank_catalog,
                                  history=[HumanMessage(content=f"request number {i} " * (i + 1))])
        results[i] = await policy.rehearse(request, SamplingParams(max_new_tokens=6 + i, seed=i, temperature=0.8))

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
    assert policy.engine.batcher.batch_sizes[before:] == [6]
    for i, gen in results.items():
        assert len(gen.completion_ids) <= 6 + i
        fresh = policy.score(gen.prompt_ids, gen.completion_ids, temperature=0.8)
        assert max(abs(a - b) for a, b in zip(fresh, gen.logprobs)) < 1e-4


async def test_seeds_make_generation_reproducible(policy):
    request = ActRequest(task="Transfer $5 from CHK-1 to SAV-2")
    one = await policy.act(request, SamplingParams(max_new_tokens=10, seed=3))
    two = await policy.act(request, SamplingParams(max_new_tokens=10, seed=3))
    other = await policy.act(request, SamplingParams(max_new_tokens=10, seed=4))
    # the second run reuses the first one's prompt keys/values (prefix cache): same tokens,
    # logprobs equal up to float rounding of a different computation order
    assert one.completion_ids == two.completion_ids
    assert max(abs(a - b) for a, b in zip(one.logprobs, two.logprobs)) < 1e-5
    assert other.completion_ids != one.completion_ids
    # a generation ends at its token budget or at an end-of-sequence token, and says which
    if one.finish_reason == "length":
        assert len(one.completion_ids) == 10 and one.completion_ids[-1] not in policy.engine.eos_ids
    else:
        assert one.finish_reason == "stop" and one.completion_ids[-1] in policy.engine.eos_ids and len(one.completion_ids) <= 10


async def test_greedy_decoding_records_raw_logprobs(policy):
    gen = await policy.act(ActRequest(task="hello"), SamplingParams(max_new_tokens=5, temperature=0))
    fresh = policy.score(gen.prompt_ids, gen.completion_ids, temperature=0)
    assert max(abs(a - b) for a, b in zip(fresh, gen.logprobs)) < 1e-4


async def test_a_lora_adapter_stacks_on_the_model(tiny_qwen3_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    plain = load_policy(str(tiny_qwen3_dir))
    adapted = load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "adapter"))
    request, sampling = ActRequest(task="hello there"), SamplingParams(max_new_tokens=4, temperature=0)
    a, b = await plain.act(request, sampling), await adapted.act(request, sampling)
    assert a.prompt_ids == b.prompt_ids and a.logprobs != b.logprobs
    fresh = adapted.score(b.prompt_ids, b.completion_ids, temperature=0)
    assert max(abs(x - y) for x, y in zip(fresh, b.logprobs)) < 1e-4



async def test_a_tokenizer_without_a_chat_template_falls_back_to_chatml(tiny_qwen3_dir):
    policy = load_policy(str(tiny_qwen3_dir))
    policy.tokenizer.chat_template = None
    chat, tools = render_act(ActRequest(task="hi", tools=[]))
    text = policy.render(chat, tools)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


async def test_shared_prompt_prefixes_are_computed_once(tiny_qwen3_dir, bank_catalog):
    policy = load_policy(str(tiny_qwen3_dir))
    call = ToolCall(id="c", name="get_balance", arguments={"account_id": "CHK-1"})
    first = await policy.rehearse(RehearseRequest(call=call, tool=bank_catalog[1], allowed=bank_catalog), SHORT)
    reused_before = policy.engine.stats["reused_tokens"]
    other = ToolCall(id="d", name="get_quote", arguments={"symbol": "ACME"})
    second = await policy.rehearse(RehearseRequest(call=other, tool=bank_catalog[2], allowed=bank_catalog), SHORT)
    reused = policy.engine.stats["reused_tokens"] - reused_before
    assert reused > 0.8 * len(second.prompt_ids)  # system prompt and tool list came from the cache
    fresh = policy.score(second.prompt_ids, second.completion_ids)
    assert max(abs(a - b) for a, b in zip(fresh, second.logprobs)) < 1e-4
    assert first.prompt_ids[:reused] == second.prompt_ids[:reused]


def test_a_missing_model_is_a_clear_user_error(tmp_path):
    from envace_mcp.errors import UserError

    with pytest.raises(UserError, match="could not load model"):
        TransformersPolicy.from_pretrained(str(tmp_path / "nope"))


async def test_act_turns_with_changing_memory_share_the_system_and_tools_prefix(policy, bank_catalog):
    """Memory comes last, so turn 2's prompt extends turn 1's conversation whatever the memory says."""
    first = policy.render(*render_act(ActRequest(task="What is my balance?", tools=bank_catalog, memory="- none yet")))
    second = policy.render(*render_act(ActRequest(task="What is my balance?", tools=bank_catalog,
                                                  messages=_conversation(), memory="- get_balance: MISMATCH")))
    ids_1, ids_2 = policy.encode(first), policy.encode(second)
    shared = next(i for i, (a, b) in enumerate(zip(ids_1, ids_2)) if a != b)
    common = policy.tokenizer.decode(ids_1[:shared])
    assert '"name": "cancel_order"' in common and "What is my balance?<|im_end|>" in common  # system, tools, task
    assert second.rstrip().endswith("<|im_start|>assistant\n<think>\n\n</think>") and "MISMATCH" in second.split("<tool_response>")[-1]


async def test_prompts_sharing_a_prefix_hold_its_keys_and_values_once(tiny_qwen3_dir, bank_catalog):
    policy = load_policy(str(tiny_qwen3_dir))
    call = ToolCall(id="c", name="get_balance", arguments={"account_id": "CHK-1"})
    gens = []
    for i in range(4):  # one task's rehearsals: system prompt and tools shared, the history differs
        request = RehearseRequest(call=call, tool=bank_catalog[1], allowed=bank_catalog,
                                  history=[HumanMessage(content=f"run {i}: " + "what is my balance? " * (i + 1))])
        gens.append(await policy.rehearse(request, SHORT))
    cache = policy.engine.prefix_cache
    stored = sum(len(e.ids) for e in cache.entries)
    assert len(cache.entries) == 4 and cache.held_tokens() < 0.5 * stored
    # every stored prompt still gives back exactly its own keys/values
    for gen in gens:
        reused, kv, _ = cache.lookup(gen.prompt_ids + [0])
        assert reused == len(gen.prompt_ids)
        fresh = policy.model(input_ids=torch.tensor([gen.prompt_ids]), use_cache=True).past_key_values
        for layer, (keys, values) in enumerate(kv):
            assert torch.allclose(keys, fresh.layers[layer].keys, atol=1e-5)
            assert torch.allclose(values, fresh.layers[layer].values, atol=1e-5)


async def test_a_rehearsed_calls_confidence_is_the_probability_of_the_first_token_it_wrote(policy, bank_catalog):
    """What `GateConfig.min_failure_confidence` reads: the graph puts exp(first logprob) on the prediction."""
    import math

    from envace_mcp.graph import GateConfig
    from envace_mcp.graph.calls import Proposal, rehearse

    transfer = next(t for t in bank_catalog if t.name == "transfer")
    call = ToolCall(id="t", name="transfer", arguments={"from_account_id": "CHK-1", "to_account_id": "SAV-2", "amount": 5})
    [done], [generation] = await rehearse([Proposal(call, transfer)], policy=policy, catalog=bank_catalog,
                                          history=[HumanMessage(content="move $5")], act_message="", mode="real",
                                          config=GateConfig(), sampling=SamplingParams(max_new_tokens=6, temperature=0))
    assert generation.logprobs and generation.parsed.confidence is None  # the backend's own parse is untouched
    assert done.prediction.confidence == pytest.approx(math.exp(generation.logprobs[0]))
    assert 0.0 < done.prediction.confidence <= 1.0


async def test_a_second_adapter_runs_the_rehearse_role_and_the_first_the_act_role(tiny_qwen3_dir, tmp_path, bank_catalog):
    """`load_policy(rehearse_adapter=...)`: act turns as the act adapter alone writes them, rehearsals as the
    rehearse adapter alone writes them, each in the prompt format its own envace.json names."""
    from helpers import random_lora

    from envace_mcp.policy import RolePolicies

    random_lora(tiny_qwen3_dir, tmp_path / "agent", 0, ("compact", "inline"))
    random_lora(tiny_qwen3_dir, tmp_path / "world", 1, ("json", "simulator"))
    with pytest.raises(UserError, match="has no report"):  # one rule in every entry point: a world model must be measured
        load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "agent"), rehearse_adapter=str(tmp_path / "world"))
    both = load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "agent"), rehearse_adapter=str(tmp_path / "world"),
                       unmeasured=True)  # research: the explicit opt-in
    agent = load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "agent"))
    world = load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "world"))
    assert isinstance(both, RolePolicies) and (both.tool_format, both.rehearse_format) == ("compact", "simulator")
    greedy = SamplingParams(max_new_tokens=6, temperature=0)
    act = ActRequest(task="What is the balance of CHK-1?", tools=bank_catalog)
    rehearse = RehearseRequest(call=ToolCall(id="c", name="get_balance", arguments={"account_id": "CHK-1"}),
                               tool=bank_catalog[1], allowed=bank_catalog)
    mine, alone = await both.act(act, greedy), await agent.act(act, greedy)
    assert (mine.prompt_ids, mine.completion_ids, mine.logprobs) == (alone.prompt_ids, alone.completion_ids, alone.logprobs)
    mine, alone, other = [await p.rehearse(rehearse, greedy) for p in (both, world, agent)]
    assert (mine.prompt_ids, mine.completion_ids, mine.logprobs) == (alone.prompt_ids, alone.completion_ids, alone.logprobs)
    assert mine.prompt_format == "simulator" and other.prompt_format == "inline"

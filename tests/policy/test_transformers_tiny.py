"""The transformers backend on a tiny random Qwen3 built offline: the Qwen3 path, exact tokens and
logprobs, batching, seeds, adapters. Plumbing only; accuracy claims belong to the real model."""

import threading

import anyio
import numpy
import pytest
import torch
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from envace_mcp.policy import ActRequest, RehearseRequest, SamplingParams, ToolCall, load_policy
from envace_mcp.policy.prompts import render_act
from envace_mcp.policy.transformers_backend import TransformersPolicy

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
    before = len(policy.batcher.batch_sizes)
    results = {}

    async def one(i):
        request = RehearseRequest(call=call, tool=bank_catalog[1], allowed=bank_catalog,
                                  history=[HumanMessage(content=f"request number {i} " * (i + 1))])
        results[i] = await policy.rehearse(request, SamplingParams(max_new_tokens=6 + i, seed=i, temperature=0.8))

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
    assert policy.batcher.batch_sizes[before:] == [6]
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
        assert len(one.completion_ids) == 10 and one.completion_ids[-1] not in policy.eos_ids
    else:
        assert one.finish_reason == "stop" and one.completion_ids[-1] in policy.eos_ids and len(one.completion_ids) <= 10


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


async def test_generation_runs_on_merged_lora_weights_and_leaves_the_adapter_trainable(tiny_qwen3_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from envace_mcp.policy.transformers_backend import _Job, _merged_lora

    torch.manual_seed(0)
    for name, dora in (("plain", False), ("dora", True)):
        base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir)
        config = LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False,
                            use_dora=dora)
        get_peft_model(base, config).save_pretrained(tmp_path / name)
    policy = load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "plain"))
    model = policy.model
    ids = torch.tensor([policy.encode("merge me, then train me")])
    for n, p in model.named_parameters():  # as a trainer would have it (loaded adapters come frozen)
        p.requires_grad_("lora_" in n)
    params = dict(model.named_parameters())
    with torch.no_grad():
        before = model(input_ids=ids).logits
        with _merged_lora(model) as merged:
            assert merged
            during = model(input_ids=ids).logits
            assert all("forward" in m.__dict__ for m in model.modules() if hasattr(m, "lora_A"))
            other: dict = {}  # a training step starting while a stream's worker thread winds down
            thread = threading.Thread(target=lambda: other.update(out=model(input_ids=ids).logits))
            thread.start()
            thread.join()
            assert other["out"].requires_grad  # (grad mode is per thread)
        after = model(input_ids=ids).logits
    assert torch.equal(before, after) and torch.allclose(before, during, atol=1e-4)
    assert torch.equal(before, other["out"].detach())  # other threads never see the merge: peft's path, own weights
    assert not torch.equal(before, during)  # really the merged copies, not the same path
    assert dict(model.named_parameters()) == params  # the very same parameter objects back
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [n for n in params if "lora_" in n]
    assert all("forward" not in m.__dict__ for m in model.modules() if hasattr(m, "lora_A"))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()  # the adapter still trains
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)
    model.eval()
    jobs = [_Job(policy.encode(policy.render([{"role": "user", "content": "word " * (i + 3)}], None)),
                 SamplingParams(max_new_tokens=10, temperature=0.9), seed=i) for i in range(3)]
    merged_runs = policy.generate_batch(jobs)
    policy.merge_lora = False
    separate = policy.generate_batch(jobs)
    for a, b in zip(merged_runs, separate):
        assert a.completion_ids == b.completion_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    policy.merge_lora = True
    with torch.no_grad():  # an optimizer step on the adapter: the next generation samples from it
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5 * torch.randn_like(p))
    updated = policy.generate_batch(jobs)  # (the prefix cache's keys/values from the old weights are dropped)
    for job, old, new in zip(jobs, merged_runs, updated):
        fresh = policy.score(job.prompt_ids, new.completion_ids, temperature=0.9)  # the adapter path, no merge
        assert max(abs(x - y) for x, y in zip(fresh, new.logprobs)) < 1e-4
        stale = policy.score(job.prompt_ids, old.completion_ids, temperature=0.9)
        assert max(abs(x - y) for x, y in zip(stale, old.logprobs)) > 1e-3  # the weights really moved
    dora = load_policy(str(tiny_qwen3_dir), adapter=str(tmp_path / "dora"))
    with _merged_lora(dora.model) as merged:
        assert not merged  # not a plain merge: generates through peft as before


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
    reused_before = policy.prefill_stats["reused_tokens"]
    other = ToolCall(id="d", name="get_quote", arguments={"symbol": "ACME"})
    second = await policy.rehearse(RehearseRequest(call=other, tool=bank_catalog[2], allowed=bank_catalog), SHORT)
    reused = policy.prefill_stats["reused_tokens"] - reused_before
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


def test_finished_rows_leave_the_decode_batch_and_the_rest_decode_as_if_alone(policy):
    from envace_mcp.policy.transformers_backend import _Job

    prompts = [policy.encode(policy.render([{"role": "user", "content": "word " * (3 * i + 1)}], None))
               for i in range(6)]
    jobs = [_Job(ids, SamplingParams(max_new_tokens=3 + 5 * i, temperature=0.9, stop=()), seed=i)
            for i, ids in enumerate(prompts)]
    widths: list[int] = []
    hook = policy.model.register_forward_pre_hook(
        lambda _m, _a, kw: widths.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        together = policy.generate_batch(jobs)
    finally:
        hook.remove()
    decode = [w for w in widths if w > 0][len(jobs):]  # after the one-prompt-at-a-time prefills
    assert decode[0] == 6 and decode[-1] < 6 and decode == sorted(decode, reverse=True)
    for job, got in zip(jobs, together):
        alone = policy.generate_batch([job])[0]
        assert got.completion_ids == alone.completion_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs)) < 1e-4
        fresh = policy.score(job.prompt_ids, got.completion_ids, temperature=0.9)
        assert max(abs(a - b) for a, b in zip(fresh, got.logprobs)) < 1e-4


def test_a_kv_budget_makes_requests_wait_for_room_and_they_still_decode_as_if_alone(policy, monkeypatch):
    from envace_mcp.policy.transformers_backend import _Job

    prompts = [policy.encode(policy.render([{"role": "user", "content": "word " * (3 * i + 1)}], None))
               for i in range(6)]
    jobs = [_Job(ids, SamplingParams(max_new_tokens=3 + 5 * i, temperature=0.9, stop=()), seed=i)
            for i, ids in enumerate(prompts)]
    longest = max(len(ids) for ids in prompts) + 28
    budget = 2 * longest + 10  # key/value slots for about two rows at a time
    config = policy.model.config
    slot = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 4  # bytes, fp32
    widths: list[int] = []
    hook = policy.model.register_forward_pre_hook(
        lambda _m, _a, kw: widths.append(kw["input_ids"].shape[0]), with_kwargs=True)
    monkeypatch.setattr(policy, "kv_budget_gb", (budget + 0.5) * slot / 2**30)
    monkeypatch.setattr(policy, "kv_peak_slots", 0)
    waits = policy.prefill_stats["kv_waits"]
    try:
        together = policy.generate_batch(jobs)
    finally:
        hook.remove()
    assert policy.prefill_stats["kv_waits"] > waits
    assert 0 < policy.kv_peak_slots <= budget  # the buffers' slack stays inside the budget too
    assert max(widths) in (2, 3)  # never all six rows (without the budget the batch decodes six: test above)
    for job, got in zip(jobs, together):  # every request came back, as it would alone
        alone = policy.generate_batch([job])[0]
        assert got.completion_ids == alone.completion_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs)) < 1e-4
    monkeypatch.setattr(policy, "kv_budget_gb", 1e-9)  # smaller than any one row: one row at a time, no deadlock
    assert [r.completion_ids for r in policy.generate_batch(jobs[:3])] == [r.completion_ids for r in together[:3]]


def test_the_kv_budget_counts_shared_prefixes_and_the_columns_a_shortened_group_adds(policy, monkeypatch):
    from envace_mcp.policy.transformers_backend import _DecodeBatch, _Job

    held = []
    original = _DecodeBatch.step

    def spy(batch, tokens, positions):  # slots before and after every step (make_room and shortening included)
        held.append(batch.slots())
        out = original(batch, tokens, positions)
        held.append(batch.slots())
        return out

    monkeypatch.setattr(_DecodeBatch, "step", spy)
    bank = "You are a careful bank assistant. Check every account before you move money. " * 6

    def job(system_text, question, seed, new=10):
        chat = [{"role": "system", "content": system_text}, {"role": "user", "content": question}]
        return _Job(policy.encode(policy.render(chat, None)), SamplingParams(max_new_tokens=new, temperature=0.9),
                    seed=seed)

    jobs = [job(bank, "balance of CHK-1?", 1, 40), job(bank, "move 5 from SAV-2 to CHK-1 " * 3, 2, 40),
            job(bank[:-40] + "Be brief.", "list accounts", 3),  # shares less: shortens the group
            job(bank, "close SAV-9", 4), job(bank, "list my cards " * 2, 5), job(bank, "who am I?", 6)]
    prefix = min(len(j.prompt_ids) for j in jobs) - 20  # about what the rows share
    shop = "You sell shoes and socks. Answer in one short line, and never promise a delivery date. " * 4
    jobs += [job(shop, "red socks?", 7), job(shop, "size 44 boots", 8)]  # a second group, after rows have left
    budget = prefix + 3 * 60  # the shared prompt once and about three rows' own columns
    config = policy.model.config
    slot = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 4  # bytes, fp32
    monkeypatch.setattr(policy, "kv_budget_gb", (budget + 0.5) * slot / 2**30)
    before = dict(policy.prefill_stats)
    together = policy.generate_batch(jobs)
    assert policy.prefill_stats["grouped_rows"] > before["grouped_rows"]  # rows did share the prefix
    assert policy.prefill_stats["kv_waits"] > before["kv_waits"]
    assert max(held) <= budget  # the buffers and the shared prefixes together, at every step
    for j, got in zip(jobs, together):
        alone = policy.generate_batch([j])[0]
        assert got.completion_ids == alone.completion_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs)) < 1e-4
    # admission's estimate is what making room then takes: new groups, joins, the shortened group
    cpu = torch.device("cpu")
    batch = _DecodeBatch(policy.model, policy._cache_kw, cpu, 8, joinable=True, shared_prefix=True)
    with torch.inference_mode():
        for number, j in enumerate(jobs):
            if batch.rows == 2:
                batch.remove(0)  # a row leaves; its buffer row stays until the buffers change
            remaining = [10] * batch.rows
            estimate = batch.slots_with(j.prompt_ids, 10, remaining)
            shape, area = batch.mask.shape, batch.mask.numel()
            group = batch.make_room([j.prompt_ids], [10], remaining)[0]
            regrown = batch.mask.shape != shape or not batch.keys  # (the first row's buffers come with it)
            assert estimate == (batch.wanted[0] * batch.wanted[1] if regrown else area) + batch._prefix_slots(), number
            batch.place(policy._prefill(j.prompt_ids, cpu)[0], group)
        # rows that left give their buffer rows back when a newcomer needs them
        batch = _DecodeBatch(policy.model, policy._cache_kw, cpu, 8, joinable=True, shared_prefix=True)
        for j in jobs[:4]:
            batch.place(policy._prefill(j.prompt_ids, cpu)[0], batch.make_room([j.prompt_ids], [10], [10] * batch.rows)[0])
        for _ in range(3):
            batch.remove(0)
        newcomer = jobs[-1].prompt_ids  # another prompt: a new group
        batch.budget = batch.slots_with(newcomer, 10, [10], trimmed=True)
        assert batch.mask.shape[0] == 4 and batch.slots_with(newcomer, 10, [10]) > batch.budget
        assert batch.fits(newcomer, 10, [10]) and batch.mask.shape[0] == 1  # the three dead rows went
        batch.place(policy._prefill(newcomer, cpu)[0], batch.make_room([newcomer], [10], [10])[0])
        assert batch.rows == 2 and batch.slots() <= batch.budget


def test_prefix_cache_keeps_alive_only_the_tokens_it_counts():
    from envace_mcp.policy.transformers_backend import PrefixCache

    def prefilled(ids):  # two layers of keys/values (1, 1 head, tokens, 2) that spell out the ids
        kv = torch.tensor(ids, dtype=torch.float32).view(1, 1, -1, 1).expand(1, 1, len(ids), 2)
        return [(kv.clone(), -kv.clone()) for _ in range(2)]

    cache = PrefixCache(max_tokens=400)
    system = list(range(100))
    for turn in range(8):  # act turns: the history grows, the last message (the memory) changes every turn
        ids = system + [1000 + j for j in range(20 * turn)] + [5000 + 100 * turn + j for j in range(30)]
        reused, _, source = cache.lookup(ids)
        assert reused == (100 + 20 * (turn - 1) if turn else 0)  # up to the previous turn's memory message
        cache.store(ids, prefilled(ids), reused, source)
    assert 1 < len(cache.entries) < 8  # the oldest turns were dropped to stay within 400 tokens
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for entry in cache.entries for piece, _, _ in entry.pieces for layer in piece for t in layer}
    assert sum(storages.values()) == cache.held_tokens() * 2 * 2 * 2 * 4  # layers x (k, v) x 2 floats x 4 bytes
    assert cache.held_tokens() <= 400
    for entry in cache.entries:  # and every entry still gives back its own keys/values
        reused, kv, _ = cache.lookup(entry.ids + [7])
        assert reused == len(entry.ids) and torch.equal(kv[1][0], prefilled(entry.ids)[1][0])


def test_one_token_steps_use_packed_attention_that_equals_sdpa(tiny_qwen3_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from envace_mcp.policy._decode_attention import NAME

    policy = load_policy(str(tiny_qwen3_dir))
    assert policy.decode_attention and policy.model.config._attn_implementation == NAME
    plain = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, attn_implementation="sdpa").eval()
    assert plain.config.num_key_value_heads < plain.config.num_attention_heads  # grouped-query heads
    torch.manual_seed(0)
    ids = torch.randint(0, plain.config.vocab_size, (3, 9))
    pad = torch.ones_like(ids)
    pad[1, :4] = 0  # one left-padded row: the masked case; the others alone: the unmasked case
    for mask in (None, pad):
        with torch.inference_mode():
            steps = []
            for model in (plain, policy.model):
                out = model(input_ids=ids[:, :-1], attention_mask=None if mask is None else mask[:, :-1], use_cache=True)
                step = model(input_ids=ids[:, -1:], attention_mask=mask, cache=out.past_key_values, use_cache=True)
                steps.append(step.logits)
        assert torch.allclose(steps[0], steps[1], atol=1e-5)
    policy.model.save_pretrained(tmp_path / "saved")
    assert NAME not in (tmp_path / "saved" / "config.json").read_text()


class ScriptedFeed:
    """Jobs that arrive at given decode steps (take calls), results recorded in delivery order."""

    def __init__(self, arrivals):
        self.arrivals, self.calls, self.delivered, self.live_when_taken = arrivals, 0, [], []

    def take(self, n):
        self.calls += 1
        jobs = self.arrivals.get(self.calls, [])[:n]
        self.live_when_taken += [(job, [d for d, _ in self.delivered]) for job, _ in jobs]
        return jobs

    def rows(self, n):
        pass

    def deliver(self, ticket, result):
        self.delivered.append((ticket, result))

    def fail(self, ticket, exc):
        raise AssertionError(f"job {ticket} failed: {exc}")


@pytest.mark.parametrize("compact_from", [256, 1])
def test_jobs_that_arrive_mid_decode_join_the_batch_and_decode_as_if_alone(policy, compact_from, monkeypatch):
    from envace_mcp.policy.transformers_backend import _DecodeBatch, _Job

    monkeypatch.setattr(_DecodeBatch, "compact_from", compact_from)  # 1: drop unused columns at every chance
    compactions = []
    original = _DecodeBatch._compact

    def spy(batch):
        before = batch.seen
        original(batch)
        if batch.rows and batch.seen < before:
            compactions.append((before, batch.seen))

    monkeypatch.setattr(_DecodeBatch, "_compact", spy)

    def job(words, new, seed):
        ids = policy.encode(policy.render([{"role": "user", "content": "word " * words}], None))
        return _Job(ids, SamplingParams(max_new_tokens=new, temperature=0.9), seed=seed)

    first, shorter, longer, late = job(30, 6, 1), job(1, 20, 2), job(60, 4, 3), job(2, 5, 4)
    # step 3: a short prompt (left-padded) and one longer than every column so far (the others skip
    # the gap); `first` then leaves, so the short one's padding can be dropped; step 12: one more
    feed = ScriptedFeed({1: [(first, "first")], 3: [(shorter, "shorter"), (longer, "longer")], 12: [(late, "late")]})
    peak = policy.stream(feed, max_rows=8)
    got = dict(feed.delivered)
    assert peak == 3 and set(got) == {"first", "shorter", "longer", "late"}
    assert [sorted(done) for _, done in feed.live_when_taken][1:] == [[], [], ["first", "longer"]]
    assert bool(compactions) == (compact_from == 1)
    for name, j in [("first", first), ("shorter", shorter), ("longer", longer), ("late", late)]:
        alone = policy.generate_batch([j])[0]
        assert got[name].completion_ids == alone.completion_ids, name
        assert max(abs(a - b) for a, b in zip(got[name].logprobs, alone.logprobs)) < 1e-4
        fresh = policy.score(j.prompt_ids, got[name].completion_ids, temperature=0.9)
        assert max(abs(a - b) for a, b in zip(fresh, got[name].logprobs)) < 1e-4


def test_rows_sharing_a_prompt_prefix_decode_over_one_copy_of_it(policy, monkeypatch):
    from envace_mcp.policy.transformers_backend import _common_prefix, _DecodeBatch, _Job

    steps = []
    original = _DecodeBatch.step

    def spy(batch, tokens, positions):
        groups = {id(g): len(g.ids) for g in batch.row_groups if g is not None}
        steps.append((sorted(groups.values()), batch.seen, batch.rows))
        return original(batch, tokens, positions)

    monkeypatch.setattr(_DecodeBatch, "step", spy)
    bank = "You are a careful bank assistant. Check every account before you move money. " * 6
    shop = "You sell shoes and socks. Answer in one short line, and never promise a delivery date. " * 4

    def job(system_text, question, new, seed):
        chat = [{"role": "system", "content": system_text}, {"role": "user", "content": question}]
        return _Job(policy.encode(policy.render(chat, None)), SamplingParams(max_new_tokens=new, temperature=0.9),
                    seed=seed)

    jobs = {"a": job(bank, "balance of CHK-1?", 14, 1), "b": job(bank, "move 5 from SAV-2 to CHK-1 " * 3, 12, 2),
            "c": job(bank[:-40] + "Be brief.", "list accounts", 10, 3),  # step 3: shares less of the prompt
            "d": job(shop, "red socks?", 8, 4), "e": job(shop, "size 44 boots", 8, 5)}  # step 6: another prompt
    feed = ScriptedFeed({1: [(jobs["a"], "a"), (jobs["b"], "b")], 3: [(jobs["c"], "c")],
                         6: [(jobs["d"], "d"), (jobs["e"], "e")]})
    policy.stream(feed, max_rows=8)
    got = dict(feed.delivered)

    def common(x, y):
        return _common_prefix(jobs[x].prompt_ids, jobs[y].prompt_ids, limit=10**9)

    ab, ac, de = common("a", "b"), common("a", "c"), common("d", "e")
    assert 100 < ac < ab and de > 100 and common("a", "d") < 64
    # held once per group, the rows' columns start after it; `c` shortens the bank group for its rows
    assert [groups for groups, _, _ in steps[:6]] == [[ab], [ab], [ac], [ac], [ac], sorted([ac, de])]
    assert [rows for _, _, rows in steps[:6]] == [2, 2, 3, 3, 3, 5]
    assert steps[0][1] == max(len(jobs["a"].prompt_ids), len(jobs["b"].prompt_ids)) - ab
    policy.share_prefix = False
    try:
        for name, j in jobs.items():
            alone = policy.generate_batch([j])[0]  # every row its own copy
            assert got[name].completion_ids == alone.completion_ids, name
            assert max(abs(a - b) for a, b in zip(got[name].logprobs, alone.logprobs)) < 1e-4
            fresh = policy.score(j.prompt_ids, got[name].completion_ids, temperature=0.9)
            assert max(abs(a - b) for a, b in zip(fresh, got[name].logprobs)) < 1e-4
    finally:
        policy.share_prefix = True


def test_a_row_left_alone_takes_its_prefix_back_and_later_rows_share_again(policy, monkeypatch):
    from envace_mcp.policy.transformers_backend import _DecodeBatch, _Job

    steps = []
    original = _DecodeBatch.step

    def spy(batch, tokens, positions):
        out = original(batch, tokens, positions)
        steps.append((batch.rows, [len(g.ids) for g in batch.groups], [g is not None for g in batch.row_groups]))
        return out

    monkeypatch.setattr(_DecodeBatch, "step", spy)
    system = "You are a careful bank assistant. Check every account before you move money. " * 6

    def job(question, new, seed):
        chat = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return _Job(policy.encode(policy.render(chat, None)), SamplingParams(max_new_tokens=new, temperature=0.9),
                    seed=seed)

    jobs = {"a": job("balance of CHK-1?", 12, 1), "b": job("list accounts", 10, 2), "c": job("move 5 to SAV-2", 6, 3)}
    # `a` alone for three steps, then `b` and `c` arrive together and share a prefix between them
    feed = ScriptedFeed({1: [(jobs["a"], "a")], 4: [(jobs["b"], "b"), (jobs["c"], "c")]})
    policy.stream(feed, max_rows=8)
    got = dict(feed.delivered)
    assert steps[0] == (1, [], [False])  # alone: its prefix went back into its own columns
    assert steps[3][0] == 3 and len(steps[3][1]) == 1 and steps[3][1][0] > 100 and steps[3][2] == [False, True, True]
    policy.share_prefix = False
    try:
        for name, j in jobs.items():
            alone = policy.generate_batch([j])[0]
            assert got[name].completion_ids == alone.completion_ids, name
            fresh = policy.score(j.prompt_ids, got[name].completion_ids, temperature=0.9)
            assert max(abs(a - b) for a, b in zip(fresh, got[name].logprobs)) < 1e-4
    finally:
        policy.share_prefix = True


@pytest.mark.parametrize("masked", [False, True])
def test_attention_split_over_shared_prefixes_equals_attention_over_the_whole(masked):
    import torch.nn.functional as F

    from envace_mcp.policy._decode_attention import SharedPrefixes

    torch.manual_seed(0)
    rows, kv_heads, group, dim, own = 5, 2, 3, 16, 9

    def prefix(n):
        return [(torch.randn(1, kv_heads, n, dim), torch.randn(1, kv_heads, n, dim))]

    # rows 0, 3 share a 40-token prefix, rows 1, 4 a 25-token one; row 2 holds its whole prompt
    prefixes = SharedPrefixes([(torch.tensor([0, 3]), prefix(40)), (torch.tensor([4, 1]), prefix(25))])
    query = torch.randn(rows, kv_heads, group, dim)
    keys, values = torch.randn(rows, kv_heads, own, dim), torch.randn(rows, kv_heads, own, dim)
    mask = None
    if masked:  # left padding of different widths; every row keeps at least its newest column
        mask = (torch.arange(own)[None, :] >= torch.tensor([0, 3, 8, 1, 5])[:, None])[:, None, None, :]
    got = prefixes.attend(0, query, keys, values, mask, scale=0.3)
    assert got.shape == (rows, 1, kv_heads * group, dim)
    for row in range(rows):  # each row alone: its prefix (if any) and its own unmasked columns
        ks, vs = keys[row : row + 1], values[row : row + 1]
        if mask is not None:
            ks, vs = ks[:, :, mask[row, 0, 0]], vs[:, :, mask[row, 0, 0]]
        for slots, layers in prefixes.groups:
            if row in slots.tolist():
                ks, vs = torch.cat([layers[0][0], ks], dim=2), torch.cat([layers[0][1], vs], dim=2)
        want = F.scaled_dot_product_attention(query[row : row + 1], ks, vs, scale=0.3)
        assert torch.allclose(got[row], want.reshape(1, kv_heads * group, dim), atol=1e-5), row
    whole_k, whole_v, whole_mask = prefixes.prepend(0, keys, values, mask)  # the fallback layout agrees
    padded = F.scaled_dot_product_attention(query, whole_k, whole_v, attn_mask=whole_mask, scale=0.3)
    assert torch.allclose(got, padded.reshape(rows, 1, kv_heads * group, dim), atol=1e-5)


async def test_prompts_sharing_a_prefix_hold_its_keys_and_values_once(tiny_qwen3_dir, bank_catalog):
    policy = load_policy(str(tiny_qwen3_dir))
    call = ToolCall(id="c", name="get_balance", arguments={"account_id": "CHK-1"})
    gens = []
    for i in range(4):  # one task's rehearsals: system prompt and tools shared, the history differs
        request = RehearseRequest(call=call, tool=bank_catalog[1], allowed=bank_catalog,
                                  history=[HumanMessage(content=f"run {i}: " + "what is my balance? " * (i + 1))])
        gens.append(await policy.rehearse(request, SHORT))
    cache = policy.prefix_cache
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


def test_a_sliding_window_model_decodes_batches_through_the_library_cache(tiny_qwen3_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.policy.transformers_backend import _Job

    config = AutoConfig.from_pretrained(tiny_qwen3_dir)
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, 16, 1
    config.layer_types = None  # re-derived from the switches above
    config = type(config)(**config.to_dict())
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "sliding")
    AutoTokenizer.from_pretrained(tiny_qwen3_dir).save_pretrained(tmp_path / "sliding")
    policy = load_policy(str(tmp_path / "sliding"))
    assert not policy.plain_cache
    jobs = [_Job(policy.encode(policy.render([{"role": "user", "content": "word " * (5 * i + 1)}], None)),
                 SamplingParams(max_new_tokens=20 - 4 * i, temperature=0.9), seed=i) for i in range(3)]
    together = policy.generate_batch(jobs)
    assert min(len(j.prompt_ids) for j in jobs) > 16  # past the window
    for job, got in zip(jobs, together):
        alone = policy.generate_batch([job])[0]
        assert got.completion_ids == alone.completion_ids
        fresh = policy.score(job.prompt_ids, got.completion_ids, temperature=0.9)
        assert max(abs(a - b) for a, b in zip(fresh, got.logprobs)) < 1e-4


async def test_a_job_that_cannot_be_generated_fails_alone_and_its_batch_mates_finish(policy):
    from envace_mcp.errors import UserError
    from envace_mcp.policy.transformers_backend import _Job

    good = [_Job(policy.encode(policy.render([{"role": "user", "content": f"hello {i}"}], None)),
                 SamplingParams(max_new_tokens=5, temperature=0.9), seed=i) for i in range(2)]
    outcomes = {}

    async def one(name, job):
        try:
            outcomes[name] = await policy.batcher.submit(job)
        except UserError as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "a", good[0])
        tg.start_soon(one, "empty", _Job([], SamplingParams(max_new_tokens=5), seed=9))
        tg.start_soon(one, "b", good[1])
    assert isinstance(outcomes["empty"], UserError) and "empty prompt" in str(outcomes["empty"])
    for name, job in (("a", good[0]), ("b", good[1])):
        assert outcomes[name].completion_ids == policy.generate_batch([job])[0].completion_ids


def test_sampling_follows_the_distribution_and_never_picks_a_filtered_token():
    from envace_mcp.policy.transformers_backend import _sample

    generator = numpy.random.default_rng(0)
    logits = torch.tensor([0.0, 1.0, float("-inf"), 2.0, 0.5, -1.0])
    want = torch.softmax(logits, dim=-1)
    draws = [_sample(logits, SamplingParams(temperature=1.0), generator) for _ in range(20000)]
    counts = torch.bincount(torch.tensor([token for token, _ in draws]), minlength=6) / len(draws)
    assert counts[2] == 0 and torch.allclose(counts, want, atol=0.01)
    assert all(abs(lp - float(torch.log(want[token]))) < 1e-5 for token, lp in draws[:50])
    top2 = {_sample(logits, SamplingParams(temperature=1.0, top_k=2), generator)[0] for _ in range(500)}
    assert top2 == {1, 3}
    cool = [_sample(logits, SamplingParams(temperature=0.25), generator)[0] for _ in range(2000)]
    assert cool.count(3) / len(cool) > 0.95  # temperature sharpens toward the top token

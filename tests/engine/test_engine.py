"""The engine on a tiny Qwen3: continuous batching, the KV budget, shared prefixes, the prefix cache,
packed attention and sampling, each row decoding exactly as it would alone. Public API only."""

import anyio
import numpy
import pytest
import torch

from envace_mcp.engine import Engine, Job, SamplingParams, load_model
from envace_mcp.engine.attention import NAME, SharedPrefixes
from envace_mcp.engine.batch import DecodeBatch
from envace_mcp.engine.prefix_cache import PrefixCache, common_prefix
from envace_mcp.engine.sampling import sample

pytestmark = pytest.mark.anyio


def prompt(engine, chat):
    """Token ids of a chat in the model's own template (the policy's renderer is not the point here)."""
    text = engine.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    return list(engine.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_finished_rows_leave_the_decode_batch_and_the_rest_decode_as_if_alone(engine):

    prompts = [prompt(engine, [{"role": "user", "content": "word " * (3 * i + 1)}])
               for i in range(6)]
    jobs = [Job(ids, SamplingParams(max_new_tokens=3 + 5 * i, temperature=0.9, stop=()), seed=i)
            for i, ids in enumerate(prompts)]
    widths: list[int] = []
    hook = engine.model.register_forward_pre_hook(
        lambda _m, _a, kw: widths.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        together = engine.generate(jobs)
    finally:
        hook.remove()
    decode = [w for w in widths if w > 0][len(jobs):]  # after the one-prompt-at-a-time prefills
    assert decode[0] == 6 and decode[-1] < 6 and decode == sorted(decode, reverse=True)
    for job, got in zip(jobs, together):
        alone = engine.generate([job])[0]
        assert got.completion_ids == alone.completion_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs)) < 1e-4
        fresh = engine.score(job.prompt_ids, got.completion_ids, temperature=0.9)
        assert max(abs(a - b) for a, b in zip(fresh, got.logprobs)) < 1e-4


def test_a_kv_budget_makes_requests_wait_for_room_and_they_still_decode_as_if_alone(engine, monkeypatch):

    prompts = [prompt(engine, [{"role": "user", "content": "word " * (3 * i + 1)}])
               for i in range(6)]
    jobs = [Job(ids, SamplingParams(max_new_tokens=3 + 5 * i, temperature=0.9, stop=()), seed=i)
            for i, ids in enumerate(prompts)]
    longest = max(len(ids) for ids in prompts) + 28
    budget = 2 * longest + 10  # key/value slots for about two rows at a time
    config = engine.model.config
    slot = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 4  # bytes, fp32
    widths: list[int] = []
    hook = engine.model.register_forward_pre_hook(
        lambda _m, _a, kw: widths.append(kw["input_ids"].shape[0]), with_kwargs=True)
    monkeypatch.setattr(engine, "kv_budget_gb", (budget + 0.5) * slot / 2**30)
    monkeypatch.setattr(engine, "kv_peak_slots", 0)
    waits = engine.stats["kv_waits"]
    try:
        together = engine.generate(jobs)
    finally:
        hook.remove()
    assert engine.stats["kv_waits"] > waits
    assert 0 < engine.kv_peak_slots <= budget  # the buffers' slack stays inside the budget too
    assert max(widths) in (2, 3)  # never all six rows (without the budget the batch decodes six: test above)
    for job, got in zip(jobs, together):  # every request came back, as it would alone
        alone = engine.generate([job])[0]
        assert got.completion_ids == alone.completion_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs)) < 1e-4
    monkeypatch.setattr(engine, "kv_budget_gb", 1e-9)  # smaller than any one row: one row at a time, no deadlock
    assert [r.completion_ids for r in engine.generate(jobs[:3])] == [r.completion_ids for r in together[:3]]


def test_the_kv_budget_counts_shared_prefixes_and_the_columns_a_shortened_group_adds(engine, monkeypatch):

    held = []
    original = DecodeBatch.step

    def spy(batch, tokens, positions):  # slots before and after every step (make_room and shortening included)
        held.append(batch.slots())
        out = original(batch, tokens, positions)
        held.append(batch.slots())
        return out

    monkeypatch.setattr(DecodeBatch, "step", spy)
    bank = "You are a careful bank assistant. Check every account before you move money. " * 6

    def job(system_text, question, seed, new=10):
        chat = [{"role": "system", "content": system_text}, {"role": "user", "content": question}]
        return Job(prompt(engine, chat), SamplingParams(max_new_tokens=new, temperature=0.9),
                    seed=seed)

    jobs = [job(bank, "balance of CHK-1?", 1, 40), job(bank, "move 5 from SAV-2 to CHK-1 " * 3, 2, 40),
            job(bank[:-40] + "Be brief.", "list accounts", 3),  # shares less: shortens the group
            job(bank, "close SAV-9", 4), job(bank, "list my cards " * 2, 5), job(bank, "who am I?", 6)]
    prefix = min(len(j.prompt_ids) for j in jobs) - 20  # about what the rows share
    shop = "You sell shoes and socks. Answer in one short line, and never promise a delivery date. " * 4
    jobs += [job(shop, "red socks?", 7), job(shop, "size 44 boots", 8)]  # a second group, after rows have left
    budget = prefix + 3 * 60  # the shared prompt once and about three rows' own columns
    config = engine.model.config
    slot = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 4  # bytes, fp32
    monkeypatch.setattr(engine, "kv_budget_gb", (budget + 0.5) * slot / 2**30)
    before = dict(engine.stats)
    together = engine.generate(jobs)
    assert engine.stats["grouped_rows"] > before["grouped_rows"]  # rows did share the prefix
    assert engine.stats["kv_waits"] > before["kv_waits"]
    assert max(held) <= budget  # the buffers and the shared prefixes together, at every step
    for j, got in zip(jobs, together):
        alone = engine.generate([j])[0]
        assert got.completion_ids == alone.completion_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs)) < 1e-4
    # admission's estimate is what making room then takes: new groups, joins, the shortened group
    cpu = torch.device("cpu")
    batch = DecodeBatch(engine.model, engine.cache_kw, cpu, 8, joinable=True, shared_prefix=True)
    with torch.inference_mode():
        for number, j in enumerate(jobs):
            if batch.rows == 2:
                batch.remove(0)  # a row leaves; its buffer row stays until the buffers change
            remaining = [10] * batch.rows
            estimate = batch.slots_with(j.prompt_ids, 10, remaining)
            shape, area = batch.mask.shape, batch.mask.numel()
            group = batch.make_room([j.prompt_ids], [10], remaining)[0]
            regrown = batch.mask.shape != shape or not batch.keys  # (the first row's buffers come with it)
            assert estimate == (batch.wanted[0] * batch.wanted[1] if regrown else area) + batch.prefix_slots(), number
            batch.place(engine.prefill(j.prompt_ids, cpu)[0], group)
        # rows that left give their buffer rows back when a newcomer needs them
        batch = DecodeBatch(engine.model, engine.cache_kw, cpu, 8, joinable=True, shared_prefix=True)
        for j in jobs[:4]:
            batch.place(engine.prefill(j.prompt_ids, cpu)[0], batch.make_room([j.prompt_ids], [10], [10] * batch.rows)[0])
        for _ in range(3):
            batch.remove(0)
        newcomer = jobs[-1].prompt_ids  # another prompt: a new group
        batch.budget = batch.slots_with(newcomer, 10, [10], trimmed=True)
        assert batch.mask.shape[0] == 4 and batch.slots_with(newcomer, 10, [10]) > batch.budget
        assert batch.fits(newcomer, 10, [10]) and batch.mask.shape[0] == 1  # the three dead rows went
        batch.place(engine.prefill(newcomer, cpu)[0], batch.make_room([newcomer], [10], [10])[0])
        assert batch.rows == 2 and batch.slots() <= batch.budget


def test_prefix_cache_keeps_alive_only_the_tokens_it_counts():

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

    engine = Engine(*load_model(str(tiny_qwen3_dir)))
    assert engine.decode_attention and engine.model.config._attn_implementation == NAME
    plain = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, attn_implementation="sdpa").eval()
    assert plain.config.num_key_value_heads < plain.config.num_attention_heads  # grouped-query heads
    torch.manual_seed(0)
    ids = torch.randint(0, plain.config.vocab_size, (3, 9))
    pad = torch.ones_like(ids)
    pad[1, :4] = 0  # one left-padded row: the masked case; the others alone: the unmasked case
    for mask in (None, pad):
        with torch.inference_mode():
            steps = []
            for model in (plain, engine.model):
                out = model(input_ids=ids[:, :-1], attention_mask=None if mask is None else mask[:, :-1], use_cache=True)
                step = model(input_ids=ids[:, -1:], attention_mask=mask, cache=out.past_key_values, use_cache=True)
                steps.append(step.logits)
        assert torch.allclose(steps[0], steps[1], atol=1e-5)
    engine.model.save_pretrained(tmp_path / "saved")
    assert NAME not in (tmp_path / "saved" / "config.json").read_text()


class ScriptedFeed:
    """Jobs that arrive at given decode steps (take calls), results recorded in delivery order."""

    def __init__(self, arrivals, gives_up=None):
        self.arrivals, self.calls, self.delivered, self.live_when_taken = arrivals, 0, [], []
        self.gives_up = gives_up or {}  # ticket -> the take call from which its caller no longer waits

    def wanted(self, ticket):
        return self.calls < self.gives_up.get(ticket, float("inf"))

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
def test_jobs_that_arrive_mid_decode_join_the_batch_and_decode_as_if_alone(engine, compact_from, monkeypatch):

    monkeypatch.setattr(DecodeBatch, "compact_from", compact_from)  # 1: drop unused columns at every chance
    compactions = []
    original = DecodeBatch._compact

    def spy(batch):
        before = batch.seen
        original(batch)
        if batch.rows and batch.seen < before:
            compactions.append((before, batch.seen))

    monkeypatch.setattr(DecodeBatch, "_compact", spy)

    def job(words, new, seed):
        ids = prompt(engine, [{"role": "user", "content": "word " * words}])
        return Job(ids, SamplingParams(max_new_tokens=new, temperature=0.9), seed=seed)

    first, shorter, longer, late = job(30, 6, 1), job(1, 20, 2), job(60, 4, 3), job(2, 5, 4)
    # step 3: a short prompt (left-padded) and one longer than every column so far (the others skip
    # the gap); `first` then leaves, so the short one's padding can be dropped; step 12: one more
    feed = ScriptedFeed({1: [(first, "first")], 3: [(shorter, "shorter"), (longer, "longer")], 12: [(late, "late")]})
    peak = engine.stream(feed, max_rows=8)
    got = dict(feed.delivered)
    assert peak == 3 and set(got) == {"first", "shorter", "longer", "late"}
    assert [sorted(done) for _, done in feed.live_when_taken][1:] == [[], [], ["first", "longer"]]
    assert bool(compactions) == (compact_from == 1)
    for name, j in [("first", first), ("shorter", shorter), ("longer", longer), ("late", late)]:
        alone = engine.generate([j])[0]
        assert got[name].completion_ids == alone.completion_ids, name
        assert max(abs(a - b) for a, b in zip(got[name].logprobs, alone.logprobs)) < 1e-4
        fresh = engine.score(j.prompt_ids, got[name].completion_ids, temperature=0.9)
        assert max(abs(a - b) for a, b in zip(fresh, got[name].logprobs)) < 1e-4


def test_a_row_whose_caller_gave_up_leaves_the_batch_and_the_others_decode_as_if_alone(engine):

    def job(words, new, seed):
        ids = prompt(engine, [{"role": "user", "content": "word " * words}])
        return Job(ids, SamplingParams(max_new_tokens=new, temperature=0.9), seed=seed)

    kept, dropped = job(5, 6, 1), job(9, 120, 2)
    assert len(engine.generate([dropped])[0].completion_ids) > 20  # alone it would decode long after `kept`
    before = dict(engine.stats)
    feed = ScriptedFeed({1: [(kept, "kept"), (dropped, "dropped")]}, gives_up={"dropped": 3})
    engine.stream(feed, max_rows=8)
    assert [name for name, _ in feed.delivered] == ["kept"]
    assert engine.stats["abandoned"] - before["abandoned"] == 1
    assert engine.stats["decode_steps"] - before["decode_steps"] <= 6  # not the 20+ the dropped row had left
    alone = engine.generate([kept])[0]
    assert feed.delivered[0][1].completion_ids == alone.completion_ids


def test_rows_sharing_a_prompt_prefix_decode_over_one_copy_of_it(engine, monkeypatch):

    steps = []
    original = DecodeBatch.step

    def spy(batch, tokens, positions):
        groups = {id(g): len(g.ids) for g in batch.row_groups if g is not None}
        steps.append((sorted(groups.values()), batch.seen, batch.rows))
        return original(batch, tokens, positions)

    monkeypatch.setattr(DecodeBatch, "step", spy)
    bank = "You are a careful bank assistant. Check every account before you move money. " * 6
    shop = "You sell shoes and socks. Answer in one short line, and never promise a delivery date. " * 4

    def job(system_text, question, new, seed):
        chat = [{"role": "system", "content": system_text}, {"role": "user", "content": question}]
        return Job(prompt(engine, chat), SamplingParams(max_new_tokens=new, temperature=0.9),
                    seed=seed)

    jobs = {"a": job(bank, "balance of CHK-1?", 14, 1), "b": job(bank, "move 5 from SAV-2 to CHK-1 " * 3, 12, 2),
            "c": job(bank[:-40] + "Be brief.", "list accounts", 10, 3),  # step 3: shares less of the prompt
            "d": job(shop, "red socks?", 8, 4), "e": job(shop, "size 44 boots", 8, 5)}  # step 6: another prompt
    feed = ScriptedFeed({1: [(jobs["a"], "a"), (jobs["b"], "b")], 3: [(jobs["c"], "c")],
                         6: [(jobs["d"], "d"), (jobs["e"], "e")]})
    engine.stream(feed, max_rows=8)
    got = dict(feed.delivered)

    def common(x, y):
        return common_prefix(jobs[x].prompt_ids, jobs[y].prompt_ids, limit=10**9)

    ab, ac, de = common("a", "b"), common("a", "c"), common("d", "e")
    assert 100 < ac < ab and de > 100 and common("a", "d") < 64
    # held once per group, the rows' columns start after it; `c` shortens the bank group for its rows
    assert [groups for groups, _, _ in steps[:6]] == [[ab], [ab], [ac], [ac], [ac], sorted([ac, de])]
    assert [rows for _, _, rows in steps[:6]] == [2, 2, 3, 3, 3, 5]
    assert steps[0][1] == max(len(jobs["a"].prompt_ids), len(jobs["b"].prompt_ids)) - ab
    engine.share_prefix = False
    try:
        for name, j in jobs.items():
            alone = engine.generate([j])[0]  # every row its own copy
            assert got[name].completion_ids == alone.completion_ids, name
            assert max(abs(a - b) for a, b in zip(got[name].logprobs, alone.logprobs)) < 1e-4
            fresh = engine.score(j.prompt_ids, got[name].completion_ids, temperature=0.9)
            assert max(abs(a - b) for a, b in zip(fresh, got[name].logprobs)) < 1e-4
    finally:
        engine.share_prefix = True


def test_a_row_left_alone_takes_its_prefix_back_and_later_rows_share_again(engine, monkeypatch):

    steps = []
    original = DecodeBatch.step

    def spy(batch, tokens, positions):
        out = original(batch, tokens, positions)
        steps.append((batch.rows, [len(g.ids) for g in batch.groups], [g is not None for g in batch.row_groups]))
        return out

    monkeypatch.setattr(DecodeBatch, "step", spy)
    system = "You are a careful bank assistant. Check every account before you move money. " * 6

    def job(question, new, seed):
        chat = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return Job(prompt(engine, chat), SamplingParams(max_new_tokens=new, temperature=0.9),
                    seed=seed)

    jobs = {"a": job("balance of CHK-1?", 12, 1), "b": job("list accounts", 10, 2), "c": job("move 5 to SAV-2", 6, 3)}
    # `a` alone for three steps, then `b` and `c` arrive together and share a prefix between them
    feed = ScriptedFeed({1: [(jobs["a"], "a")], 4: [(jobs["b"], "b"), (jobs["c"], "c")]})
    engine.stream(feed, max_rows=8)
    got = dict(feed.delivered)
    assert steps[0] == (1, [], [False])  # alone: its prefix went back into its own columns
    assert steps[3][0] == 3 and len(steps[3][1]) == 1 and steps[3][1][0] > 100 and steps[3][2] == [False, True, True]
    engine.share_prefix = False
    try:
        for name, j in jobs.items():
            alone = engine.generate([j])[0]
            assert got[name].completion_ids == alone.completion_ids, name
            fresh = engine.score(j.prompt_ids, got[name].completion_ids, temperature=0.9)
            assert max(abs(a - b) for a, b in zip(fresh, got[name].logprobs)) < 1e-4
    finally:
        engine.share_prefix = True


@pytest.mark.parametrize("masked", [False, True])
def test_attention_split_over_shared_prefixes_equals_attention_over_the_whole(masked):
    import torch.nn.functional as F


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


def test_a_sliding_window_model_decodes_batches_through_the_library_cache(tiny_qwen3_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_qwen3_dir)
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, 16, 1
    config.layer_types = None  # re-derived from the switches above
    config = type(config)(**config.to_dict())
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "sliding")
    AutoTokenizer.from_pretrained(tiny_qwen3_dir).save_pretrained(tmp_path / "sliding")
    engine = Engine(*load_model(str(tmp_path / "sliding")))
    assert not engine.plain_cache
    jobs = [Job(prompt(engine, [{"role": "user", "content": "word " * (5 * i + 1)}]),
                 SamplingParams(max_new_tokens=20 - 4 * i, temperature=0.9), seed=i) for i in range(3)]
    together = engine.generate(jobs)
    assert min(len(j.prompt_ids) for j in jobs) > 16  # past the window
    for job, got in zip(jobs, together):
        alone = engine.generate([job])[0]
        assert got.completion_ids == alone.completion_ids
        fresh = engine.score(job.prompt_ids, got.completion_ids, temperature=0.9)
        assert max(abs(a - b) for a, b in zip(fresh, got.logprobs)) < 1e-4


async def test_a_job_that_cannot_be_generated_fails_alone_and_its_batch_mates_finish(engine):
    from envace_mcp.errors import UserError

    good = [Job(prompt(engine, [{"role": "user", "content": f"hello {i}"}]),
                 SamplingParams(max_new_tokens=5, temperature=0.9), seed=i) for i in range(2)]
    outcomes = {}

    async def one(name, job):
        try:
            outcomes[name] = await engine.batcher.submit(job)
        except UserError as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "a", good[0])
        tg.start_soon(one, "empty", Job([], SamplingParams(max_new_tokens=5), seed=9))
        tg.start_soon(one, "b", good[1])
    assert isinstance(outcomes["empty"], UserError) and "empty prompt" in str(outcomes["empty"])
    for name, job in (("a", good[0]), ("b", good[1])):
        assert outcomes[name].completion_ids == engine.generate([job])[0].completion_ids


def test_sampling_follows_the_distribution_and_never_picks_a_filtered_token():
    generator = numpy.random.default_rng(0)
    logits = torch.tensor([0.0, 1.0, float("-inf"), 2.0, 0.5, -1.0])
    want = torch.softmax(logits, dim=-1)
    draws = [sample(logits, SamplingParams(temperature=1.0), generator) for _ in range(20000)]
    counts = torch.bincount(torch.tensor([token for token, _ in draws]), minlength=6) / len(draws)
    assert counts[2] == 0 and torch.allclose(counts, want, atol=0.01)
    assert all(abs(lp - float(torch.log(want[token]))) < 1e-5 for token, lp in draws[:50])
    top2 = {sample(logits, SamplingParams(temperature=1.0, top_k=2), generator)[0] for _ in range(500)}
    assert top2 == {1, 3}
    cool = [sample(logits, SamplingParams(temperature=0.25), generator)[0] for _ in range(2000)]
    assert cool.count(3) / len(cool) > 0.95  # temperature sharpens toward the top token


async def test_a_reply_scored_during_a_generation_is_served_between_its_steps_after_the_cached_prompt(engine):

    first = Job(prompt(engine, [{"role": "user", "content": "count to ten"}]),
                SamplingParams(max_new_tokens=6, temperature=0.9, stop=()), seed=0)
    done = (await engine.batcher.submit(first))
    long = Job(prompt(engine, [{"role": "user", "content": "word " * 9}]),
               SamplingParams(max_new_tokens=120, temperature=0.9, stop=()), seed=1)
    order: list[str] = []
    before = engine.stats["scored_reused_tokens"]

    async def generate() -> None:
        await engine.batcher.submit(long)
        order.append("generation")

    async def score() -> list[float]:
        await anyio.sleep(0.05)  # the long generation is decoding by now, holding the engine
        got = await anyio.to_thread.run_sync(
            lambda: engine.score(first.prompt_ids, done.completion_ids, temperature=0.9, reuse_prefix=True))
        order.append("score")
        return got

    async with anyio.create_task_group() as group:
        group.start_soon(generate)
        scored = await score()
    assert order == ["score", "generation"]  # served between two of its steps, not after it
    assert engine.stats["scored_reused_tokens"] - before == len(first.prompt_ids) - 1
    assert scored == pytest.approx(done.logprobs, abs=1e-4)
    assert scored == pytest.approx(engine.score(first.prompt_ids, done.completion_ids, temperature=0.9), abs=1e-4)

"""A greedy row is batch-invariant: the same tokens and logprobs, bit for bit, whatever else its decode
batch holds and whatever the prefix cache held (`engine.invariant`), so a greedy evaluation repeats
exactly. Sampled rows keep the batched kernels and shared prefixes."""

import numpy
import pytest

from envace_mcp.engine import Job, SamplingParams
from envace_mcp.engine.invariant import PREFILL_CHUNK

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


def tokens(n, seed):
    return [int(t) for t in numpy.random.default_rng(seed).integers(10, 1000, n)]


def result(completion):
    return completion.completion_ids, completion.logprobs


@pytest.fixture
def fresh(engine):
    engine.prefix_cache.clear()
    engine.batch_invariant = True  # what `envace eval` turns on (EvalConfig.batch_invariant)
    yield engine
    engine.batch_invariant = False
    engine.prefix_cache.clear()


def test_a_greedy_generation_is_the_same_bit_for_bit_whatever_its_batch_companions(fresh):
    engine = fresh
    prompt = tokens(300, 1)
    alone = result(engine.generate([Job(prompt, GREEDY, seed=0)])[0])
    shorter, longer = tokens(20, 2), tokens(500, 3)  # a longer prompt leaves a gap in the row's columns
    sampled = SamplingParams(temperature=0.9, max_new_tokens=24)
    companions = [
        [Job(shorter, GREEDY, seed=1)],
        [Job(shorter, GREEDY.model_copy(update={"max_new_tokens": 4}), seed=1), Job(longer, GREEDY, seed=2)],
        [Job(tokens(150, 4), sampled, seed=3), Job(longer, sampled, seed=2), Job(shorter, sampled, seed=5)],
        [Job(prompt[:280] + tokens(40, 6), GREEDY, seed=7), Job(prompt[:200] + tokens(90, 8), sampled, seed=8)],
    ]
    for others in companions:
        engine.prefix_cache.clear()
        together = engine.generate([*others, Job(prompt, GREEDY, seed=0)])  # last: it changes slots as rows leave
        assert result(together[-1]) == alone, [len(j.prompt_ids) for j in others]


def test_a_greedy_prompt_reuses_only_whole_chunks_prefilled_as_its_own_would_be(fresh):
    engine = fresh
    prompt = tokens(PREFILL_CHUNK + 300, 11)
    alone = result(engine.generate([Job(prompt, GREEDY, seed=0)])[0])
    engine.prefix_cache.clear()
    # a sampled prompt sharing all but its last tokens was prefilled in one forward: not reused
    engine.generate([Job(prompt[:-20] + tokens(5, 12), SamplingParams(max_new_tokens=2), seed=1)])
    reused = engine.stats["reused_tokens"]
    assert result(engine.generate([Job(prompt, GREEDY, seed=0)])[0]) == alone
    assert engine.stats["reused_tokens"] == reused
    # a greedy one sharing as much: its whole chunks are reused, the rest prefilled at the same positions
    engine.prefix_cache.clear()
    engine.generate([Job(prompt[:-20] + tokens(5, 12), GREEDY.model_copy(update={"max_new_tokens": 2}), seed=1)])
    reused = engine.stats["reused_tokens"]
    assert result(engine.generate([Job(prompt, GREEDY, seed=0)])[0]) == alone
    assert engine.stats["reused_tokens"] - reused == (len(prompt) - 20) // PREFILL_CHUNK * PREFILL_CHUNK > 0

"""The judge's reward (`envace_mcp.train.judge`, `--reward judge:MODEL`): a local transformers model's
verdict read from its digit probabilities (one pass over the group, checked against a fresh forward pass
per attempt), a chat model's JSON verdict checked and asked again once, groups scored whole, and the CLI
scoring a trace folder with a rubric file before it trains."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from envace_mcp.errors import UserError
from envace_mcp.traces import TraceStore
from envace_mcp.train.judge import ChatJudge, attempt_text, judge, judge_chat, read_scores
from envace_mcp.train.rewards import reward_from, score_missing

FIXTURES = Path(__file__).parent.parent / "fixtures" / "traces"


@pytest.fixture
def group():
    """Four runs of one bank task (two the checker passed, two it failed), with tokens and logprobs."""
    return list(TraceStore(FIXTURES).read())


def test_an_attempt_shows_each_call_what_came_of_it_and_the_answer(group):
    text = attempt_text(group[0])
    calls = [s for s in group[0].steps if s.role == "tool"]
    assert calls and all(f"{s.tool} " in text for s in calls)
    assert text.endswith(f"Final answer: {group[0].final_answer.strip()}") or "Final answer:" in text
    chat = judge_chat(group, "RUBRIC")
    assert chat[0] == {"role": "system", "content": "RUBRIC"}
    assert all(f"## Attempt {i}\n" in chat[1]["content"] for i in range(1, 5)) and group[0].task in chat[1]["content"]
    assert len(attempt_text(group[0], limit=120)) <= 120 + len("Final answer: ") + 600


def test_a_local_judge_reads_the_group_in_both_orders_and_scores_each_attempt_by_its_expected_digit(group, tiny_qwen3_dir):
    """Each verdict is the mean of two readings, each checked against a fresh forward pass of that
    attempt's whole prompt: the group in its order (attempt i asked about as i) and reversed (as 5 - i)."""
    j = judge(str(tiny_qwen3_dir))
    verdicts = j.score_group(group)
    local = j._scorer
    assert len(verdicts) == 4

    def fresh(order, asked):
        text = local.policy.render(judge_chat(order, j.rubric, ask=local.ask(asked)), None)
        assert f"How good is attempt {asked}, compared with the others?" in text
        ids = local.policy.encode(text)
        weights = [math.exp(local.policy.score(ids, [d])[0]) for d in local._digit_ids(text, ids)]
        return sum(d * w for d, w in enumerate(weights)) / sum(weights) / 9

    for i, (value, details) in enumerate(verdicts, 1):
        assert details["attempt"] == i and details["of"] == 4 and len(details["p"]) == 10
        assert sum(details["p"]) == pytest.approx(1, abs=1e-3) and 0 < details["digit_mass"] <= 1
        assert 0 <= value <= 1 and value == pytest.approx(sum(details["readings"]) / 2, abs=1e-4)
    for i in (1, 4):
        first, second = verdicts[i - 1][1]["readings"]
        assert first == pytest.approx(fresh(group, i), abs=1e-4)
        assert second == pytest.approx(fresh(group[::-1], 5 - i), abs=1e-4)


def reply(*scores, why="ok") -> str:
    return json.dumps({"scores": [{"attempt": i, "why": why, "score": s} for i, s in enumerate(scores, 1)]})


def test_a_chat_judge_returns_its_scores_and_reasons(group):
    model = FakeListChatModel(responses=["```json\n" + reply(1, 0.75, 0, 0.25, why="used the right account") + "\n```"])
    verdicts = judge(model).score_group(group)
    assert [v for v, _ in verdicts] == [1.0, 0.75, 0.0, 0.25]
    assert verdicts[0][1]["why"] == "used the right account" and verdicts[0][1]["judge"].startswith("judge:")


@pytest.mark.parametrize("bad, problem", [
    ("I think attempt 1 is best.", "no JSON object"),
    ('{"scores": [{"attempt": 1, "score": 0.5}', "JSON is broken"),
    ('{"scores": [{"attempt": 1, "score": 0.5,}]}', "JSON is broken"),
    (reply(1, 7, 0, 0), "attempt 2's score '7' is not a number from 0 to 1"),
    (reply(1, float("nan"), 0, 0), "is not a number from 0 to 1"),
    (reply(1, True, 0, 0), "is not a number from 0 to 1"),
    (reply(1, 0.5, 0), "scores 3 of the 4"),
    (json.dumps({"scores": [{"attempt": 1, "score": 1}, {"attempt": 1, "score": 0}]}), "each of 1..4 must appear once"),
    (json.dumps({"verdict": "good"}), "no list 'scores'"),
])
def test_a_chat_reply_that_is_not_one_score_in_range_per_attempt_is_refused(bad, problem):
    with pytest.raises(ValueError, match=problem):
        read_scores(bad, 4)


def test_a_broken_reply_is_asked_again_once_then_the_group_is_unscored(group):
    fixed = FakeListChatModel(responses=[reply(1, 12, 0, 0), reply(0.5, 0.5, 0, 1)])
    assert [v for v, _ in ChatJudge(fixed).score(group, "RUBRIC")] == [0.5, 0.5, 0.0, 1.0]
    broken = FakeListChatModel(responses=["not json", reply(1, 2, 3, 4)])
    verdicts = judge(broken).score_group(group)
    assert all(v is None for v, _ in verdicts)
    assert "could not be read, twice" in verdicts[0][1]["unscorable"] and "is not a number from 0 to 1" in verdicts[0][1]["unscorable"]


def test_a_group_is_scored_whole_and_only_the_runs_lacking_the_reward_take_it(group, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES, runs)
    store = TraceStore(runs)
    model = FakeListChatModel(responses=[reply(0.1, 0.2, 0.3), reply(0.9, 0.9, 0.9, 0.9)])
    fn = judge(model)
    first = list(store.read())
    seen: list[int] = []
    added = score_missing(first[:3], fn, store, on_scored=seen.append)  # a group of three: one call
    assert [r.value for r in added] == [0.1, 0.2, 0.3] and seen == [3]
    added = score_missing(list(store.read()), fn, store)  # the fourth joins its group; the three keep theirs
    assert [r.value for r in added] == [0.9]
    assert [r.reward(fn.name).value for r in store.read()] == [0.1, 0.2, 0.3, 0.9]
    assert score_missing(list(store.read()), fn, store) == []


def test_judge_rewards_are_named_weighted_and_combined(group, tmp_path):
    rubric = tmp_path / "rubric.md"
    rubric.write_text("Prefer the attempt that answers.")
    fn = reward_from(f"outcomes,judge:{tmp_path / 'no-model-here'}=2", rubric=rubric)
    own = fn.parts[1][2].rubric_digest  # a rubric of one's own names the reward: runs judged under another are judged again
    assert fn.name == f"outcomes+judge:{tmp_path / 'no-model-here'}#{own}*2"
    assert fn.parts[1][2].rubric == "Prefer the attempt that answers."
    assert reward_from("judge:openai:gpt-4.1-mini").name == "judge:openai:gpt-4.1-mini"  # nothing loads until it scores
    with pytest.raises(UserError, match="a rubric is the judge's"):
        reward_from("outcomes", rubric=rubric)
    with pytest.raises(UserError, match="name a model"):
        reward_from("judge:")
    with pytest.raises(UserError, match="rubric .*missing.md"):
        reward_from("judge:embedded", rubric=tmp_path / "missing.md")
    chat = judge(FakeListChatModel(responses=[reply(1, 0, 0, 0)]))
    from envace_mcp.train.rewards import Combined, outcomes

    both = Combined((("outcomes", 1.0, outcomes), (chat.name, 1.0, chat)))
    verdicts = both.score_group(group)
    first = verdicts[0][1]["parts"]
    assert first[chat.name]["value"] == 1.0 and verdicts[0][0] == pytest.approx((first["outcomes"]["value"] + 1.0) / 2)
    store = TraceStore(tmp_path / "runs")
    for trace in group:
        store.append(trace)
    score_missing(group, chat, store)  # the judge alone first ...
    chat._scorer = None
    chat.load = lambda: pytest.fail("a part every run carries is read, not scored again")
    assert [v for v, _ in both.score_group(group)] == [v for v, _ in verdicts]  # ... then read by the combination


def test_train_grpo_scores_with_a_local_judge_and_a_rubric_file(tmp_path, tiny_qwen3_dir):
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES, runs)
    rubric = tmp_path / "rubric.md"
    rubric.write_text("Score the attempt that answers with the checking balance highest.")
    config = tmp_path / "grpo.json"
    config.write_text(json.dumps({"model": str(tiny_qwen3_dir), "steps": 1, "groups_per_step": 1}))
    name = judge(str(tiny_qwen3_dir), rubric=rubric).name
    assert name.startswith(f"judge:{tiny_qwen3_dir}#")
    done = subprocess.run([sys.executable, "-m", "envace_mcp.cli", "train", "grpo", "--traces", str(runs), "--out",
                           str(tmp_path / "grpo"), "-c", str(config), "--reward", f"judge:{tiny_qwen3_dir}",
                           "--rubric", str(rubric)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert f"scored 4 of 4 runs with '{name}'" in done.stdout and "step 1" in done.stdout
    scored = [r.reward(name) for r in TraceStore(runs).read()]
    assert all(0 <= r.value <= 1 and r.details["of"] == 4 for r in scored)
    digests = {r.details["rubric"] for r in scored}  # the file's, not the bundled rubric's
    assert len(digests) == 1 and digests != {judge("embedded").rubric_digest}


def test_agreement_counts_pairs_the_checker_tells_apart_and_kendalls_tau():
    from envace_mcp.lab.analyses.reward_agreement import pairs_of, summary, tau_b

    same = [(1.0, 0.9), (0.5, 0.6), (0.0, 0.1), (0.0, 0.2)]  # checker ties the last two: not a pair
    assert pairs_of([same]) == [(5, 0, 0)] and tau_b(same) == pytest.approx(5 / (6 * 5) ** 0.5)
    reversed_ = [(1.0, 0.0), (0.0, 1.0), (0.5, 0.0)]  # the reward ties the first and the last
    assert pairs_of([reversed_]) == [(0, 2, 1)] and tau_b(reversed_) == pytest.approx(-2 / (3 * 2) ** 0.5)
    flat = [(1.0, 0.3), (0.0, 0.3)]
    assert pairs_of([flat]) == [(0, 0, 1)] and tau_b(flat) is None
    figures = summary([same, flat])
    assert figures["pairs"] == 6 and figures["agreement"] == pytest.approx(5 / 6)
    assert figures["agreement_ties_half"] == pytest.approx(5.5 / 6) and figures["tau_groups"] == 1
    low, high = figures["agreement_interval"]
    assert low <= 5 / 6 <= high


def test_a_run_judged_alone_and_a_group_too_long_for_the_judge(group, tiny_qwen3_dir):
    j = judge(str(tiny_qwen3_dir))
    value, details = j(group[0], {})  # record_run(rewards=[j]): the run is its own group
    assert 0 <= value <= 1 and details["of"] == 1 and details["readings"][0] == details["readings"][1]
    j._scorer.policy.context_window = 200  # no attempt fits, even cut to a quarter
    verdicts = j.score_group(group)
    assert all(v is None and "do not fit the judge's context" in d["unscorable"] for v, d in verdicts)

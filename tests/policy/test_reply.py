"""Rehearsals decoded status first and held to a readable reply: the mask and P(error) on hand-set logits,
and a tiny random Qwen3 that writes garbage unheld but only readable replies (or an explicit UNKNOWN) held."""

import math

import pytest
import torch
from langchain_core.messages import HumanMessage

from envace_mcp.policy import RehearseRequest, SamplingParams, ToolCall, load_policy
from envace_mcp.policy.constrained import TokenText
from envace_mcp.policy.reply import ReplyConstraint

pytestmark = pytest.mark.anyio
SCHEMA = {"type": "object", "properties": {"account_id": {"type": "string"}, "balance": {"type": "number"}},
          "required": ["account_id", "balance"]}


@pytest.fixture(scope="module")
def policy(tiny_qwen3_dir):
    return load_policy(str(tiny_qwen3_dir), batch_window_s=0.05, rehearse_format="inline")


def _ids(policy, text):
    return policy.tokenizer(text, add_special_tokens=False)["input_ids"]


def _one(policy, text):
    ids = _ids(policy, text)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def _logits(policy, weights):
    logits = torch.full((len(policy.tokenizer),), float("-inf"))
    for token, value in weights.items():
        logits[token] = value
    return logits


def test_the_first_token_decides_the_status_and_p_error_is_the_mass_on_opening_an_error(policy):
    """Markup and end of turn are masked at the first token; P(error) is the error side's share of the
    mass on tokens that open a reply, whatever the greedy choice."""
    error, brace, markup, end = _ids(policy, "Error")[0], _one(policy, "{"), _ids(policy, "<")[0], min(policy.eos_ids)
    constraint = ReplyConstraint(SCHEMA, TokenText(policy.tokenizer), policy.eos_ids)
    logits = _logits(policy, {error: 0.0, brace: 1.0, markup: 3.0, end: 2.0})
    constraint.restrict([], logits)
    assert constraint.p_error == pytest.approx(1 / (1 + math.e), rel=1e-4)
    assert torch.isinf(logits[markup]) and torch.isinf(logits[end])  # no markup, no empty reply
    assert torch.isfinite(logits[error]) and torch.isfinite(logits[brace])


def test_a_json_reply_cannot_end_before_its_object_is_whole_and_must_end_once_it_is(policy):
    end = min(policy.eos_ids)
    constraint = ReplyConstraint(SCHEMA, TokenText(policy.tokenizer), policy.eos_ids)
    written = _ids(policy, '{"account_id": "CHK-1", "balance": 12.5')
    constraint.restrict(written, logits := torch.zeros(len(policy.tokenizer)))
    assert torch.isinf(logits[end])  # not whole: the end of turn may not come yet
    closed = written + _ids(policy, "}")
    constraint.restrict(closed, logits := torch.zeros(len(policy.tokenizer)))
    assert torch.isfinite(logits[end]) and int(torch.isfinite(logits).sum()) == len(policy.eos_ids)


def test_a_required_key_must_be_written_before_the_object_closes(policy):
    constraint = ReplyConstraint(SCHEMA, TokenText(policy.tokenizer), policy.eos_ids)
    written = _ids(policy, '{"account_id": "CHK-1"')
    constraint.restrict(written, logits := torch.zeros(len(policy.tokenizer)))
    assert torch.isinf(logits[_one(policy, "}")])


def test_a_tool_without_an_output_schema_may_answer_in_prose_but_not_in_markup(policy):
    constraint = ReplyConstraint(None, TokenText(policy.tokenizer), policy.eos_ids)
    word, markup = _ids(policy, "Done")[0], _ids(policy, "<")[0]
    constraint.restrict([], logits := _logits(policy, {word: 1.0, markup: 5.0}))
    assert torch.isfinite(logits[word]) and torch.isinf(logits[markup]) and constraint.p_error == 0.0


async def test_a_random_model_writes_only_readable_replies_or_an_explicit_unknown(policy, bank_catalog):
    """Unheld, the tiny random model's rehearsals are garbage; held, each is a result valid against the
    tool's output schema, a predicted error, or UNKNOWN (cut at the budget) — never unreadable otherwise."""
    specs = [s for s in bank_catalog if s.output_schema][:4]
    requests = [RehearseRequest(call=ToolCall(id=f"c{i}", name=s.name, arguments={}), tool=s, allowed=list(bank_catalog),
                                history=[HumanMessage(content="What is my balance?")]) for i, s in enumerate(specs)]
    held, unheld = [], []
    for seed in range(3):
        sampling = SamplingParams(max_new_tokens=120, temperature=1.0, seed=seed)
        for request in requests:
            held.append((await policy.rehearse(request, sampling)).parsed)
            policy.constrain_rehearsals = False
            try:
                unheld.append((await policy.rehearse(request, sampling)).parsed)
            finally:
                policy.constrain_rehearsals = True
    assert all(p.status != "invalid" or p.code == "UNKNOWN" for p in held), [(p.code, p.message) for p in held]
    assert all(p.p_error is not None and 0.0 <= p.p_error <= 1.0 for p in held)
    assert all(p.text for p in held)  # what it wrote is kept, readable or not
    assert all(p.text.startswith("Error") for p in held if p.status == "tool_error")

    def garbage(p):  # unreadable, or prose that the parser can only take for a failure
        return (p.status == "invalid" and p.code != "UNKNOWN") or (p.status == "tool_error" and not p.text.startswith("Error"))

    assert sum(map(garbage, unheld)) > len(unheld) // 2  # what the hold lifts
    assert not any(map(garbage, held))
    assert all(p.p_error is None for p in unheld)


ITEMS = {"$defs": {"Item": {"type": "object", "properties": {"sku": {"type": "string"}, "units": {"type": "integer"}},
                            "required": ["sku", "units"]}},
         "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                                          "next": {"anyOf": [{"$ref": "#/$defs/Item"}, {"type": "null"}]}},
         "required": ["items"]}


@pytest.mark.parametrize("text, closer, allowed", [
    ('{"items": [{"sku": "A"', "}", False),  # an item closed before its required `units`
    ('{"items": [{"sku": "A", "units": 2', "}", True),
    ('{"items": [{"', "colour", False),  # a key no item has
    ('{"items": [{"sku": "A", "units": ', '"', False),  # an integer field written as a string
    ('{"items": [], "next": {"sku": "B"', "}", False),  # a nullable nested model is still checked
])
def test_nested_models_are_held_to_their_schema_too(policy, text, closer, allowed):
    """FastMCP writes nested models as `$ref`s into `$defs`: a list of items whose elements broke their
    schema read as OUTPUT_SCHEMA_MISMATCH on the inventory server before."""
    constraint = ReplyConstraint(ITEMS, TokenText(policy.tokenizer), policy.eos_ids)
    constraint._take(text)
    assert constraint._fits(_ids(policy, closer)[0]) is allowed


@pytest.mark.parametrize("schema", [SCHEMA, None])
@pytest.mark.parametrize("token, allowed", [("}", True), ("}}", False), ("},", False), ('}\n</tool_call>', False)])
def test_a_token_that_closes_the_reply_and_goes_on_is_refused(schema, token, allowed):
    """SmolLM2 closed a fitted τ²-airline rehearsal with the one token `}}` and, the reply's wrapper closed
    with it, wrote `</tool_call>` and `</call>` lines until its budget ran out (a third of a rehearsal's
    time, and a reply cut at its budget)."""
    texts = ['{"account_id": "CHK-1", "balance": 12.5', token, "}", "<eos>"]
    constraint = ReplyConstraint(schema, texts.__getitem__, {3})
    constraint.restrict([0], logits := torch.zeros(4))
    assert bool(torch.isfinite(logits[1])) is allowed and torch.isfinite(logits[2]) and torch.isinf(logits[3])
    constraint.restrict([0, 2], logits := torch.zeros(4))  # whole: only the end of turn may follow
    assert torch.isinf(logits[:3]).all() and torch.isfinite(logits[3])


def test_the_kind_a_log_showed_holds_the_reply_but_leaves_p_error_the_models_own():
    """A result opened as an object, where the log showed lists, is not written; the model's mass on it is
    still its belief that the call succeeds."""
    texts = ["Error", "{", "[", "<eos>"]
    constraint = ReplyConstraint(None, texts.__getitem__, {3}, kind="array")
    constraint.restrict([], logits := torch.tensor([0.0, 2.0, 1.0, 0.0]))
    assert constraint.p_error == pytest.approx(1 / (1 + math.e ** 2 + math.e), rel=1e-4)
    assert torch.isinf(logits[1]) and torch.isfinite(logits[0]) and torch.isfinite(logits[2]) and torch.isinf(logits[3])


async def test_a_tool_without_an_output_schema_is_held_to_the_kind_of_json_its_log_showed(policy, tmp_path):
    """τ²-airline declares no output schemas; the fitted SmolLM2 answered its flight search, a list in every
    logged reply, with a reservation object, so no field of the flights could be read. A fit learns each
    tool's kind of JSON reply, and its rehearsals are held to it."""
    from types import SimpleNamespace

    from envace_mcp.policy.copying import read_rules, write_rules
    from envace_mcp.policy.logged import MIN_SUPPORT, learn_kinds
    from envace_mcp.toolbox.catalog import ToolSpec

    def call(tool, value, failed=False, output_schema=None):
        return SimpleNamespace(tool=tool, value=value, failed=failed,
                               spec=SimpleNamespace(output_schema=output_schema))

    flights = [call("search", f'[{{"flight": "HAT{i}"}}]') for i in range(MIN_SUPPORT)]
    assert learn_kinds(flights + [call("search", "Error: no such airport", failed=True)]) == {"search": "array"}
    assert learn_kinds(flights[:-1]) == {}  # too few to say
    assert learn_kinds(flights + [call("search", "{}")]) == {}  # 5 of 6 lists: not nearly every reply
    declared = [call("search", f'[{{"flight": "HAT{i}"}}]', output_schema={"type": "object"}) for i in range(6)]
    assert learn_kinds(declared) == {}  # a tool with an outputSchema is held to it, not to a learned kind
    spec = ToolSpec.from_dict({"name": "search", "description": "flights", "server": "airline",
                               "input_schema": {"type": "object"}})
    write_rules(tmp_path, {}, {"search": (spec.server, spec.behaviour)}, kinds=learn_kinds(flights))
    table = read_rules(tmp_path)
    assert table.reply_kind(spec) == "array" and table.summary() == {}  # a hold, not a rule that sets a field
    assert table.kind_summary() == {"search": "a JSON array, as 95% or more of its logged successes were"}
    other = ToolSpec.from_dict({"name": "search", "description": "flights", "server": "another",
                                "input_schema": {"type": "object"}})
    assert table.reply_kind(other) is None  # bound to the tool it was learned on
    request = RehearseRequest(call=ToolCall(id="c1", name="search", arguments={"origin": "JFK"}), tool=spec,
                              allowed=[spec], history=[HumanMessage(content="Flights from JFK?")])
    policy.copy_rules = table
    try:
        held = [(await policy.rehearse(request, SamplingParams(max_new_tokens=60, temperature=1.0, seed=seed))).parsed
                for seed in range(6)]
    finally:
        policy.copy_rules = None
    assert all(p.text.lstrip().startswith(("[", "Error")) for p in held), [p.text for p in held]
    results = [p.result for p in held if p.status == "result"]  # a list, or nothing parsed yet where it was cut
    assert results and all(r is None or isinstance(r, list) for r in results), [p.text for p in held]


def test_the_approver_reads_what_an_unreadable_rehearsal_wrote_and_how_sure_a_readable_one_was():
    """From outside: an unreadable rehearsal showed no text anywhere, so a user could not tell whether their
    schema, the token cap or the model was at fault. Its text is shown whole, control characters written out."""
    from envace_mcp.graph.calls import outcome_text
    from envace_mcp.policy import Prediction

    cut = Prediction(tool="cancel", status="invalid", code="UNKNOWN", message="no readable reply within the budget",
                     text='{"cancelled": tr\x1b[2J')
    shown = outcome_text(cut)
    assert "could not be read" in shown and '{"cancelled": tr' in shown and "\x1b" not in shown
    sure = Prediction(tool="cancel", status="tool_error", code="EXECUTION_ERROR", message="already cancelled",
                      p_error=0.83)
    assert outcome_text(sure) == "fails (EXECUTION_ERROR: already cancelled), P(error) 0.83"


async def test_a_held_rehearsals_recorded_logprobs_are_the_models_own_as_a_trainer_recomputes_them(policy, bank_catalog):
    """The engine records each token under the masked distribution; a trainer recomputes it under the
    model's own. The recorded logprobs are turned back, so offline GRPO on recorded runs starts at ratio 1."""
    spec = next(s for s in bank_catalog if s.name == "get_balance")
    request = RehearseRequest(call=ToolCall(id="c", name=spec.name, arguments={"account_id": "CHK-1"}), tool=spec,
                              allowed=list(bank_catalog), history=[HumanMessage(content="balance?")])
    for temperature in (0.0, 1.0):
        generation = await policy.rehearse(request, SamplingParams(max_new_tokens=24, temperature=temperature, seed=1))
        again = policy.score(generation.prompt_ids, generation.completion_ids, temperature or 1.0)
        assert generation.logprobs == pytest.approx(again, abs=2e-3)


async def test_a_result_cut_at_the_budget_keeps_the_status_it_decided(policy, bank_catalog):
    from envace_mcp.graph.calls import outcome_text

    """A rehearsal decoded status first and cut inside its result (a long listing) decided a result before
    the cut: it predicts that result, with what parsed of it, and says it was cut (`CUT`) — before, it
    was UNKNOWN and counted wrong, though its status was never in doubt."""
    specs = [s for s in bank_catalog if s.output_schema][:4]
    cut = []
    for seed in range(4):
        for i, s in enumerate(specs):
            request = RehearseRequest(call=ToolCall(id=f"c{i}", name=s.name, arguments={}), tool=s,
                                      allowed=list(bank_catalog), history=[HumanMessage(content="What is my balance?")])
            generation = await policy.rehearse(request, SamplingParams(max_new_tokens=4, temperature=1.0, seed=seed))
            p = generation.parsed
            assert p.status != "invalid", (p.code, p.text)
            if p.status == "result":
                assert generation.finish_reason == "length" and p.code == "CUT" and p.text.startswith(("{", "["))
                assert p.confidence == pytest.approx(1 - p.p_error)
                assert "cut at the rehearsal's token budget" in outcome_text(p)  # what the approver reads
                cut.append(p)
    assert cut  # the random model opens most replies as results


async def test_a_result_its_schema_refuses_where_the_hold_does_not_look_keeps_its_status(policy):
    """From outside (a booking server's `get_room`, dates as `format: date`): the hold checks keys and kinds,
    not a string's pattern, so a result the schema then refused was unreadable, its decided status lost (4 %
    of that server's rehearsals). A held rehearsal predicts that result now and says its value is off the
    schema (`OFF_SCHEMA`); an unheld one, which decided nothing first, stays unreadable."""
    from envace_mcp.graph.calls import outcome_text
    from envace_mcp.policy.forced import ForcedPolicy
    from envace_mcp.toolbox import ToolSpec

    class Held(ForcedPolicy):  # the reply as written, with the P(error) a held decode reads off its first token
        async def _continue(self, *args, **kwargs):
            raw, close = await super()._continue(*args, **kwargs)
            return raw.model_copy(update={"p_error": 0.1}), close

    schema = {"type": "object", "properties": {"day": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
              "required": ["day"]}
    spec = ToolSpec.from_dict({"name": "get_day", "description": "today", "input_schema": {"type": "object"},
                               "output_schema": schema})
    request = RehearseRequest(call=ToolCall(id="c", name="get_day", arguments={}), tool=spec, allowed=[spec],
                              history=[HumanMessage(content="What day is it?")])
    held = (await Held(policy, rehearse=lambda _: '{"day": "tomorrow"}').rehearse(request)).parsed
    assert (held.status, held.code, held.result, held.confidence) == ("result", "OFF_SCHEMA", {"day": "tomorrow"}, 0.9)
    assert "does not match" in held.message and outcome_text(held).startswith("succeeds")
    unheld = (await ForcedPolicy(policy, rehearse=lambda _: '{"day": "tomorrow"}').rehearse(request)).parsed
    assert (unheld.status, unheld.code) == ("invalid", "OUTPUT_SCHEMA_MISMATCH")
    fits = (await Held(policy, rehearse=lambda _: '{"day": "2026-12-06"}').rehearse(request)).parsed
    assert (fits.status, fits.code) == ("result", None)

"""The bundled task suites: size, splits, determinism, and the checker against reference runs."""

import re

import anyio
import pytest

from envace_mcp.envs import get_suite, run_reference
from envace_mcp.envs.task import Requirement, numbers_in
from envace_mcp.servers import DOMAINS
from envace_mcp.toolbox import Toolbox


@pytest.fixture(params=DOMAINS)
def suite(request):
    return get_suite(request.param)


def test_each_suite_has_at_least_300_tasks_with_fixed_splits(suite):
    tasks = suite.tasks
    assert len(tasks) >= 300
    train, test = suite.split("train"), suite.split("test")
    assert len(train) + len(test) == len(tasks) and len(test) >= 60
    assert len({t.id for t in tasks}) == len(tasks)
    again = type(suite)(suite.name, suite.seed)._tasks_module.generate_suite.__wrapped__(suite.seed)
    assert [(t.id, t.instruction, t.actions) for t in again] == [(t.id, t.instruction, t.actions) for t in tasks]
    other_seed = get_suite(suite.name, seed=1).tasks
    assert [t.instruction for t in other_seed] != [t.instruction for t in tasks]


def test_validation_is_carved_out_of_train_by_kind_and_fit_is_the_rest(suite):
    train, validation, fit = suite.split("train"), suite.split("validation"), suite.split("fit")
    test = {t.id for t in suite.split("test")}
    assert test and not test & {t.id for t in validation + fit}  # choosing on validation never touches test
    assert {t.id for t in validation}.isdisjoint(t.id for t in fit)
    assert sorted(t.id for t in validation + fit) == sorted(t.id for t in train)
    kinds = {t.kind for t in train}
    assert {t.kind for t in validation} == {k for k in kinds if sum(t.kind == k for t in train) >= 8}
    for kind in kinds:  # every 8th of each kind, in the suite's order
        of_kind = [t.id for t in train if t.kind == kind]
        assert [t.id for t in validation if t.kind == kind] == of_kind[7::8]
    assert 20 <= len(validation) <= len(train) // 8
    assert [t.id for t in get_suite(suite.name).split("validation")] == [t.id for t in validation]  # fixed


def _entities(task) -> set[str]:
    text = task.instruction + " " + " ".join(str(a.arguments) for a in task.actions)
    return set(re.findall(r"(?:\b[A-Z]{1,4}-\d{4,5}\b|\b[a-z]+_[a-z]+_\d{4}\b|#W\d+|\b[A-Z]{4}\b)", text))


def test_test_tasks_use_entities_and_amounts_unseen_in_training(suite):
    train_entities = set().union(*(_entities(t) for t in suite.split("train")))
    test_entities = set().union(*(_entities(t) for t in suite.split("test")))
    assert test_entities and not (train_entities & test_entities)
    train_names = {n.lower() for t in suite.split("train") for n in re.findall(r"(?:I'm|this is) ([A-Z][a-z]+ [A-Z][a-z]+)", t.instruction)}
    test_names = {n.lower() for t in suite.split("test") for n in re.findall(r"(?:I'm|this is) ([A-Z][a-z]+ [A-Z][a-z]+)", t.instruction)}
    assert test_names and not (train_names & test_names)
    money = lambda ts: {n for t in ts for n in numbers_in(t.instruction) if "." in f"{n}" and n % 1}  # noqa: E731
    assert not (money(suite.split("train")) & money(suite.split("test")))


def test_suites_hold_multi_step_refusal_error_and_trap_tasks(suite):
    tasks = suite.tasks
    assert any(3 <= len(t.actions) <= 6 and len(t.write_actions) >= 1 for t in tasks)
    assert {t.outcome for t in tasks} == {"success", "error", "refusal"}
    traps = [t for t in tasks if t.trap]
    assert traps and all(t.trap.tool in t.writes for t in traps)
    for split in ("train", "test"):
        assert {t.kind for t in suite.split(split)} == {t.kind for t in tasks}


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_reference_runs_score_one_and_incomplete_or_careless_runs_score_less(suite, anyio_backend):
    """Every task, through a real (in-process) MCP server: the reference solution scores 1.0,
    dropping its last write scores < 1.0, and adding its trap call scores < 1.0."""
    failures = []
    async with Toolbox({suite.name: suite.build_server()}) as toolbox:
        for task in suite.tasks:
            episode, verdict = await run_reference(toolbox, suite, task)
            if verdict.score != 1.0:
                failures.append((task.id, "reference", verdict))
            if task.outcome == "success" and any(r.is_error for r in episode.results):
                failures.append((task.id, "reference call failed", [r.text for r in episode.results if r.is_error]))
            if task.write_actions:
                _, dropped = await run_reference(toolbox, suite, task, drop_last_write=True)
                if dropped.score >= 1.0:
                    failures.append((task.id, "dropped write not caught", dropped))
            if task.trap:
                _, trapped = await run_reference(toolbox, suite, task, extra=[task.trap])
                if trapped.score >= 1.0:
                    failures.append((task.id, "trap not caught", trapped))
    assert failures == []


def test_the_checker_reads_the_answer_for_required_numbers_and_phrases(suite):
    task = next(t for t in suite.tasks if any(r.kind == "number" for r in t.requirements))
    final = task.initial_state
    from envace_mcp.envs import replay

    final = replay(task.initial_state, task.actions, suite.server_module.apply)
    assert suite.check(task, final, task.answer).score == 1.0
    wrong = suite.check(task, final, "I could not find it.")
    assert wrong.score < 1.0 and not wrong.passed
    assert [c.name for c in wrong.checks if not c.passed][0].startswith("answer has")


def test_numbers_in_answers_tolerate_currency_formatting():
    assert Requirement("number", 1234.5).satisfied_by("You paid $1,234.50 in total")
    assert not Requirement("number", 1234.5).satisfied_by("You paid $1,234.05")
    assert Requirement("text", "closed").satisfied_by("The market is CLOSED now")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_parallel_episodes_of_one_task_do_not_share_state(anyio_backend):
    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "transfer_funds")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        verdicts = []

        async def go():
            verdicts.append((await run_reference(toolbox, suite, task))[1].score)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(go)
    assert verdicts == [1.0] * 8

"""τ² airline / retail through the PyPI stdio servers (written by others): adapter, view, scoring."""

from __future__ import annotations

import anyio
import pytest

from envace_mcp.envs import Action, get_suite, run_task
from envace_mcp.envs.reference import reference_roles
from envace_mcp.graph import GateConfig, RunLimits
from envace_mcp.testing import FunctionPolicy
from envace_mcp.toolbox import Toolbox

pytestmark = pytest.mark.anyio


def replay_policy(suite, task, *, actions=None, answer=None) -> FunctionPolicy:
    return FunctionPolicy(act=reference_roles(suite, task, actions=actions, answer=answer)["act"])


def replay_limits(task) -> RunLimits:
    return RunLimits(max_steps=len(task.actions) + 3)


async def replay_all(suite, tasks, **changes) -> dict[str, float]:
    """Each task's reference actions (or a changed version) played through our graph, scored."""
    scores: dict[str, float] = {}
    with suite.servers() as config:
        async with Toolbox(config) as toolbox:
            limiter = anyio.Semaphore(4)

            async def one(task):
                async with limiter:
                    change = changes.get("change", lambda t: {})(task)
                    run = await run_task(suite, task, policy=replay_policy(suite, task, **change), toolbox=toolbox,
                                         gate=GateConfig(rehearse="none"), limits=replay_limits(task))
                    scores[task.id] = run.verdict.score

            async with anyio.create_task_group() as tg:
                for task in tasks:
                    tg.start_soon(one, task)
    return scores


@pytest.mark.parametrize("name,train,test", [("tau2-airline", 30, 20), ("tau2-retail", 74, 40)])
def test_official_splits_load(name, train, test):
    suite = get_suite(name)
    assert (len(suite.split("train")), len(suite.split("test"))) == (train, test)
    for task in suite.tasks:  # solo mode: what the customer knows and wants; never what they don't know
        scenario = suite.raw_tasks[task.id]["user_scenario"]["instructions"]
        assert scenario["reason_for_call"].strip() in task.instruction
        if len(str(scenario.get("unknown_info") or "")) > 20:
            assert scenario["unknown_info"].strip() not in task.instruction


@pytest.mark.parametrize("name", ["tau2-airline", "tau2-retail"])
async def test_every_reference_replay_through_the_graph_scores_100_percent(name):
    suite = get_suite(name)
    scores = await replay_all(suite, suite.tasks)
    failed = {k: v for k, v in scores.items() if v < 1.0}
    assert len(scores) == len(suite.tasks) and not failed, failed


async def test_corrupted_replays_score_lower():
    suite = get_suite("tau2-airline")
    with_writes = [t for t in suite.split("test") if t.writes]
    says = [t for t in suite.tasks if t.requirements]
    assert len(with_writes) >= 8 and len(says) >= 5

    def drop_last_write(task):
        last = max(i for i, a in enumerate(task.actions) if a.tool in task.writes)
        return {"actions": [a for i, a in enumerate(task.actions) if i != last]}

    dropped = await replay_all(suite, with_writes, change=drop_last_write)
    # A dropped write changes the final database unless the reference write itself fails.
    assert sum(dropped.values()) == 0, dropped  # 13 test tasks with writes, every one caught
    silent = await replay_all(suite, says, change=lambda t: {"answer": "All done."})
    assert sum(silent.values()) == 0, silent


async def test_the_agent_sees_neither_state_keys_nor_control_tools_and_cannot_escape_its_episode():
    suite = get_suite("tau2-airline")
    task = suite.task("13")
    with suite.servers() as config:
        async with Toolbox(config) as toolbox:
            assert {"reset_state", "get_call_log"} <= set(toolbox.catalog.names)
            mine, other = suite.episode(task), suite.episode(task)
            view = mine.scope(toolbox)
            names = view.catalog.names
            assert "reset_state" not in names and "get_call_log" not in names and len(names) == 14
            assert all("state_key" not in (s.input_schema.get("properties") or {}) for s in view.catalog)
            denied = await view.call("get_call_log", {})
            assert denied.is_error and denied.error_kind == "denied"
            # a state_key the model writes is replaced by the episode's own
            result = await view.call("get_user_details", {"user_id": "mia_li_3668", "state_key": other.key})
            assert not result.is_error and result.structured_content is None
            assert result.value["user_id"] == "mia_li_3668" and "state_key" not in result.arguments
            assert await mine.call_log(toolbox) == [("get_user_details", {"user_id": "mia_li_3668"})]
            assert await other.call_log(toolbox) == []
            # tool errors come back as τ²'s own "Error: ..." message, flagged
            missing = await view.call("get_reservation_details", {"reservation_id": "NOPE00"})
            assert missing.is_error and missing.text.startswith("Error:") and "NOPE00" in missing.text


def test_db_check_and_communicate_check_follow_tau2():
    suite = get_suite("tau2-airline")
    task = next(t for t in suite.tasks if t.requirements and t.writes)
    calls = [(a.tool, dict(a.arguments)) for a in task.actions]
    info = [r.value for r in task.requirements]
    assert suite.check(task, calls, [task.answer]).score == 1.0
    # commas in the agent's message are ignored, case too
    with_commas = [f"{int(v):,}".upper() if str(v).isdigit() else str(v).upper() for v in info]
    assert suite.check(task, calls, [" and ".join(with_commas)]).score == 1.0
    verdict = suite.check(task, calls, ["nothing useful"])
    assert verdict.score == 0.0 and [c.name for c in verdict.checks if not c.passed] == [f"communicate:{v}" for v in info]
    # an extra write the reference does not make changes the database
    extra = calls + [("cancel_reservation", {"reservation_id": "4OG6T3"})]
    assert suite.check(task, extra, [task.answer]).checks[0].passed is False
    assert Action  # the reference actions are suite Actions, replayed as (name, arguments)


def test_tasks_that_need_a_language_judge_are_flagged_not_guessed():
    retail = get_suite("tau2-retail")
    flagged = [t for t in retail.tasks if retail.judge_required(t)]
    assert len(flagged) == 40  # DB + NL_ASSERTION with assertions; the DB part is still scored
    assert not any(get_suite("tau2-airline").judge_required(t) for t in get_suite("tau2-airline").tasks)

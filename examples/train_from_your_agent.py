"""Train the policy from your own agent's runs, in three steps.

1. Your agent, as you wrote it: `create_agent` with tools from the toolbox (here the bank server) —
   switched to the policy's chat model (`policy.as_chat_model()`) and `RehearsalMiddleware`.
2. Record K concurrent runs per task (`record_run`, one `group_id` per task), each scored by your own
   reward function.
3. Train one GRPO step from those traces (`OfflineGRPO`): both roles, EnvACE's role-wise advantages.

    python examples/train_from_your_agent.py [--model DIR] [--tasks 2] [--k 2] [--out runs/your-agent]

With the embedded model (the default) and its shipped adapter, expect minutes per task on a CPU; the
GRPO step starts from the weights that recorded the runs (the same adapter), so its first ratio is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from pathlib import Path
from typing import Any

import anyio
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage

from envace_mcp import Toolbox
from envace_mcp.envs import Episode, get_suite
from envace_mcp.graph import GateConfig
from envace_mcp.graph.middleware import RehearsalMiddleware
from envace_mcp.policy import SamplingParams, load_policy
from envace_mcp.policy.embedded import default_adapter
from envace_mcp.traces import TraceStore, record_run
from envace_mcp.train.trainer import GRPOConfig, OfflineGRPO


def writing_tasks(suite: Any) -> list[Any]:
    """Training tasks that change something: the rehearse role (by default) rehearses writes only."""
    return [t for t in suite.split("train") if any(a.tool in t.writes for a in t.actions)]


SANDBOX = GateConfig(require_approval="never")
"""The bank server here is a sandbox, reset per episode, and nobody is there to approve: the explicit
opt-out. On your real servers keep the default, which asks before every destructive call."""


async def record(policy: Any, out: Path, *, tasks: int, k: int) -> Path:
    """Steps 1 and 2: K recorded, rewarded runs of a plain `create_agent` agent per task."""
    suite = get_suite("bank")
    store = TraceStore(out / "traces")
    model = policy.as_chat_model()  # step 1: the policy behind your agent (was: ChatOpenAI(...), say)
    async with Toolbox({"bank": suite.build_server()}) as toolbox:

        async def one_run(task: Any) -> None:
            episode = Episode(task, "bank")  # each run has its own episode on the bank server
            tools = toolbox.langchain_tools(meta=episode.meta)
            agent = create_agent(model, tools=tools, system_prompt=suite.instructions,
                                 middleware=[RehearsalMiddleware(policy, tools=tools, gate=SANDBOX)])

            async def task_reward(trace: Any, state: dict[str, Any]) -> tuple[float, dict[str, Any]]:
                """Your reward: here the bank's checker on the run's final server state."""
                verdict = suite.check(task, await episode.final_state(toolbox), trace.final_answer or "")
                return verdict.score, verdict.to_dict()

            task_reward.name = "task"  # the reward the trainer reads (GRPOConfig.reward)
            await record_run(agent, {"messages": [HumanMessage(content=task.instruction)]}, rewards=[task_reward],
                             store=store, group_id=task.id, task_id=task.id, suite="bank", model=policy.name)

        for task in writing_tasks(suite)[:tasks]:  # step 2: one group of K concurrent runs per task
            await asyncio.gather(*(one_run(task) for _ in range(k)))
    return out / "traces"


def train(traces: Path, out: Path, *, model: str | None, adapter: str | None, groups: int,
          **overrides: Any) -> list[dict[str, float]]:
    """Step 3: one GRPO step from the recorded runs, both roles, from the weights that recorded them."""
    config = GRPOConfig(model=model, adapter=adapter, steps=1, groups_per_step=groups, lr=1e-5, **overrides)
    return OfflineGRPO(config, traces, out / "grpo").run()


def main(model: str | None = None, out: str | Path = "runs/your-agent", *, tasks: int = 2, k: int = 2,
         policy: Any = None, max_new_tokens: int = 96, **overrides: Any) -> tuple[list[Any], list[dict[str, float]]]:
    out = Path(out)
    adapter = default_adapter(model, None)  # the embedded model's shipped adapter; none for other models
    if policy is None:
        short = SamplingParams(max_new_tokens=max_new_tokens)
        policy = load_policy(model, adapter=adapter, role_sampling={"act": short, "rehearse": short})
    traces = anyio.run(functools.partial(record, policy, out, tasks=tasks, k=k))
    records = train(traces, out, model=model, adapter=adapter, groups=tasks, **overrides)
    return list(TraceStore(traces).read()), records


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="Hugging Face id or folder (default: the embedded model)")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--k", type=int, default=2, help="runs per task (one GRPO group)")
    parser.add_argument("--out", default="runs/your-agent")
    ns = parser.parse_args()
    runs, steps = main(ns.model, ns.out, tasks=ns.tasks, k=ns.k)
    print(f"recorded {len(runs)} runs; rewards: {[r.reward('task').value if r.reward('task') else None for r in runs]}")
    print(f"GRPO step: {steps[-1]}")

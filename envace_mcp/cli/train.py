"""`envace train sft|grpo`: the options a run needs; every other setting through `-c` (`SFTConfig`,
`GRPOConfig`: a JSON file or key=value pairs). The run folder keeps them all in `setup.json`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import anyio
import typer

from envace_mcp.cli._common import (
    _config_layers,
    _fail,
    _holding,
    _model_name,
    _store,
    _suite,
    console,
    train_app,
)
from envace_mcp.errors import EnvaceError


@train_app.command("sft")
def train_sft_command(
    traces: Annotated[Path, typer.Option(exists=True, file_okay=False, help="trace folder (e.g. from `envace eval` or `envace lab reference`)")],
    out: Annotated[Path, typer.Option(file_okay=False, help="where the adapter (or model) and its setup.json are saved")],
    model: Annotated[Optional[str], typer.Option(callback=_model_name, help="base model (default: embedded SmolLM2)")] = None,
    adapter: Annotated[Optional[Path], typer.Option(exists=True, file_okay=False, help="continue training this LoRA adapter (its rank; it must have been trained on the runs' prompt formats)")] = None,
    epochs: Annotated[Optional[int], typer.Option(min=1, help="passes over the rows (default 2)")] = None,
    config: Annotated[Optional[list[str]], typer.Option(
        "--config", "-c", help="more settings (repeatable): a JSON file of SFTConfig fields, or key=value pairs, "
                               "e.g. -c lr=1e-4,lora=false,performance.micro_tokens=8192; roles=[act] or [rehearse] trains "
                               "one role's turns (docs/training.md)")] = None,
) -> None:
    """Behaviour cloning: act turns of successful runs, rehearse turns aimed at the real results."""
    from envace_mcp.config import build
    from envace_mcp.train.config import SFTConfig

    options = {"model": model, "adapter": str(adapter) if adapter else None, "epochs": epochs}
    try:
        settings = build(SFTConfig, *_config_layers(config, SFTConfig), {k: v for k, v in options.items() if v is not None},
                         where="envace train sft")
    except EnvaceError as exc:
        _fail(exc)
    if settings.adapter is not None and not Path(settings.adapter).is_dir():
        _fail(ValueError(f"adapter {settings.adapter!r}: no such adapter folder"))
    runs = list(_store(traces).read())  # read once, before anything heavy is imported
    if not runs:
        _fail(ValueError(f"--traces: no recorded runs in {str(traces)!r}"))
    from envace_mcp.policy.tool_text import adapter_formats, traces_rehearse_format, traces_tool_format, write_adapter_format

    try:
        tool_format = traces_tool_format(runs)  # mixed formats are refused before a model loads
        rehearse_format = traces_rehearse_format(runs)
    except EnvaceError as exc:
        _fail(exc)
    if settings.adapter is not None:
        try:
            learned = {"tool_format": "json", "rehearse_format": "simulator"} | adapter_formats(settings.adapter)
        except EnvaceError as exc:
            _fail(exc)
        recorded = {"tool_format": tool_format, "rehearse_format": rehearse_format}
        if learned != recorded:
            _fail(ValueError(f"adapter {settings.adapter!r} was trained on {learned}, the runs were recorded with "
                             f"{recorded}: record them in the adapter's formats"))
    from envace_mcp.train.run_setup import check_setup, write_setup

    source = {"traces": str(traces.resolve())}
    with _holding(out):  # one process per --out, held from before the model loads
        try:
            check_setup(out, "sft", settings, source)  # an adapter trained otherwise is not overwritten
        except EnvaceError as exc:
            _fail(exc)
        from envace_mcp._files import open_append
        from envace_mcp._progress import Progress
        from envace_mcp.engine.model import load_model
        from envace_mcp.policy.embedded import embedded_model_dir
        from envace_mcp.train.sft import sft_rows, steps_per_epoch, target_encoding, train_sft

        lm, tokenizer = load_model(settings.model or embedded_model_dir(), adapter=settings.adapter, trainable=True,
                                   dtype="checkpoint")  # the checkpoint's own dtype, as transformers loads it
        encode, end = target_encoding(tokenizer)
        rows = sft_rows(runs, encode, end, reward=settings.reward, min_reward=settings.min_reward,
                        roles=tuple(settings.roles))
        if not rows:
            _fail(ValueError(f"no SFT rows in {traces}: need successful runs with token ids (the bundled suites' "
                             "reference solutions: envace lab reference; your own agent's: docs/training.md)"))
        steps = settings.epochs * steps_per_epoch(rows, settings)
        with Progress("SFT", total=steps, console=console) as progress, \
                open_append(out / "metrics.jsonl", truncate=True) as log:

            def on_step(m: dict[str, float]) -> None:
                log.write(json.dumps(m) + "\n")
                log.flush()  # readable while training runs
                progress.advance(loss=round(m["loss"], 4))

            train_sft(lm, rows, tokenizer.pad_token_id or 0, settings, out=out, on_step=on_step)
        write_adapter_format(out, tool_format, rehearse_format)  # loading the adapter renders prompts the way it learned them
        tokenizer.save_pretrained(out)
        write_setup(out, "sft", settings, source)  # what this adapter was trained with
    console.print(f"trained on {len(rows)} rows; saved to {out}")


@train_app.command("grpo")
def train_grpo_command(
    out: Annotated[Path, typer.Option(file_okay=False, help="checkpoints, metrics.jsonl, metrics.png and setup.json go here")],
    traces: Annotated[Optional[Path], typer.Option(exists=True, file_okay=False,
                                                   help="offline: a trace folder of grouped, rewarded runs")] = None,
    suite: Annotated[Optional[str], typer.Option(help="online: roll out this bundled suite's train tasks (-c split=fit: less its validation ones)")] = None,
    k: Annotated[int, typer.Option(min=2, help="online: runs per task (GRPO group size)")] = 4,
    mode: Annotated[Literal["real", "simulated", "mixed"], typer.Option(
        help="online: where tool results come from: real (the suite's server; the shipped adapter was trained so), "
             "simulated (EnvACE's: the rehearse role answers; 75 % of its groups gave no signal, docs/evidence.md#grpo-arms) "
             "or mixed")] = "real",
    steps: Annotated[Optional[int], typer.Option(min=1, help="optimizer steps (over the config's; a longer run resumes)")] = None,
    reward: Annotated[Optional[str], typer.Option(
        help="offline, runs without a checker: train on outcomes (what the servers said), approvals (what the person "
             "said), judge:MODEL (a model ranking each task's runs: judge:embedded, a Hugging Face id or folder, or an "
             "init_chat_model id such as judge:openai:gpt-4.1-mini), or several weighted, e.g. outcomes=1,judge:embedded=2; "
             "runs lacking it are scored first and the reward saved in the trace folder (docs/training.md, Train "
             "without a checker)")] = None,
    rubric: Annotated[Optional[Path], typer.Option(exists=True, dir_okay=False,
                                                   help="the judge's rubric, a text file to edit (default: the bundled "
                                                        "judge_rubric.md)")] = None,
    config: Annotated[Optional[list[str]], typer.Option(
        "--config", "-c", help="more settings (repeatable): a JSON file of GRPOConfig fields, or key=value pairs, e.g. "
                               "-c lr=1e-5,split=fit,experimental.kinds=[transfer_funds] (docs/training.md)")] = None,
) -> None:
    """EnvACE role-wise GRPO, from recorded runs (--traces) or fresh rollouts (--suite); the same --out resumes."""
    if (traces is None) == (suite is None):
        _fail(ValueError("give exactly one of --traces (offline) or --suite (online rollouts)"))
    target = _suite(suite) if suite is not None else None  # an unknown suite fails first
    from envace_mcp.config import build
    from envace_mcp.train.config import GRPOConfig

    layers = _config_layers(config, GRPOConfig)
    scorer, scored = _reward(reward, traces, layers, rubric)
    try:
        settings = build(GRPOConfig, *layers, {"steps": steps} if steps else {},
                         {"reward": scored} if scored else {}, where="envace train grpo")
    except EnvaceError as exc:
        _fail(exc)
    if settings.adapter:
        from envace_mcp.policy.tool_text import adapter_formats

        try:
            adapter_formats(settings.adapter)  # a torn envace.json fails before the model loads
        except EnvaceError as exc:
            _fail(exc)
    if target is not None:
        from envace_mcp.envs.suites import tasks_of_kinds
        from envace_mcp.train.config import check_rollout_mode

        try:  # a misspelt kind, or a reward no rollout could earn, fails before the model loads
            tasks_of_kinds(target.split(settings.split), settings.experimental.kinds, settings.split)
            check_rollout_mode(settings, mode)
        except EnvaceError as exc:
            _fail(exc)
    elif settings.experimental.kinds:
        _fail(ValueError("experimental.kinds picks the tasks to roll out: it needs --suite (online)"))
    if traces is not None:
        from envace_mcp.train.config import refuse_unshaped, refuse_untrainable_act

        runs = list(_store(traces).read())  # read before the model loads, so runs GRPO cannot train fail first
        if scorer is not None:
            _score_runs(runs, scorer, scored, traces)
        try:
            refuse_untrainable_act(runs, settings)
            refuse_unshaped(runs, settings)
        except EnvaceError as exc:
            _fail(exc)
    source = {"traces": str(traces.resolve()) if traces is not None else None, "suite": suite,
              "k": k if suite else None, "mode": mode if suite else None}
    with _holding(out):  # one process per --out: two would tear its checkpoint and metrics
        _same_setup(out, settings, source)  # before the model loads
        from envace_mcp.train.trainer import OfflineGRPO

        try:
            if traces is not None:
                trainer: Any = OfflineGRPO(settings, _store(traces).directory, out, runs=runs)
            else:
                trainer = _online_trainer(settings, suite, out, k, mode)
            records = _interruptible(trainer.run)
        except EnvaceError as exc:
            _fail(exc)
    if records:
        console.print(f"step {records[-1]['step']}: loss {records[-1]['loss']:.4f}, reward {records[-1]['reward']:.3f}; "
                      f"metrics in {out / 'metrics.jsonl'}, plot {out / 'metrics.png'}")


def _reward(spec: str | None, traces: Path | None, layers: list[dict[str, Any]],
            rubric: Path | None = None) -> tuple[Any, str | None]:
    """`--reward`'s reward function (`train.rewards.reward_from`) and the name it records, or `(None, None)`;
    refused without --traces (online rollouts are scored by the suite's checker) or beside another
    `-c reward=`."""
    if spec is None:
        if rubric is not None:
            _fail(ValueError("--rubric is the judge's: give --reward judge:MODEL"))
        return None, None
    if traces is None:
        _fail(ValueError("--reward scores recorded runs: it needs --traces (online rollouts are scored by the "
                         "suite's checker)"))
    from envace_mcp.train.rewards import reward_from, reward_name

    try:
        scorer = reward_from(spec, rubric=rubric)
    except EnvaceError as exc:
        _fail(exc)
    name = reward_name(scorer)
    named = [layer["reward"] for layer in layers if isinstance(layer, dict) and "reward" in layer]
    if named and named[-1] != name:
        _fail(ValueError(f"--reward {spec} trains on '{name}', and --config names reward '{named[-1]}': give one"))
    return scorer, name


def _score_runs(runs: list[Any], scorer: Any, name: str, traces: Path) -> None:
    """Score the runs that lack the reward `name`, saved with them in the trace folder, and say so."""
    from envace_mcp._progress import Progress
    from envace_mcp.train.rewards import score_missing

    lacking = sum(run.reward(name) is None for run in runs)
    try:
        with Progress(f"scoring runs with {name}", total=lacking) as progress:
            added = score_missing(runs, scorer, _store(traces), on_scored=progress.advance)
    except EnvaceError as exc:
        _fail(exc)
    finally:
        getattr(scorer, "release", lambda: None)()  # a judge's model goes before the trainee's loads
    unscored = sum(r.value is None for r in added)
    console.print(f"scored {len(added)} of {len(runs)} runs with '{name}' (saved in {traces})"
                  + (f"; {unscored} could not be scored" if unscored else ""))


def _same_setup(out: Path, settings: Any, source: dict[str, Any]) -> None:
    """Resuming (`out` holds a checkpoint): refuse, in one line, another configuration or source than the
    run started with (`run_setup.check_setup`; `steps` and exact performance settings may change), then
    record what it goes on with. A fresh start records its setup."""
    from envace_mcp.train.run_setup import check_setup, checkpoint_settings, grpo_may_change, write_setup

    try:
        if (out / "checkpoint").exists():
            check_setup(out, "grpo", settings, source, may_change=grpo_may_change, recorded=checkpoint_settings(out))
        write_setup(out, "grpo", settings, source)
    except EnvaceError as exc:
        _fail(exc)


def _interruptible(run: Any) -> Any:
    """`run(progress=True)` with SIGTERM (a job scheduler's stop, `timeout`, `kill`) raised as an exit, so
    the trainer keeps the last completed step; Ctrl-C does the same."""
    with _stop_on_sigterm():
        try:
            return run(progress=True)
        except KeyboardInterrupt:
            raise SystemExit(130) from None


class _Stop(SystemExit):
    """The exit a SIGTERM raises."""


@contextlib.contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises `_Stop` in the main thread. A signal can land while a `__del__` or a weakref callback
    runs (the garbage collector's), where Python prints "Exception ignored" and drops the exception: the
    run went on after one SIGTERM (`timeout` sends one). A dropped stop is delivered again."""
    import os
    import signal
    import sys
    import threading

    def stop(signum: int, frame: Any) -> None:
        raise _Stop(128 + signum)

    def unraisable(info: Any) -> None:
        if isinstance(info.exc_value, _Stop):  # sent again from a thread: raised here, it would be dropped again
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
        else:
            hook(info)

    hook, sys.unraisablehook = sys.unraisablehook, unraisable
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = hook


def _online_trainer(settings: Any, suite_name: str, out: Path, k: int, mode: str) -> Any:
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.train.trainer import OnlineGRPO

    suite = _suite(suite_name)

    async def catalog() -> list[Any]:
        async with Toolbox({suite.name: suite.build_server()}) as toolbox:
            return list(toolbox.catalog)

    return OnlineGRPO(settings, suite, out, k=k, mode=mode, tools=anyio.run(catalog))  # rollouts sample as settings say

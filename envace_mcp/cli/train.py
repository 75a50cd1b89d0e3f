"""`envace train sft|grpo`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import anyio
import typer

from envace_mcp.cli._common import (
    RehearseTokensOpt,
    _fail,
    _holding,
    _model_name,
    _positive,
    _store,
    _suite,
    console,
    train_app,
)
from envace_mcp.errors import EnvaceError


@train_app.command("sft")
def train_sft_command(
    traces: Annotated[Path, typer.Option(exists=True, file_okay=False, help="trace folder (e.g. from `envace traces reference`)")],
    out: Annotated[Path, typer.Option(file_okay=False, help="where the adapter (or model) is saved")],
    model: Annotated[Optional[str], typer.Option(callback=_model_name, help="base model (default: embedded SmolLM2)")] = None,
    full: Annotated[bool, typer.Option("--full", help="full fine-tune instead of LoRA")] = False,
    epochs: Annotated[int, typer.Option(min=1)] = 2,
    lr: Annotated[Optional[float], typer.Option(callback=_positive, help="learning rate (default: 2e-4 LoRA, 1e-5 full)")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="rows per optimizer step")] = 16,
    min_reward: Annotated[float, typer.Option(help="runs whose task reward is below this are left out")] = 1.0,
    bf16: Annotated[Optional[bool], typer.Option("--bf16/--fp32", help="bf16 autocast (1.6-2.2x faster on AMX CPUs and GPUs, slower where bf16 is emulated); default: on where the CPU/GPU does bf16 natively")] = None,
    share_prefix: Annotated[bool, typer.Option(help="pack each micro-batch with its common prompt prefix once (exact)")] = True,
    micro_batch: Annotated[int, typer.Option(min=0, help="at most this many rows per forward pass (gradients accumulate over --batch-size); 0 = no limit")] = 32,
    micro_tokens: Annotated[int, typer.Option(min=0, help="with --share-prefix, at most this many packed tokens per pass; 0 = no limit")] = 4096,
    lora_r: Annotated[int, typer.Option(min=1, help="LoRA rank")] = 16,
    adapter: Annotated[Optional[Path], typer.Option(exists=True, file_okay=False, help="continue training this LoRA adapter (its rank; it must have been trained on the runs' prompt formats)")] = None,
    role: Annotated[Optional[list[str]], typer.Option(help="train only this role's turns: act or rehearse (repeatable; default: both)")] = None,
) -> None:
    """Behaviour cloning: act turns of successful runs, rehearse turns aimed at the real results."""
    unknown = sorted(set(role or ()) - {"act", "rehearse"})
    if unknown:
        _fail(ValueError(f"--role {', '.join(unknown)}: choose act or rehearse"))
    runs = list(_store(traces).read())  # read once, before anything heavy is imported
    if not runs:
        _fail(ValueError(f"--traces: no recorded runs in {str(traces)!r}"))
    from envace_mcp.policy.tool_text import adapter_formats, traces_rehearse_format, traces_tool_format, write_adapter_format

    try:
        tool_format = traces_tool_format(runs)  # mixed formats are refused before a model loads
        rehearse_format = traces_rehearse_format(runs)
    except EnvaceError as exc:
        _fail(exc)
    if adapter is not None:
        if full:
            _fail(ValueError("--adapter continues a LoRA adapter; --full trains every weight: choose one"))
        try:
            learned = {"tool_format": "json", "rehearse_format": "simulator"} | adapter_formats(adapter)
        except EnvaceError as exc:
            _fail(exc)
        recorded = {"tool_format": tool_format, "rehearse_format": rehearse_format}
        if learned != recorded:
            _fail(ValueError(f"--adapter {str(adapter)!r} was trained on {learned}, the runs were recorded with "
                             f"{recorded}: record them in the adapter's formats"))
    from envace_mcp._files import open_append
    from envace_mcp._progress import Progress
    from envace_mcp.engine.model import load_model
    from envace_mcp.policy.embedded import embedded_model_dir
    from envace_mcp.train.sft import SFTConfig, sft_rows, steps_per_epoch, target_encoding, train_sft

    with _holding(out):  # one process per --out, held from before the model loads
        lm, tokenizer = load_model(model or embedded_model_dir(), adapter=adapter, trainable=True,
                                   dtype="checkpoint")  # the checkpoint's own dtype, as transformers loads it
        encode, end = target_encoding(tokenizer)
        rows = sft_rows(runs, encode, end, min_reward=min_reward, roles=tuple(role or ("act", "rehearse")))
        if not rows:
            _fail(ValueError(f"no SFT rows in {traces}: need successful runs with token ids"))
        config = SFTConfig(epochs=epochs, batch_size=batch_size, lora=not full, lr=lr or (2e-4 if not full else 1e-5),
                           bf16="auto" if bf16 is None else bf16, share_prefix=share_prefix, micro_batch=micro_batch,
                           micro_tokens=micro_tokens or None, lora_r=lora_r, lora_alpha=2 * lora_r)
        steps = config.epochs * steps_per_epoch(rows, config)
        with Progress("SFT", total=steps, console=console) as progress, \
                open_append(out / "metrics.jsonl", truncate=True) as log:

            def on_step(m: dict[str, float]) -> None:
                log.write(json.dumps(m) + "\n")
                log.flush()  # readable while training runs
                progress.advance(loss=round(m["loss"], 4))

            train_sft(lm, rows, tokenizer.pad_token_id or 0, config, out=out, on_step=on_step)
        write_adapter_format(out, tool_format, rehearse_format)  # loading the adapter renders prompts the way it learned them
        tokenizer.save_pretrained(out)
    console.print(f"trained on {len(rows)} rows; saved to {out}")


@train_app.command("grpo")
def train_grpo_command(
    out: Annotated[Path, typer.Option(file_okay=False, help="checkpoints, metrics.jsonl and metrics.png go here")],
    traces: Annotated[Optional[Path], typer.Option(exists=True, file_okay=False,
                                                   help="offline: a trace folder of grouped, rewarded runs")] = None,
    suite: Annotated[Optional[str], typer.Option(help="online: roll out this bundled suite's train tasks")] = None,
    split: Annotated[Literal["train", "fit"], typer.Option(help="online: which tasks to roll out (fit: train without the validation tasks)")] = "train",
    k: Annotated[int, typer.Option(min=2, help="online: runs per task (GRPO group size)")] = 4,
    mode: Annotated[Literal["simulated", "real", "mixed"], typer.Option(help="online: where tool results come from")] = "simulated",
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 128,
    rehearse_max_new_tokens: RehearseTokensOpt = None,
    config: Annotated[Optional[Path], typer.Option(exists=True, dir_okay=False, help="GRPOConfig as JSON (every field optional)")] = None,
    steps: Annotated[Optional[int], typer.Option(min=1, help="optimizer steps (overrides the config)")] = None,
    kind: Annotated[Optional[list[str]], typer.Option(help="online: roll out only tasks of this kind (repeatable; overrides the config's kinds)")] = None,
) -> None:
    """EnvACE role-wise GRPO, from recorded runs (--traces) or fresh rollouts (--suite); the same --out resumes."""
    if (traces is None) == (suite is None):
        _fail(ValueError("give exactly one of --traces (offline) or --suite (online rollouts)"))
    target = _suite(suite) if suite is not None else None  # an unknown suite fails first
    from pydantic import ValidationError

    from envace_mcp.train.config import GRPOConfig

    try:
        settings = GRPOConfig(**(json.loads(config.read_text()) if config else {}))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(config)'}: {e['msg']}" for e in exc.errors())
        _fail(ValueError(f"bad GRPO config {str(config)!r}: {problems}"))
    except (ValueError, TypeError, OSError) as exc:
        _fail(ValueError(f"bad GRPO config {str(config)!r}: {exc}"))
    if settings.adapter:
        from envace_mcp.policy.tool_text import adapter_formats

        try:
            adapter_formats(settings.adapter)  # a torn envace.json fails before the model loads
        except EnvaceError as exc:
            _fail(exc)
    if steps is not None:
        settings.steps = steps
    if kind:
        if traces is not None:
            _fail(ValueError("--kind picks the tasks to roll out: it needs --suite (online)"))
        settings.kinds = kind
    if target is not None:
        from envace_mcp.eval.suites import tasks_of_kinds
        from envace_mcp.train.config import check_rollout_mode

        try:  # a misspelt kind, or a reward no rollout could earn, fails before the model loads
            tasks_of_kinds(target.split(split), settings.kinds, split)
            check_rollout_mode(settings, mode)
        except EnvaceError as exc:
            _fail(exc)
    if traces is not None:
        from envace_mcp.train.config import refuse_unshaped, refuse_untrainable_act

        runs = list(_store(traces).read())  # read before the model loads, so runs GRPO cannot train fail first
        try:
            refuse_untrainable_act(runs, settings)
            refuse_unshaped(runs, settings)
        except EnvaceError as exc:
            _fail(exc)
    with _holding(out):  # one process per --out: two would tear its checkpoint and metrics
        _same_setup(out, {"traces": str(traces.resolve()) if traces is not None else None, "suite": suite,
                          "split": split if suite else None, "k": k if suite else None, "mode": mode if suite else None,
                          "kinds": settings.kinds if suite else None, "max_new_tokens": max_new_tokens,
                          "rehearse_max_new_tokens": rehearse_max_new_tokens})  # before the model loads
        from envace_mcp.train.trainer import OfflineGRPO

        try:
            if traces is not None:
                trainer: Any = OfflineGRPO(settings, _store(traces).directory, out, runs=runs)
            else:
                trainer = _online_trainer(settings, suite, out, k, mode, max_new_tokens, split, rehearse_max_new_tokens)
            records = _interruptible(trainer.run)
        except EnvaceError as exc:
            _fail(exc)
    if records:
        console.print(f"step {records[-1]['step']}: loss {records[-1]['loss']:.4f}, reward {records[-1]['reward']:.3f}; "
                      f"metrics in {out / 'metrics.jsonl'}, plot {out / 'metrics.png'}")


SETUP = "setup.json"
"""What a GRPO run in an --out folder was started with; a resume with other flags is refused."""


def _same_setup(out: Path, setup: dict[str, Any]) -> None:
    """Refuse, in one line, to resume a run in `out` with another setup than it started with (a changed
    suite, split, k, mode or source would silently train on something else); record the setup on a
    fresh start. --steps and the config's other fields may change between resumes."""
    from envace_mcp._files import write_atomic

    path = out / SETUP
    if (out / "checkpoint").exists() and path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            _fail(ValueError(f"{path}: not readable ({exc}); resume with a new --out"))
        changed = [f"{key}={saved.get(key)!r} (now {value!r})" for key, value in setup.items() if saved.get(key) != value]
        if changed:
            _fail(ValueError(f"{out} holds a run started with other settings: {', '.join(changed)}; resume it with the "
                             "same flags, or start a new run with another --out"))
        return
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(setup, indent=1))


@train_app.command("plot")
def train_plot_command(
    runs: Annotated[list[Path], typer.Argument(exists=True, file_okay=False, help="training --out folders (each with a metrics.jsonl), e.g. one per arm")],
    out: Annotated[Path, typer.Option(dir_okay=False, help="the PNG to write")] = Path("runs.png"),
) -> None:
    """Learning curves of several runs in one PNG (reward, success, uniform groups, loss, ... over steps), one line per run."""
    missing = [str(run) for run in runs if not (run / "metrics.jsonl").exists()]
    if missing:
        _fail(ValueError(f"no metrics.jsonl in {', '.join(missing)}: give the --out folders of `envace train`"))
    names = [run.name for run in runs]
    labels = names if len(set(names)) == len(names) else [str(run) for run in runs]
    if len(set(labels)) != len(labels):
        _fail(ValueError("the same run twice: give each folder once"))
    from envace_mcp.train.metrics import plot_metrics

    if plot_metrics({label: run / "metrics.jsonl" for label, run in zip(labels, runs)}, out) is None:
        _fail(ValueError("nothing to plot: the runs have no completed step yet, or matplotlib is missing "
                         "(pip install 'envace-mcp[train]')"))
    console.print(f"{len(runs)} runs plotted to {out}")


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


def _online_trainer(settings: Any, suite_name: str, out: Path, k: int, mode: str, max_new_tokens: int,
                    split: str = "train", rehearse_max_new_tokens: int | None = None) -> Any:
    from envace_mcp.policy import SamplingParams
    from envace_mcp.policy.types import role_sampling
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.train.trainer import OnlineGRPO

    suite = _suite(suite_name)

    async def catalog() -> list[Any]:
        async with Toolbox({suite.name: suite.build_server()}) as toolbox:
            return list(toolbox.catalog)

    # no seed: each rollout draws its own; no critique entry: rollouts keep the policy's own critique sampling
    roles = role_sampling(SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0), rehearse_max_new_tokens)
    return OnlineGRPO(settings, suite, out, k=k, mode=mode, tools=anyio.run(catalog),
                      sampling={"act": roles["act"], "rehearse": roles["rehearse"]}, split=split)

"""`envace train sft|grpo`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import anyio
import typer

from envace_mcp.cli._common import _fail, _store, _suite, console, train_app
from envace_mcp.errors import EnvaceError


@train_app.command("sft")
def train_sft_command(
    traces: Annotated[Path, typer.Option(help="trace folder (e.g. from `envace traces reference`)")],
    out: Annotated[Path, typer.Option(help="where the adapter (or model) is saved")],
    model: Annotated[Optional[str], typer.Option(help="base model (default: embedded SmolLM2)")] = None,
    full: Annotated[bool, typer.Option("--full", help="full fine-tune instead of LoRA")] = False,
    epochs: int = 2,
    lr: Optional[float] = None,
    batch_size: Annotated[int, typer.Option(help="rows per optimizer step")] = 16,
    min_reward: float = 1.0,
    bf16: Annotated[bool, typer.Option("--bf16", help="bf16 autocast (1.6-2.2x faster on AMX CPUs and GPUs)")] = False,
    share_prefix: Annotated[bool, typer.Option(help="pack each micro-batch with its common prompt prefix once (exact)")] = True,
    micro_batch: Annotated[int, typer.Option(help="rows per forward pass (gradients accumulate over --batch-size); 0 = all")] = 4,
    lora_r: int = 16,
) -> None:
    """Behaviour cloning: act turns of successful runs, rehearse turns aimed at the real results."""
    from rich.progress import Progress
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_mcp.policy.embedded import embedded_model_dir
    from envace_mcp.train.sft import SFTConfig, sft_rows, target_encoding, train_sft

    name = model or str(embedded_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(name)
    lm = AutoModelForCausalLM.from_pretrained(name)
    encode, end = target_encoding(tokenizer)
    rows = sft_rows(_store(traces).read(), encode, end, min_reward=min_reward)
    if not rows:
        _fail(ValueError(f"no SFT rows in {traces}: need successful runs with token ids"))
    config = SFTConfig(epochs=epochs, batch_size=batch_size, lora=not full, lr=lr or (2e-4 if not full else 1e-5),
                       bf16=bf16, share_prefix=share_prefix, micro_batch=micro_batch, lora_r=lora_r, lora_alpha=2 * lora_r)
    out.mkdir(parents=True, exist_ok=True)
    with Progress(console=console) as progress, open(out / "metrics.jsonl", "w") as log:
        bar = progress.add_task("SFT", total=config.epochs * ((len(rows) + batch_size - 1) // batch_size))

        def on_step(m: dict[str, float]) -> None:
            log.write(json.dumps(m) + "\n")
            log.flush()  # readable while training runs
            progress.update(bar, advance=1, description=f"SFT loss {m['loss']:.3f}")

        train_sft(lm, rows, tokenizer.pad_token_id or 0, config, out=out, on_step=on_step)
    tokenizer.save_pretrained(out)
    console.print(f"trained on {len(rows)} rows; saved to {out}")


@train_app.command("grpo")
def train_grpo_command(
    out: Annotated[Path, typer.Option(help="checkpoints, metrics.jsonl and metrics.png go here")],
    traces: Annotated[Optional[Path], typer.Option(help="offline: a trace folder of grouped, rewarded runs")] = None,
    suite: Annotated[Optional[str], typer.Option(help="online: roll out this bundled suite's train tasks")] = None,
    k: Annotated[int, typer.Option(help="online: runs per task (GRPO group size)")] = 4,
    mode: Annotated[str, typer.Option(help="online: simulated (EnvACE), real or mixed")] = "simulated",
    max_new_tokens: int = 128,
    config: Annotated[Optional[Path], typer.Option(help="GRPOConfig as JSON (every field optional)")] = None,
    steps: Optional[int] = None,
) -> None:
    """EnvACE role-wise GRPO, from recorded runs (--traces) or fresh rollouts (--suite); the same --out resumes."""
    from pydantic import ValidationError

    from envace_mcp.train.trainer import GRPOConfig, OfflineGRPO

    if (traces is None) == (suite is None):
        _fail(ValueError("give exactly one of --traces (offline) or --suite (online rollouts)"))
    if mode not in ("simulated", "real", "mixed"):
        _fail(ValueError("--mode must be simulated, real or mixed"))

    try:
        settings = GRPOConfig(**(json.loads(config.read_text()) if config else {}))
    except (ValidationError, ValueError, OSError) as exc:
        _fail(ValueError(f"bad GRPO config: {exc}"))
    if steps is not None:
        settings.steps = steps
    try:
        if traces is not None:
            trainer: Any = OfflineGRPO(settings, _store(traces).directory, out)
        else:
            trainer = _online_trainer(settings, suite, out, k, mode, max_new_tokens)
        records = trainer.run(progress=True)
    except EnvaceError as exc:
        _fail(exc)
    if records:
        console.print(f"step {records[-1]['step']}: loss {records[-1]['loss']:.4f}, reward {records[-1]['reward']:.3f}; "
                      f"metrics in {out / 'metrics.jsonl'}, plot {out / 'metrics.png'}")


def _online_trainer(settings: Any, suite_name: str, out: Path, k: int, mode: str, max_new_tokens: int) -> Any:
    from envace_mcp.policy import SamplingParams
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.train.trainer import OnlineGRPO

    suite = _suite(suite_name)

    async def catalog() -> list[Any]:
        async with Toolbox({suite.name: suite.build_server()}) as toolbox:
            return list(toolbox.catalog)

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    return OnlineGRPO(settings, suite, out, k=k, mode=mode, tools=anyio.run(catalog),
                      sampling={"act": params, "rehearse": params})

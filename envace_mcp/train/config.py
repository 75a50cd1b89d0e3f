"""GRPO's configuration: one JSON file, every default with its reason."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envace_mcp.errors import UserError
from envace_mcp.traces.schema import Trace


class GRPOConfig(BaseModel):
    """One config file for GRPO (JSON). Every default says why."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    """Hugging Face id or folder; None = the embedded SmolLM2 (what the traces were recorded with)."""
    adapter: str | None = None
    """Start from this LoRA adapter (e.g. the SFT warm start)."""
    lora: bool = True
    """Train a LoRA adapter: small to ship, and the base stays a shared reference."""
    lora_r: int = 16
    lora_alpha: int = 32
    lr: float = 1e-5
    """EnvACE used 1e-6 for full fine-tuning of 8B; LoRA on small models needs more."""
    epsilon: float = 0.2
    """EnvACE's clip range."""
    epsilon_high: float | None = None
    """DAPO's asymmetric upper clip; None = symmetric."""
    beta: float = 0.0
    """KL off, as EnvACE (1e-4 when on); β = 0 needs no reference forward pass. With β > 0 each micro-batch
    also runs the reference: the base model with the adapter disabled (LoRA, as TRL with peft: no second
    copy), or a frozen copy of the starting weights (full fine-tune)."""
    skip_zero_advantage: bool = True
    """With β = 0, segments whose advantage is exactly 0 (a group whose runs all scored alike) add exactly
    0 to the loss and the gradient: the step leaves them out of the forward/backward passes (same update,
    same loss; ratio/clip metrics then cover the scored tokens). After SFT on the bank suite most groups are
    like that: 7 of 8 in a 2-step act-only online run, whose second update spent 13 min on a zero gradient."""
    dynamic_sampling: int = 0
    """Online GRPO, DAPO's dynamic sampling: a group whose runs all scored alike has advantage 0 everywhere
    and teaches nothing; with N > 0 such groups are dropped and up to N further rounds of rollouts draw
    the next tasks of the seeded order in their place, until `groups_per_step` groups carry signal (or
    the rounds run out: the step trains on those it has). 0: off, the step keeps every group. Either way
    each step logs `uniform_groups` (the fraction of the groups it rolled out that carried no signal) and
    `rolled_groups`. After SFT on bank, 7 of 8 groups were uniform in a 2-step run."""
    kinds: list[str] | None = None
    """Online GRPO: roll out only the split's tasks of these kinds (`Task.kind`); None: every kind. For
    groups with signal, point it at the kinds a validation run scored neither 0 nor 1 (the issue's
    "middling" tasks): a kind the start adapter always or never solves rolls out uniform groups."""
    loss_type: Literal["token_mean", "sequence_mean", "dr_grpo", "dapo"] = "token_mean"
    """EnvACE aggregates by token mean. Two deliberate differences from TRL's same-named losses:
    `token_mean` divides by every completion token of the *step* (all micro-batches and ranks: one step's
    loss does not depend on how it is cut), where TRL's `bnpo` divides per micro-batch (equal with one
    micro-batch per step); `dr_grpo` divides by B x the step's *longest* completion, where TRL divides by
    its configured `max_completion_length` (equal when a completion reaches that limit)."""
    scale_rewards: Literal["none", "group", "batch"] = "none"
    """EnvACE divides by no std."""
    advantage: Literal["role", "trajectory"] = "role"
    """"role": EnvACE's per-(task, role) baselines over segments (a longer run weighs more);
    "trajectory": standard GRPO, the baseline is the mean over the group's runs, each counted once."""
    roles: list[str] = Field(default_factory=lambda: ["act", "rehearse"])
    """Which roles carry loss; ["act"] is the act-only GRPO ablation."""
    reward: str = "task"
    """The reward name read from the traces."""
    steps: int = 10
    groups_per_step: int = 4
    """EnvACE: 16 tasks x 4 rollouts per step on 16 GPUs; 4 groups fit a CPU."""
    micro_batch: int = 32
    """At most this many segments per forward pass (gradient accumulation inside one step). With
    `share_prefix` a pass is also cut at `micro_tokens` packed tokens, and a trajectory's turns, in
    prompt order, nest in one sequence: each act turn's prompt repeats the last one's prompt and
    completion, so the run costs its longest sequence, not the sum of its turns."""
    micro_tokens: int | None = 4096
    """With `share_prefix`: at most this many packed tokens per pass (what activation memory follows);
    a longer single segment gets a pass of its own. None: cut by `micro_batch` only."""
    max_grad_norm: float = 1.0
    """EnvACE's grad clip."""
    seed: int = 0
    checkpoint_every: int = 5
    fidelity_weight: float = 0.0
    """Beyond EnvACE (off): a rehearsal whose call really ran (real mode; in mixed mode only reads run, and
    they are rehearsed only under `GateConfig(rehearse="all")`: `check_rollout_mode`) is rewarded
    task reward + w x its match score against the real result, so the world model is pushed
    towards what happened; rehearsals without a real result keep the task reward."""
    call_f1_weight: float = 0.0
    """Beyond EnvACE (off): every segment of a run is rewarded task reward + w x the run's tool-call F1
    against its task's reference calls (the `call_f1` reward `envace eval` and GRPO's rollouts record:
    FinMCP-Bench's metric), so a group whose runs all score the same on the task still ranks those that
    made more of the right calls. Needs tasks with reference calls (the bundled suites); recorded runs of
    your own agent have none. Of the 34 groups the shipped adapter's continued bank runs rolled out, 18
    scored alike on the task and 4 alike with w = 0.5 (benchmarks/group_signal.py)."""
    real_output_ce: float = 0.0
    """Beyond EnvACE (off): weight of a cross-entropy term teaching the rehearse role the recorded
    real tool outputs (as SFT does), added to the GRPO loss (mean over those target tokens)."""
    share_prefix: bool = True
    """Micro-batches packed into one sequence with their common prompt prefix once (exact: the same
    gradients for fewer tokens); CPU models attend the parts separately (no N×N mask). Online GRPO
    step on the embedded model (`benchmarks/grpo_memory.py --steps 1`): update 69 s and 2.96 GB peak
    vs 174 s and 3.10 GB one segment at a time; TRL-shaped groups (`benchmarks/grpo_vs_trl.py`):
    5.90x TRL's update vs 1.86x unpacked."""
    gradient_checkpointing: bool = True
    """Tool-schema prompts are ~2k tokens: without it SmolLM2 holds ~2 MB of activations per token."""
    bf16: bool | Literal["auto"] = "auto"
    """bf16 autocast for the update's forward pass (faster on AMX CPUs / GPUs, slower where bf16 is emulated;
    ratios then carry bf16 noise); "auto": on where the device does bf16 natively (`ENVACE_DTYPE` pins it)."""
    mmap_threshold_mb: float | None = 1.0
    """Allocations of this size or more get their own mmap, handed back when freed (`rows.cap_heap_blocks`;
    glibc only, process-wide). Online GRPO from the shipped bank adapter (runs of up to 12 calls) peaked
    at 7.0 GB in rollouts and 6.6 GB in the update with glibc's default; the packed passes' freed heap
    blocks were most of it. None: glibc's default (faster passes, more memory)."""
    rollout_prefix_cache_tokens: int = 16384
    """Online GRPO: the rollout policy's prefix cache (prompt keys/values kept for reuse; 46 KB a token for
    the embedded model in fp32: 0.75 GB). Inference keeps 32,768; in training it sits next to the decode
    batch and the weights, and each step starts it empty anyway."""
    rollout_server: str | None = None
    """Online GRPO: roll out on a vLLM server instead of our engine, e.g. "vllm:http://127.0.0.1:8000/v1"
    (serving the same base model, with `--enable-lora`, runtime LoRA updating and `--logprobs-mode
    processed_logprobs`; docs/scaling.md). Before each step's rollouts the adapter being trained is saved
    to `out/served/step-N` and hot-loaded as "step-N"; traces record it (`metadata.weights`). LoRA only."""
    tis_cap: float = 2.0
    """With `rollout_server`: the cap of the truncated importance weight that corrects the mismatch between
    the server's logprobs and ours (`grpo.grpo_loss`)."""
    rollout_kv_gb: float | Literal["auto"] | None = "auto"
    """Online GRPO: the rollout policy's `kv_budget_gb` (decode-batch keys/values); "auto": 1 GB on CPU, no
    limit on accelerators. Long runs in fp32 are 46 KB a token for the embedded model: 16 rows of ~3.6k
    columns would be 2.6 GB."""


def rollout_kv_gb(setting: float | str | None, model: Any) -> float | None:
    if setting == "auto":
        return 1.0 if next(model.parameters()).device.type == "cpu" else None
    return setting  # type: ignore[return-value]


def check_rollout_mode(config: GRPOConfig, mode: str, gate: Any = None) -> None:
    """Online GRPO: refuse a reward no rollout could earn. The fidelity reward scores rehearsals whose call
    really ran, which the gate (`graph.gate.rehearses_real_calls`; None: the default `GateConfig`) never
    allows in simulated mode, nor in mixed mode unless it rehearses reads; real-output CE needs real calls."""
    from envace_mcp.graph.gate import GateConfig, rehearses_real_calls

    gate = gate or GateConfig()
    if config.fidelity_weight and not rehearses_real_calls(mode, gate):  # type: ignore[arg-type]
        raise UserError(f"fidelity_weight rewards rehearsals whose call really ran, and {mode} mode with "
                        f"rehearse={gate.rehearse!r} has none: use --mode real (or mixed with a gate that "
                        "rehearses all calls), or set fidelity_weight to 0")
    if config.real_output_ce and mode == "simulated":
        raise UserError("real_output_ce teaches real tool outputs, and simulated mode has none: use --mode "
                        "real or mixed, or set real_output_ce to 0")


def refuse_untrainable_act(traces: list[Trace], config: GRPOConfig) -> None:
    """Offline GRPO training the act role needs the logprobs each act turn was sampled with; runs whose act
    turns have none (a foreign chat model wrote them, or teacher-forced turns recorded without scores) are
    refused with what to do instead, rather than silently trained on one role only. Light (no torch): the
    CLI checks before the model loads."""
    if "act" not in config.roles:
        return
    bad = [t for t in traces if any(s.role == "act" and s.logprobs is None for s in t.steps)]
    if not bad:
        return
    models = sorted({str(t.model) for t in bad})
    raise UserError(f"{len(bad)} of {len(traces)} recorded runs have act turns without sampling logprobs (model: "
                    f"{', '.join(models)}): GRPO needs the probabilities the act role sampled each token with, and a "
                    "chat model other than this policy gives none. Put policy.as_chat_model() behind the agent and "
                    "record again, train the rehearse role only ({\"roles\": [\"rehearse\"]}), or use these runs "
                    "for SFT")


def refuse_unshaped(traces: list[Trace], config: GRPOConfig) -> None:
    """With `call_f1_weight`, every run GRPO would train on (it has the config's reward and tokens of a
    trained role; `rows.segments`) must carry a 'call_f1' reward to shape with. Light, as above."""
    if not config.call_f1_weight:
        return
    trained = [t for t in traces if (r := t.reward(config.reward)) is not None and r.value is not None
               and any(s.role in config.roles and s.prompt_ids is not None and s.completion_ids for s in t.steps)]
    unshaped = [t for t in trained if (f := t.reward("call_f1")) is None or f.value is None]
    if unshaped:
        raise UserError(f"call_f1_weight adds each run's tool-call F1 against its task's reference calls, and "
                        f"{len(unshaped)} of {len(trained)} runs have no 'call_f1' reward (only runs of a bundled "
                        "suite's tasks, recorded by envace eval or GRPO's rollouts, carry one): set call_f1_weight "
                        "to 0")

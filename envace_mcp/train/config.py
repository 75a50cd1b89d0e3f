"""Training settings: `GRPOConfig` and `SFTConfig`, each one `Settings` model (a JSON file, `-c key=value`
on the command line, or Python), every default with its reason.

Each keeps its core settings at the top level and groups the rest: `performance` holds exact speed and
memory settings (the same update, faster or in less memory; `SFTPerformance`, which GRPO's extend), and
GRPO's `experimental` holds what goes beyond EnvACE, off by default. A flat file written before the
groups existed (`{"micro_batch": 8, "kinds": [...]}`) still reads: each such key moves into its group.
What the defaults cost and buy, measured: docs/benchmarks.md and docs/evidence.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, model_validator

from envace_mcp.config import Settings
from envace_mcp.errors import UserError
from envace_mcp.traces.schema import Trace

if TYPE_CHECKING:
    import torch

    from envace_mcp.graph.gate import GateConfig


class SFTPerformance(Settings):
    """How an update's forward/backward passes are cut and run. Exact: the same gradients (up to float
    rounding, and bf16's own), faster or in less memory. GRPO's (`GRPOPerformance`) add their own."""

    micro_batch: int = Field(default=32, ge=0)
    """At most this many rows (turns) per forward pass; gradients accumulate over the optimizer step.
    0: no limit."""
    micro_tokens: int | None = Field(default=4096, ge=1)
    """With `share_prefix`: at most this many packed tokens per pass, which is what activation memory
    follows (a single longer row gets a pass of its own). None: passes are cut by `micro_batch` only."""
    share_prefix: bool = True
    """Pack each pass into one sequence as a prefix tree (`rows.Batch`): the prompt prefix its rows share
    once, and a run's turns nested in one sequence (each act prompt repeats the last turn's prompt and
    completion), so a run costs its longest sequence rather than the sum of its turns; the same gradients
    for far fewer tokens. On CPU the parts are attended one by one (`engine.attention.PackedRows`), not
    under an N×N mask, which CPU kernels walk slowly."""
    bf16: bool | Literal["auto"] = "auto"
    """bf16 autocast for the forward pass: faster where the CPU (AMX) or GPU does bf16 natively, slower
    where it is emulated, and log-probs then carry bf16 rounding. "auto": on where the device does bf16
    natively (`engine.model.autocast_bf16`; `ENVACE_DTYPE` pins it)."""
    gradient_checkpointing: bool = True
    """Tool-schema prompts run to ~2k tokens, and SmolLM2 keeps ~2 MB of activations a token without it:
    activations are recomputed in the backward pass instead (all but the attention kernel's outputs,
    which are kept: `rows.checkpoint_kwargs`)."""
    mmap_threshold_mb: float | None = None
    """Allocations of this many MB or more get their own mmap, handed back to the OS when freed
    (`heap.cap_heap_blocks`; glibc only, process-wide): a lower peak, paid for in page faults. None:
    glibc's default, the faster one; SFT's batches are steady enough for it."""


class GRPOPerformance(SFTPerformance):
    """SFT's performance settings, plus GRPO's own: skipping passes that cannot change the update, and the
    memory of the online rollouts that share the process with the update."""

    skip_zero_advantage: bool = True
    """With β = 0 a segment whose advantage is exactly 0 (its group's runs all scored alike) adds exactly 0
    to the loss and the gradient: the step leaves it out of the forward/backward passes. The same update
    and loss; the ratio and clip metrics then cover the scored tokens only. After SFT many groups are
    like that, and each would cost full passes for nothing."""
    mmap_threshold_mb: float | None = 1.0
    """As for SFT, but on by default: rollouts and updates alternate, and the packed passes of long runs
    (varying sizes, step after step) leave freed heap blocks that glibc's default keeps, so the process
    grows well past what is live. Higher is faster for more memory: an update of 4 reference runs took
    0.68x the time at 8 MB (2.46 GB peak instead of 1.83; 4 MB: 0.78x at 2.11 GB; 32 MB: 0.68x at
    2.85 GB); None, glibc's default: 0.69x at 2.92 GB. With the shipped adapter the update is the online
    step's peak (2.64 GB, its rollouts 2.60)."""
    rollout_prefix_cache_tokens: int = Field(default=16384, ge=0)
    """Online: the rollout policy's prefix cache (prompt keys/values kept for reuse; 46 KB a token for the
    embedded model in fp32, so 0.75 GB). Inference keeps 32,768; in training the cache sits next to the
    decode batch and the weights, and each step starts it empty anyway."""
    rollout_kv_gb: float | Literal["auto"] | None = "auto"
    """Online: the rollout policy's `kv_budget_gb` (the decode batch's keys/values). "auto": 1 GB on CPU,
    no limit on accelerators: long runs in fp32 take 46 KB a token for the embedded model, so 16 rows of
    ~3.6k columns would hold 2.6 GB."""


class GRPOExperimental(Settings):
    """Beyond EnvACE: each is off by default and changes what is trained, not how fast. Whether one helps
    is a question for a validation run (docs/evidence.md has the ones measured)."""

    fidelity_weight: float = Field(default=0.0, ge=0.0)
    """A rehearsal whose call really ran (real mode; in mixed mode only reads run, and they are rehearsed
    only under `GateConfig(rehearse="all")`: `check_rollout_mode`) is rewarded task reward + w × its match
    score against the real result, pushing the world model towards what happened; rehearsals without a
    real result keep the task reward."""
    call_f1_weight: float = Field(default=0.0, ge=0.0)
    """Every segment of a run is rewarded task reward + w × the run's tool-call F1 against its task's
    reference calls (the `call_f1` reward `envace eval` and online rollouts record; FinMCP-Bench's
    metric), so a group whose runs all score alike on the task still ranks those that made more of the
    right calls. Needs tasks with reference calls (the bundled suites); recorded runs of your own agent
    have none (`refuse_unshaped`). `python -m envace_mcp.lab.analyses.group_signal` counts the groups
    it would give a signal."""
    real_output_ce: float = Field(default=0.0, ge=0.0)
    """Weight of a cross-entropy term that teaches the rehearse role the recorded real tool outputs (as
    SFT does), added to the GRPO loss (mean over those target tokens). Needs real calls (real or mixed
    mode)."""
    dynamic_sampling: int = Field(default=0, ge=0)
    """Online, DAPO's dynamic sampling: a group whose runs all scored alike has advantage 0 everywhere
    and teaches nothing; with N > 0 such groups are dropped and up to N further rounds of rollouts draw
    the next tasks of the seeded order in their place, until `groups_per_step` groups carry signal (or
    the rounds run out: the step trains on those it has). It still pays for the dropped groups' rollouts.
    Either way each step logs `uniform_groups` (the fraction of its groups without signal) and
    `rolled_groups`. One process only."""
    kinds: list[str] | None = None
    """Online: roll out only the split's tasks of these kinds (`Task.kind`); None: every kind. For groups
    with signal, name the kinds a validation run of the start adapter scored neither 0 nor 1: a kind it
    always or never solves rolls out uniform groups."""


def _moved(groups: dict[str, type[BaseModel]]) -> dict[str, str]:
    """Where each grouped key lives now, for the one-line error a flat `-c key=value` gets."""
    return {key: f"it is {group}.{key}" for group, model in groups.items() for key in model.model_fields}


def _regroup(model: Any, data: Any) -> Any:
    """`data` with the keys of `model`'s groups that were written at the top level (flat, as before the
    groups existed) moved into their group; a value the group itself sets wins."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for group, settings in model.GROUPS.items():
        flat = {key: data.pop(key) for key in list(data) if key in settings.model_fields}
        if flat:
            inner = data.get(group)
            inner = inner.model_dump(exclude_unset=True) if isinstance(inner, BaseModel) else inner or {}
            data[group] = {**flat, **inner} if isinstance(inner, dict) else inner
    return data


def _lax(kind: type, value: Any) -> Any:
    """`value` read as pydantic reads a field of `kind` ("no" → False, "8" → 8), or None if it is not one."""
    try:
        return TypeAdapter(kind).validate_python(value)
    except ValidationError:
        return None


class GRPOConfig(Settings):
    """EnvACE's role-wise GRPO, offline or online (`envace train grpo -c ...`, `OfflineGRPO`, `OnlineGRPO`).
    Every default says why."""

    GROUPS: ClassVar[dict[str, type[Settings]]] = {"experimental": GRPOExperimental, "performance": GRPOPerformance}
    MOVED: ClassVar[dict[str, str]] = _moved(GROUPS)

    model: str | None = None
    """Hugging Face id or folder; None: the embedded SmolLM2 (what the bundled traces were recorded with)."""
    adapter: str | None = None
    """Start from this LoRA adapter (e.g. the SFT warm start) and train it on."""
    lora: bool = True
    """Train a LoRA adapter: small to ship, and the base model stays the shared reference for β > 0."""
    lora_r: int = Field(default=16, ge=1)
    """The usual starting rank for small models (a new adapter; one given as `adapter` keeps its own)."""
    lora_alpha: int = Field(default=32, ge=1)
    """2 × `lora_r`, the usual scaling."""
    lr: float = Field(default=1e-5, gt=0)
    """EnvACE used 1e-6 for full fine-tuning of 8B; LoRA on small models needs more."""
    epsilon: float = Field(default=0.2, ge=0)
    """EnvACE's clip range."""
    epsilon_high: float | None = Field(default=None, ge=0)
    """DAPO's asymmetric upper clip; None: symmetric."""
    beta: float = Field(default=0.0, ge=0)
    """KL off, as EnvACE (1e-4 when on); β = 0 needs no reference forward pass. With β > 0 each pass also
    runs the reference: the base model with the adapter disabled (LoRA, as TRL with peft: no second
    copy), or a frozen copy of the starting weights (full fine-tune)."""
    loss_type: Literal["token_mean", "sequence_mean", "dr_grpo", "dapo"] = "token_mean"
    """EnvACE aggregates by token mean. Two deliberate differences from TRL's same-named losses:
    `token_mean` divides by every completion token of the *step* (all passes and ranks: a step's loss does
    not depend on how it is cut), where TRL's `bnpo` divides per micro-batch (equal with one micro-batch
    per step); `dr_grpo` divides by B × the step's *longest* completion, where TRL divides by its
    configured `max_completion_length` (equal when a completion reaches that limit)."""
    scale_rewards: Literal["none", "group", "batch"] = "none"
    """EnvACE divides by no std."""
    advantage: Literal["role", "trajectory"] = "role"
    """"role": EnvACE's per-(task, role) baselines over segments (a longer run weighs more);
    "trajectory": standard GRPO, the baseline is the mean over the group's runs, each counted once."""
    roles: list[Literal["act", "rehearse"]] = Field(default_factory=lambda: ["act", "rehearse"], min_length=1)
    """Which roles carry loss: EnvACE trains both; ["act"] is the act-only ablation, ["rehearse"] trains
    the world model alone (runs of a chat model without sampling logprobs)."""
    reward: str = "task"
    """The reward read from the traces (the bundled suites' checkers write "task"; runs without a checker can
    be scored from what the servers and the person said: `train.rewards`, `envace train grpo --reward`)."""
    steps: int = Field(default=10, ge=1)
    """Optimizer steps: a short run whose curves show whether anything moves; a real run sets it (a longer
    run resumes in the same folder)."""
    groups_per_step: int = Field(default=4, ge=1)
    """EnvACE: 16 tasks × 4 rollouts per step on 16 GPUs; 4 groups fit a CPU."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """EnvACE's gradient clip."""
    seed: int = 0
    """Seeds a new adapter's initialisation and the order groups (offline) or tasks (online) are drawn in;
    the order is checkpointed, so a resumed run sees the same data."""
    checkpoint_every: int = Field(default=5, ge=1)
    """Steps between checkpoints; a LoRA run stopped in between first saves its last completed step."""
    split: Literal["train", "fit"] = "train"
    """Online: which of the suite's tasks are rolled out. `fit` is `train` without its `validation` tasks,
    so checkpoints and settings are chosen on tasks never trained on (docs/training.md, Validation)."""
    max_new_tokens: int = Field(default=128, ge=1)
    """Online: tokens per act turn of a rollout, enough for a tool call or a short answer; every token is
    paid for twice, sampled in the rollout and scored in the update."""
    rehearse_max_new_tokens: int | None = Field(default=None, ge=1)
    """Online: the rehearse role's own budget; None: `max_new_tokens`. A tool's reply can be far longer
    than a call, and a rehearsal cut short parses as no prediction (runs outside training give it
    `policy.types.REHEARSE_MAX_NEW_TOKENS`)."""
    rollout_server: str | None = None
    """Online: roll out on a vLLM server instead of our engine, e.g. "vllm:http://127.0.0.1:8000/v1"
    (serving the same base model, with `--enable-lora`, runtime LoRA updating and `--logprobs-mode
    processed_logprobs`; docs/scaling.md). Before each step's rollouts the adapter being trained is saved
    to `out/served/step-N` and hot-loaded as "step-N"; traces record it (`metadata.weights`). LoRA only.
    Not a performance setting: the server's logprobs differ from ours (see `tis_cap`)."""
    tis_cap: float = Field(default=2.0, gt=0)
    """With `rollout_server`: the cap of the truncated importance weight that corrects the mismatch
    between the server's logprobs and ours (`grpo.grpo_loss`)."""
    experimental: GRPOExperimental = Field(default_factory=GRPOExperimental)
    """Beyond EnvACE, off by default."""
    performance: GRPOPerformance = Field(default_factory=GRPOPerformance)
    """Exact speed and memory settings."""

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """A file (or keyword arguments) written before the groups existed reads as the new shape."""
        return _regroup(cls, data)


class SFTConfig(Settings):
    """Behaviour cloning from recorded runs (`envace train sft -c ...`, `train_sft`), LoRA or full
    fine-tune. Every default says why."""

    GROUPS: ClassVar[dict[str, type[Settings]]] = {"performance": SFTPerformance}
    MOVED: ClassVar[dict[str, str]] = _moved(GROUPS)

    model: str | None = None
    """What `envace train sft` loads (`train_sft` takes the model itself): a Hugging Face id or folder;
    None: the embedded SmolLM2 (what the bundled traces were recorded with)."""
    adapter: str | None = None
    """Go on training this LoRA adapter (its rank) instead of starting one; the runs must be recorded in
    the prompt formats it learned (`envace train sft` checks before loading)."""
    roles: list[Literal["act", "rehearse"]] = Field(default_factory=lambda: ["act", "rehearse"], min_length=1)
    """Whose turns `envace train sft` trains (`sft_rows`): both, as a warm start; ["rehearse"] teaches a
    world model the real replies of the agent's own calls, ["act"] the act role alone."""
    min_reward: float = 1.0
    """Act turns come only from runs whose reward is at least this: cloning copies what it is shown, so
    only successful runs (rehearse turns are aimed at the real results of any run)."""
    reward: str = "task"
    """The reward `min_reward` reads (the bundled suites' checkers write "task")."""
    epochs: int = Field(default=2, ge=1)
    """Two passes fit a few hundred reference runs without memorising them."""
    lr: float = Field(default=2e-4, gt=0)
    """Default: 2e-4 with LoRA (a usual LoRA rate), 1e-5 for a full fine-tune (`lora: false`)."""
    batch_size: int = Field(default=16, ge=1)
    """Rows per optimizer step; with `performance.share_prefix` a batch holds whole runs where it can (a
    run cut between two batches would pay for its longest sequence in both)."""
    lora: bool = True
    """LoRA keeps the base model shared and the adapter small enough to ship; false trains every weight."""
    lora_r: int = Field(default=16, ge=1)
    """The usual starting rank for small models (an `adapter` keeps its own)."""
    lora_alpha: int = Field(default=32, ge=1)
    """Default: 2 × `lora_r`, the usual scaling."""
    lora_targets: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """The attention projections, where LoRA is usually put."""
    seed: int = 0
    """Seeds a new adapter's initialisation and the batch order."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """The usual gradient clip."""
    performance: SFTPerformance = Field(default_factory=SFTPerformance)
    """Exact speed and memory settings."""

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """Flat keyword arguments (the dataclass SFTConfig was) read as the new shape; `lr` and `lora_alpha`
        left out follow `lora` and `lora_r`."""
        data = _regroup(cls, data)
        if isinstance(data, dict):
            data = dict(data)
            lora = _lax(bool, data.get("lora", True))
            if data.get("lr") is None and lora is not None:
                data["lr"] = 2e-4 if lora else 1e-5
            rank = _lax(int, data.get("lora_r", 16))
            if data.get("lora_alpha") is None and rank is not None:
                data["lora_alpha"] = 2 * rank
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> SFTConfig:
        if self.adapter and not self.lora:
            raise ValueError("adapter continues a LoRA adapter, and lora=false trains every weight: choose one")
        return self


def rollout_kv_gb(setting: float | str | None, model: torch.nn.Module) -> float | None:
    if setting == "auto":
        return 1.0 if next(model.parameters()).device.type == "cpu" else None
    return setting  # type: ignore[return-value]


def check_rollout_mode(config: GRPOConfig, mode: str, gate: GateConfig | None = None) -> None:
    """Online GRPO: refuse a reward no rollout could earn. The fidelity reward scores rehearsals whose call
    really ran, which the gate (`graph.gate.rehearses_real_calls`; None: the default `GateConfig`) never
    allows in simulated mode, nor in mixed mode unless it rehearses reads; real-output CE needs real calls."""
    from envace_mcp.graph.gate import GateConfig, rehearses_real_calls  # langgraph: not for the light config

    gate = gate or GateConfig()
    if config.experimental.fidelity_weight and not rehearses_real_calls(mode, gate):  # type: ignore[arg-type]
        raise UserError(f"fidelity_weight rewards rehearsals whose call really ran, and {mode} mode with "
                        f"rehearse={gate.rehearse!r} has none: use --mode real (or mixed with a gate that "
                        "rehearses all calls), or set experimental.fidelity_weight to 0")
    if config.experimental.real_output_ce and mode == "simulated":
        raise UserError("real_output_ce teaches real tool outputs, and simulated mode has none: use --mode "
                        "real or mixed, or set experimental.real_output_ce to 0")


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
    if not config.experimental.call_f1_weight:
        return
    trained = [t for t in traces if (r := t.reward(config.reward)) is not None and r.value is not None
               and any(s.role in config.roles and s.prompt_ids is not None and s.completion_ids for s in t.steps)]
    unshaped = [t for t in trained if (f := t.reward("call_f1")) is None or f.value is None]
    if unshaped:
        raise UserError(f"call_f1_weight adds each run's tool-call F1 against its task's reference calls, and "
                        f"{len(unshaped)} of {len(trained)} runs have no 'call_f1' reward (only runs of a bundled "
                        "suite's tasks, recorded by envace eval or GRPO's rollouts, carry one): set experimental.call_f1_weight "
                        "to 0")

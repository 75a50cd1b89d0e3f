"""Fit the rehearse role to a user's tools from their recorded calls, and measure it on calls it never saw.

    fit(traces, out)                     -> the report: a LoRA world model in `out`, measured on held-out runs
    measure(policy, calls)               -> the report of any world model on any calls
    write_report(out, report, measured)  -> report.json, the trust table (trust.json), then report.png

The split is by run, seeded and stated (`fit.json`): a run's calls, and any replayed with a changed
argument (`envace traces import --mutate`), are all on one side. Only the rehearse role trains (SFT
on the real replies); the act role is not touched, so the fitted folder is meant as a world model beside
an agent (`--world-model DIR`, `RehearsalMiddleware(world_model=DIR)`, `load_policy(rehearse_adapter=DIR)`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace_mcp._progress import Progress
from envace_mcp.errors import UserError
from envace_mcp.policy.adapter import Adapter
from envace_mcp.policy.copying import learn, write_rules
from envace_mcp.policy.logged import learn_replies
from envace_mcp.policy import status_rules
from envace_mcp.policy.embedded import embedded_model_dir
from envace_mcp.policy.recall import CallLog
from envace_mcp.policy.tool_text import adapter_formats, write_adapter_format
from envace_mcp.policy.trust import weights_digest, write_trust
from envace_mcp.policy.types import run_sampling
from envace_mcp.traces import TraceStore
from envace_mcp.train.config import SFTConfig
from envace_mcp.worldmodel.calls import (
    Observed,
    call_digest,
    call_log,
    first_calls,
    observed_calls,
    split_episodes,
    with_similar,
)
from envace_mcp.worldmodel.measure import finite, majority_of, report, score_calls

if TYPE_CHECKING:
    from envace_mcp.policy.token_backend import TokenPolicy

FAILURE_SHARE = 0.25
"""Refused and erroring calls are what the gate needs foreseen, and a log holds few (inventory: 15 %): in
the fit their rows are repeated until they are at least this share of the rows…"""
FAILURE_COPIES = 4
"""…each at most this many times (more would teach the failing calls by heart)."""
MAX_CALLS = 200
"""Training calls `fit` takes by default (whole runs, in the split's seeded order): ~6 min of training on
2 cores (one epoch), and enough for the status rules that foresee most of inventory's failures (docs/evidence.md)."""
MAX_HELD = 200
"""Held-out calls `fit` measures by default (whole runs): ~10 min on 2 cores, and a status interval of ±0.05."""
EPOCHS = 1
"""Epochs `fit` trains by default: on inventory one epoch scored higher than two on status (0.82 against
0.75) and on every field kind, in half the time (docs/evidence.md, "Fitted, with status rules")."""
FIT_FILE = "fit.json"
REPORT_FILE = "report.json"
PLOT_FILE = "report.png"
DEFAULT_FORMATS = {"tool_format": "compact", "rehearse_format": "inline"}
"""Prompt formats of a world model started without an adapter: the shipped adapter's (a third of the
tokens of full JSON schemas; the rehearsal continues the act prompt, whose prefix is cached)."""


def read_calls(traces: str | Path) -> tuple[list[Any], list[Observed], dict[str, int]]:
    """The runs of a trace folder and their real calls; a folder without any is a UserError."""
    runs = list(TraceStore(traces).read())
    calls, unknown = observed_calls(runs)
    if not calls:
        why = (f"its calls name tools its runs did not record ({', '.join(sorted(unknown)[:3])})" if unknown else
               "no run holds a call that reached a server, with the tool catalog it saw (record runs with this "
               "version, or import a log: envace traces import)")
        raise UserError(f"{traces}: nothing to fit a world model on: {why}")
    return runs, calls, unknown


def split(calls: list[Observed], holdout: float, seed: int, max_calls: int | None = None,
          max_held: int | None = None) -> tuple[list[Observed], list[Observed], dict[str, Any]]:
    """(training calls, held-out calls, what the split was), refusing an empty side in one line. Each side
    is taken as whole runs in the seeded order, up to `max_calls` / `max_held` calls (None: all): the model
    trains on those; the rules (`learned_from`) learn from every training-side run, a count that costs
    seconds. A held-out run past its cap is not measured; `held_out_runs` lists the runs measured (their
    calls in the log's order, as a report on the same folder measures them)."""
    train_runs, held_runs = split_episodes(calls, holdout, seed)
    train, held = first_calls(calls, train_runs, max_calls), first_calls(calls, held_runs, max_held)
    if not train or not held:
        runs = len(train_runs) + len(held_runs)
        raise UserError(f"cannot hold out {holdout:.0%} of {runs} run(s) and train on the rest: need at least two "
                        "runs with real calls, and holdout between 0 and 1")
    measured = {c.episode for c in held}
    held = [c for c in calls if c.episode in measured]  # in the log's order, as `report` reads them
    side = learned_from(calls, train_runs)
    return train, held, {"seed": seed, "holdout": holdout, "runs": len(train_runs) + len(held_runs),
                         "held_out_runs": sorted(measured), "trained_runs": sorted(set(train_runs)),
                         "model_runs": len({c.episode for c in train}),
                         "training_calls": len(train), "rule_calls": len(side), "held_out_calls": len(held),
                         "max_calls": max_calls, "max_held": max_held, "logged_calls": len(calls),
                         "trained_calls": sorted({call_digest(c) for c in side}),
                         "training_majority": majority_of(side)}


def learned_from(calls: list[Observed], train_runs: list[str]) -> list[Observed]:
    """The calls the rules and the training majority learn from: every call of the training-side runs."""
    runs = set(train_runs)
    return [c for c in calls if c.episode in runs]


def failure_copies(calls: list[Observed]) -> int:
    """How many rows each failing training call gets (`FAILURE_SHARE`, `FAILURE_COPIES`)."""
    failed = sum(c.failed for c in calls)
    if not failed or failed == len(calls):
        return 1
    ok = len(calls) - failed
    wanted = FAILURE_SHARE * ok / ((1 - FAILURE_SHARE) * failed)  # copies c with c*failed / (c*failed + ok) = share
    return max(1, min(FAILURE_COPIES, math.ceil(wanted)))


def training_rows(policy: TokenPolicy, calls: list[Observed], log: CallLog | None = None
                  ) -> tuple[list[Any], int, dict[str, int]]:
    """SFT rows (rehearse prompt → the real reply, closed as the template closes a tool turn), how many
    calls were left out because prompt and reply do not fit the model's context, and each tool's longest
    reply in tokens. With a `log`, each prompt recalls the logged calls most like its call from the other
    runs, as the fitted model will."""
    from envace_mcp.train.rows import Segment
    from envace_mcp.train.sft import reply_target, target_encoding

    encode, end = target_encoding(policy.tokenizer)
    rows, too_long, longest = [], 0, {}
    copies = failure_copies(calls)
    for call in calls:
        prompt, close = policy.rehearse_prompt(with_similar(call, log))
        target = encode(reply_target(call.result, policy.rehearse_format, close)) + [end]
        longest[call.tool] = max(longest.get(call.tool, 0), len(target))
        if policy.context_window is not None and len(prompt) + len(target) > policy.context_window:
            too_long += 1
            continue
        row = Segment(run_id=call.episode, task_id=None, group_id=call.episode, role="rehearse",
                      prompt_ids=prompt, completion_ids=target, old_logprobs=None, reward=None)
        rows += [row] * (copies if call.failed else 1)
    return rows, too_long, longest


def measure(policy: Any, calls: list[Observed], *, label: str = "world model",
            majority: dict[str, bool] | None = None) -> dict[str, Any]:
    """Rehearse every call greedily (as runs do) and score it: the report (`measure.report`), each figure
    beside its floors (`majority`: each tool's majority status in the training calls, where known)."""
    import anyio

    sampling = run_sampling()["rehearse"]
    with Progress(f"measure {label}", total=len(calls)) as progress:
        scored = anyio.run(score_calls, policy, calls, sampling, progress.advance)
    rules, status = getattr(policy, "copy_rules", None), getattr(policy, "status_rules", None)
    return {**report(scored, majority), "copy_rules": rules.summary() if rules is not None else {},
            "reply_kinds": rules.kind_summary() if rules is not None else {},
            "status_rules": status.summary() if status is not None else None}


def fit(traces: str | Path, out: str | Path, *, model: str | None = None, adapter: str | Path | None = None,
        settings: SFTConfig | None = None, holdout: float = 0.2, seed: int = 0, max_calls: int | None = MAX_CALLS,
        max_held: int | None = MAX_HELD, recall: bool = False,
        on_step: Callable[[dict[str, float]], None] | None = None) -> dict[str, Any]:
    """Train the rehearse role of `model` (None: the embedded SmolLM2) on the real replies of the training
    runs in `traces`, as LoRA (over `adapter` when given, continuing it), save it to `out` and measure it on
    the held-out runs; returns the report (also written to `out`, with the trust table). `max_calls`,
    `max_held`: calls trained and measured, as whole runs (None: all; `MAX_CALLS`, `MAX_HELD`). `settings`: an
    `SFTConfig` (epochs, lr, rank, batch; its `roles` are set to the rehearse role; None: its defaults with
    `EPOCHS` epochs). `recall`: the training
    calls go into the folder as the log its rehearsals recall (`recall.jsonl`), and it learns with them —
    off by default: on inventory it foresaw far more failures but scored below the fit without it, copying
    the recalled calls' values into its replies (docs/evidence.md, "Recall")."""
    from envace_mcp.engine.model import load_model  # torch: only when fitting
    from envace_mcp.policy.transformers import TransformersPolicy
    from envace_mcp.train.sft import steps_per_epoch, train_sft

    out = Path(out)
    settings = settings or SFTConfig(epochs=EPOCHS)
    settings = settings.model_copy(update={"roles": ["rehearse"]})
    _, calls, unknown = read_calls(traces)
    train, held, how = split(calls, holdout, seed, max_calls, max_held)
    formats = {**DEFAULT_FORMATS, **adapter_formats(adapter)}
    lm, tokenizer = load_model(model or embedded_model_dir(), adapter=adapter, trainable=True, dtype="checkpoint")
    policy = TransformersPolicy(lm, tokenizer, name=str(model or "embedded"), **formats)
    log = call_log(train) if recall else None
    rows, too_long, longest = training_rows(policy, train, log)
    if not rows:
        raise UserError(f"none of the {len(train)} training calls fits the model's context with its reply")
    steps = settings.epochs * steps_per_epoch(rows, settings)
    with Progress("fit world model", total=steps) as progress:
        def step(m: dict[str, float]) -> None:
            progress.advance(loss=round(m["loss"], 4))
            if on_step is not None:
                on_step(m)

        lm = train_sft(lm, rows, tokenizer.pad_token_id or 0, settings, out=out, on_step=step)
    write_adapter_format(out, formats["tool_format"], formats["rehearse_format"], longest)
    tokenizer.save_pretrained(out)
    if log is not None:
        log.write(out)
    side = learned_from(calls, how["trained_runs"])
    identities = {c.tool: (c.spec.server or None, c.spec.behaviour) for c in side}
    write_rules(out, learn(side), identities, *learn_replies(side))
    status_rules.write_rules(out, status_rules.learn(side), identities)
    measured = {"traces": str(traces), **how, "model": model or "embedded", "started_from": str(adapter) if adapter else None,
                "skipped_too_long": too_long, "recalls": len(log) if log is not None else 0, "unknown_tools": unknown, "failure_copies": failure_copies(train),
                "training": settings.model_dump(mode="json", exclude={"performance", "model", "adapter"})}
    (out / FIT_FILE).write_text(json.dumps(measured, indent=1, ensure_ascii=False) + "\n")  # before measuring: a report needs it
    fitted = TransformersPolicy(lm, tokenizer, name=f"world model {out}", **formats)
    fitted.use_adapter(Adapter.read(out))  # its recall log, rules and budgets, as a loaded world model reads them
    result = measure(fitted, held, label="held-out calls", majority=how["training_majority"])
    skipped = write_report(out, result, {k: v for k, v in measured.items() if k not in ("trained_calls", "training_majority")},
                           weights=out)
    return {**result, "notes": [skipped] if skipped else []}


def write_report(out: str | Path, result: dict[str, Any], measured_on: dict[str, Any], *,
                 weights: str | Path | None) -> str | None:
    """report.json and the trust table (bound to the adapter weights in the folder `weights`; None: to
    none, so it earns nothing when read), then report.png; returns why the plot was skipped, if it was
    (it needs matplotlib, which the base install leaves out: the figures never wait on it)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_FILE).write_text(json.dumps(finite({**result, "measured_on": measured_on}), indent=1,
                                              ensure_ascii=False) + "\n")
    write_trust(out, finite(result["trust"]), {k: v for k, v in measured_on.items() if k != "training"},
                weights_digest(weights) if weights is not None else None)
    try:
        plot(result, out / PLOT_FILE)
    except ImportError:
        return f"{PLOT_FILE} skipped: it needs matplotlib (pip install matplotlib)"
    return None


def plot(result: dict[str, Any], path: Path) -> None:
    """Per tool: status accuracy, failure precision and recall, field accuracy by kind; a black tick on
    each status and field bar marks its floor (what the trivial predictor scores on the same calls)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tools = list(result["tools"])
    def best(floors: dict[str, Any]) -> float | None:
        known = [v for v in floors.values() if v is not None]
        return max(known) if known else None

    series = [("status accuracy", lambda f: f["status_accuracy"], lambda f: best(f["floors"])),
              ("failure precision", lambda f: f["failure_precision"], None),
              ("failure recall", lambda f: f["failure_recall"], None),
              *[(f"fields {kind}", lambda f, k=kind: f["field_accuracy"][k], lambda f, k=kind: f["field_floor"][k])
                for kind in ("echoed", "read", "computed")]]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(tools) + 2), 4.2))
    width = 0.8 / len(series)
    for i, (name, get, floor) in enumerate(series):
        values = [get(result["tools"][t]) for t in tools]
        xs = [j + i * width for j in range(len(tools))]
        ax.bar(xs, [v if v is not None else 0 for v in values], width, label=name)
        if floor is not None:
            floors = [(x, floor(result["tools"][t])) for x, t in zip(xs, tools)]
            ax.hlines([f for _, f in floors if f is not None], [x - width / 2 for x, f in floors if f is not None],
                      [x + width / 2 for x, f in floors if f is not None], colors="black", linewidth=1.5,
                      label="floor (trivial predictor)" if i == 0 else None)
        for x, v in zip(xs, values):
            if v is None or v == 0:  # nothing to measure, or measured and none right: both said, not left blank
                ax.text(x, 0.01, "n/a" if v is None else "0", rotation=90, fontsize=7, ha="center", va="bottom")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(tools))])
    ax.set_xticklabels([f"{t}\n({result['tools'][t]['calls']} call{'s' * (result['tools'][t]['calls'] != 1)})"
                        for t in tools], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("on held-out calls")
    overall = result["overall"]
    nll = overall["nll_per_token"]
    floor = best(overall["floors"])
    ax.set_title(f"world model, {overall['calls']} calls: status {overall['status_accuracy'] or 0:.2f} "
                 f"(floor {floor if floor is not None else float('nan'):.2f}), "
                 f"nll/token {nll if nll is not None else float('nan'):.3f}", fontsize=10)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""`envace world-model fit|report`: teach the world model your tools, and see how far to trust it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from envace_mcp._terminal import safe
from envace_mcp.cli._common import _adapter_folder, _config_layers, _fail, _holding, _model_name, console
from envace_mcp.errors import EnvaceError

world_model_app = typer.Typer(no_args_is_help=True, help="The world model: fit it to your tools' recorded calls, "
                                                           "measure it tool by tool (docs/training.md).")

TracesOpt = Annotated[Path, typer.Option(exists=True, file_okay=False, help="a trace folder (recorded runs, or "
                                                                            "`envace traces import`)")]


@world_model_app.command("fit")
def fit_command(
    traces: TracesOpt,
    out: Annotated[Path, typer.Option(file_okay=False, help="where the world model, its report and trust table go")],
    model: Annotated[Optional[str], typer.Option(callback=_model_name, help="base model (default: embedded SmolLM2)")] = None,
    adapter: Annotated[Optional[str], typer.Option(
        callback=_adapter_folder, help="continue this LoRA adapter (default with the embedded model: the shipped "
                                       "one; 'none' starts a new adapter)")] = None,
    holdout: Annotated[float, typer.Option(min=0.0, max=1.0, help="share of runs held out to measure on")] = 0.2,
    seed: Annotated[int, typer.Option(help="seeds the split (and the training order)")] = 0,
    max_calls: Annotated[int, typer.Option(min=0, help="train the model on whole runs up to N calls (the rules learn "
                                                       "from every training run), and measure on held-out runs up to "
                                                       "200 calls (0: all of both)")] = 200,
    config: Annotated[Optional[list[str]], typer.Option(
        "--config", "-c", help="training settings (SFTConfig; fit trains 1 epoch unless told): a JSON file or key=value "
                                         "pairs, e.g. -c epochs=2,lr=1e-4")] = None,
) -> None:
    """Train the rehearse role on the real replies of your runs, hold out a seeded share of runs, and write
    the adapter with report.json, report.png and trust.json."""
    from envace_mcp.config import build
    from envace_mcp.policy.embedded import default_adapter
    from envace_mcp.train.config import SFTConfig
    from envace_mcp.worldmodel.fit import EPOCHS, MAX_HELD, read_calls, split

    try:
        settings = build(SFTConfig, {"epochs": EPOCHS}, *_config_layers(config, SFTConfig), {"seed": seed},
                         where="envace world-model fit")
        _, calls, unknown = read_calls(traces)  # bad input fails before the model loads
        caps = (max_calls or None, MAX_HELD if max_calls else None)
        train, held, how = split(calls, holdout, seed, *caps)
    except EnvaceError as exc:
        _fail(exc)
    if unknown:
        console.print(f"skipped {sum(unknown.values())} calls to tools the runs' catalogs lack: "
                      + ", ".join(safe(name) for name in sorted(unknown)[:5]))
    unused = how["logged_calls"] - how["rule_calls"] - len(held)
    console.print(f"training on {len(train)} calls of {how['model_runs']} runs (status and copy rules: all "
                  f"{how['rule_calls']} calls of the {len(how['trained_runs'])} training runs); measuring on "
                  f"{len(held)} held-out calls of {len(how['held_out_runs'])} runs"
                  + (f"; {unused} held-out calls left out (whole runs up to {MAX_HELD} measured; --max-calls 0 "
                     "for all)" if unused else ""))
    console.print(room_for_trust(held))
    start = default_adapter(model, adapter)
    with _holding(out):
        try:
            from envace_mcp.worldmodel import fit

            result = fit(traces, out, model=model, adapter=start, settings=settings, holdout=holdout, seed=seed,
                         max_calls=caps[0], max_held=caps[1])
        except EnvaceError as exc:
            _fail(exc)
    show(result, f"held-out calls of {traces}")
    for note in result.get("notes", []):
        console.print(f"[yellow]{safe(note)}[/]")
    console.print(f"saved to {out} (report.json, trust.json, report.png); use it with --world-model {out}")


@world_model_app.command("report")
def report_command(
    adapter: Annotated[str, typer.Option(callback=_adapter_folder, help="the world model's adapter folder")],
    traces: TracesOpt,
    out: Annotated[Optional[Path], typer.Option(file_okay=False, help="where report.json, report.png and trust.json "
                                                                      "go (default: the adapter folder)")] = None,
    model: Annotated[Optional[str], typer.Option(callback=_model_name, help="its base model (default: embedded SmolLM2)")] = None,
) -> None:
    """Measure a world model on recorded calls, tool by tool: every call of a run it never trained on (its
    fit.json lists the runs it did). Without --out the report and trust table go into the adapter folder,
    which must not have a trust table yet."""
    from envace_mcp.worldmodel.fit import FIT_FILE, read_calls

    try:
        _, calls, _ = read_calls(traces)
    except EnvaceError as exc:
        _fail(exc)
    fitted = _fit_of(Path(adapter))
    unseen, what = unseen_calls(calls, fitted, traces)
    if not unseen:
        _fail(ValueError(f"{traces}: every call here trained this world model ({Path(adapter) / FIT_FILE}); "
                         "measure it on calls it never saw"))
    calls = unseen
    if out is None and (Path(adapter) / "trust.json").exists():
        _fail(ValueError(f"{adapter} already has a trust table (from its fit or an earlier report): pass --out DIR "
                         f"for this report, or --out {adapter} to replace the table the gate reads"))
    target = out or Path(adapter)
    with _holding(target):
        try:
            from envace_mcp.policy import load_policy
            from envace_mcp.worldmodel import measure, write_report

            with console.status("loading the world model …"):
                policy = load_policy(model, adapter=adapter)
            console.print(room_for_trust(calls))
            majority = fitted.get("training_majority") if isinstance(fitted.get("training_majority"), dict) else None
            result = measure(policy, calls, majority=majority)
            skipped = write_report(target, result, {"traces": str(traces), "adapter": str(adapter),
                                                    "model": model or "embedded", "calls": len(calls), "which": what},
                                   weights=adapter)
        except EnvaceError as exc:
            _fail(exc)
    show(result, f"{what}, {traces}")
    if skipped:
        console.print(f"[yellow]{skipped}[/]")
    console.print(f"wrote {target / 'report.json'} and {target / 'trust.json'}" + ("" if skipped else f", {target / 'report.png'}"))


def unseen_calls(calls: list[Any], fitted: dict[str, Any], traces: Path) -> tuple[list[Any], str]:
    """The calls a world model may be measured on, and what they are in words: on the folder it was fitted
    on, exactly the runs its fit held out (so fit and report measure the same calls); elsewhere every call
    whose content (tool, arguments, reply, the calls before it) no training call had, whatever its run id."""
    from envace_mcp.worldmodel.calls import call_digest

    held = fitted.get("held_out_runs")
    if _same(fitted.get("traces"), traces) and isinstance(held, list):
        kept = [c for c in calls if c.episode in set(held)]
        return kept, f"the {len(kept)} calls of the {len(held)} runs its fit held out"
    trained = set(fitted.get("trained_calls") or [])
    runs = set(fitted.get("trained_runs") or [])
    kept = [c for c in calls if c.episode not in runs and call_digest(c) not in trained]
    left = len(calls) - len(kept)
    return kept, (f"{len(kept)} calls it never trained on (left out: {left} that match its training calls)"
                  if left else f"{len(calls)} calls")


def room_for_trust(held: list[Any]) -> Text:
    """Whether any tool has the held-out calls to earn trust, before anything is measured: a tool's
    predicted failures need at least MIN_STOPS real failures to stop on, its predicted successes
    MIN_SUCCESSES calls to stand in for approval."""
    from envace_mcp.policy.trust import MIN_STOPS, MIN_SUCCESSES

    calls: dict[str, list[int]] = {}
    for call in held:
        calls.setdefault(call.tool, [0, 0])[call.failed] += 1
    may_stop = sorted(t for t, (_, failed) in calls.items() if failed >= MIN_STOPS)
    may_vouch = sorted(t for t, (ok, _) in calls.items() if ok >= MIN_SUCCESSES)
    if not may_stop and not may_vouch:
        return Text(f"no tool can earn trust on these {len(held)} held-out calls: believing a tool's predicted "
                    f"failures needs {MIN_STOPS}+ real failures of it held out, skipping its approval {MIN_SUCCESSES}+ "
                    "successes (record or import more runs, or hold out more)", style="yellow")
    # Text, never markup: tool names are the servers' (a `[/]` in one crashed the command)
    return Text.assemble("tools with the held-out calls to earn trust: stopping on failures: ",
                         safe(", ".join(may_stop) or "none"), "; vouching for successes: ",
                         safe(", ".join(may_vouch) or "none"), style="dim")


def _fit_of(adapter: Path) -> dict[str, Any]:
    from envace_mcp.worldmodel.fit import FIT_FILE

    try:
        data = json.loads((adapter / FIT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _same(a: Any, b: Path) -> bool:
    try:
        return isinstance(a, str) and Path(a).resolve() == b.resolve()
    except OSError:
        return False


def _figure(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def show(result: dict[str, Any], title: str) -> None:
    """The per-tool table, each figure beside its floor (what the trivial predictor scores on the same
    calls; a status at or below it in red), the status's 95 % interval and the trust earned; then the
    overall nll and how well P(error) is calibrated."""
    from envace_mcp.policy.trust import best_floor

    table = Table(title=safe(title), caption="floor: always succeeds or the training majority, the better; fields: "
                                             "model/copying the argument or latest value of that name", padding=(0, 1))
    for column in ("tool", "calls", "errors", "status", "floor", "unread", "fail p·r", "echoed", "read",
                   "computed", "trusted to"):
        table.add_column(column, justify="left" if column in ("tool", "trusted to") else "right",
                         no_wrap=column not in ("tool", "trusted to"))
    rows = [(name, figures, result["trust"].get(name, {})) for name, figures in result["tools"].items()]
    rows.append(("all tools", result["overall"], None))
    for name, f, trust in rows:
        earned = ("–" if trust is None else ", ".join(label for k, label in (
            ("believe_failures", "stop at P(error) ≥ {:g}".format(trust.get("min_p_error") or 0)),
            ("skip_approval", "skip approval")) if trust.get(k)) or "nothing")
        floor = best_floor(f)
        below = floor is not None and f["status_accuracy"] is not None and f["status_accuracy"] <= floor
        fields, floors = f["field_accuracy"], f.get("field_floor", {})
        table.add_row(safe(name), str(f["calls"]), str(f["failures"]),
                      Text(_figure(f["status_accuracy"]), style="red" if below else ""), _figure(floor),
                      _figure((f.get("unusable") or 0) + (f.get("unknown") or 0)),
                      f"{_figure(f['failure_precision'])}·{_figure(f['failure_recall'])}",
                      *(f"{_figure(fields[k])}/{_figure(floors.get(k))}" for k in ("echoed", "read", "computed")),
                      earned)
    console.print(table)
    overall = result["overall"]
    calibration = overall.get("calibration") or {}
    interval = overall.get("status_interval")
    line = (f"status {_figure(overall['status_accuracy'])}, 95 % interval "
            f"{'–' if not interval else f'{interval[0]:.2f}–{interval[1]:.2f}'} (each tool's: report.json); "
            f"nll/token {_figure(overall['nll_per_token'], 3)}")
    if calibration.get("calls"):
        line += (f"; P(error) on {calibration['calls']} calls: expected calibration error {_figure(calibration['ece'], 3)}, "
                 f"Brier {_figure(calibration['brier'], 3)} (report.json: reliability bins, precision and recall by "
                 "P(error) threshold per tool)")
    console.print(line)
    rules = result.get("copy_rules") or {}
    if rules:
        console.print(f"copied by rule, not generated: {sum(map(len, rules.values()))} rules of {len(rules)} tools, "
                      "each a field equal to an argument, an earlier value or what an argument names as shown earlier, "
                      "a whole reply equal to the logged reply to the same arguments, or fields equal to the logged "
                      "ones for the same value of an argument, in ≥ 95 % of the training replies or repeats "
                      "(report.json: copy_rules)")
    if result.get("reply_kinds"):
        console.print(f"held to the kind of JSON its log showed (no outputSchema declared): {len(result['reply_kinds'])} "
                      "tools (report.json: reply_kinds)")
    decided = result.get("status_rules")
    if decided:
        by_rule = overall.get("by_rule") or {}
        console.print(f"failures predicted by rule, not generated: {sum(map(len, decided.values()))} rules of "
                      f"{len(decided)} tools, each a fact of the call or the run that came with a failure in ≥ 90 % "
                      f"of the training calls; here {by_rule.get('calls', 0)} calls, {by_rule.get('failed', 0)} of them "
                      f"failed; the model alone: status {_figure(overall.get('model_status_accuracy'))} "
                      "(report.json: status_rules)")
    elif decided == {}:  # a fit learned none (a folder without status_rules.json says nothing)
        console.print("no status rule: no fact of a call or its run came with a failure in ≥ 90 % of 5 or more "
                      f"training calls of one tool; the model alone: status {_figure(overall.get('model_status_accuracy'))}")

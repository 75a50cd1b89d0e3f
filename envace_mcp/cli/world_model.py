"""`envace world-model fit|report`: teach the world model your tools, and see how far to trust it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

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
    max_calls: Annotated[Optional[int], typer.Option(min=1, help="train on the first N calls of the training runs "
                                                                 "(learning curves)")] = None,
    config: Annotated[Optional[list[str]], typer.Option(
        "--config", "-c", help="training settings (SFTConfig): a JSON file or key=value pairs, e.g. -c epochs=3,lr=1e-4")] = None,
) -> None:
    """Train the rehearse role on the real replies of your runs, hold out a seeded share of runs, and write
    the adapter with report.json, report.png and trust.json."""
    from envace_mcp.config import build
    from envace_mcp.policy.embedded import default_adapter
    from envace_mcp.train.config import SFTConfig
    from envace_mcp.worldmodel.fit import read_calls, split

    try:
        settings = build(SFTConfig, *_config_layers(config, SFTConfig), {"seed": seed}, where="envace world-model fit")
        _, calls, unknown = read_calls(traces)  # bad input fails before the model loads
        split(calls, holdout, seed, max_calls)
    except EnvaceError as exc:
        _fail(exc)
    if unknown:
        console.print(f"skipped {sum(unknown.values())} calls to tools the runs' catalogs lack: "
                      + ", ".join(safe(name) for name in sorted(unknown)[:5]))
    start = default_adapter(model, adapter)
    with _holding(out):
        try:
            from envace_mcp.worldmodel import fit

            result = fit(traces, out, model=model, adapter=start, settings=settings, holdout=holdout, seed=seed,
                         max_calls=max_calls)
        except EnvaceError as exc:
            _fail(exc)
    show(result, f"held-out calls of {traces}")
    if result["overall"]["calls"] < 30:
        console.print(f"only {result['overall']['calls']} held-out calls: these figures say little, and no tool earns trust "
                      "on so few (record or import more runs)")
    console.print(f"saved to {out} (report.json, report.png, trust.json); use it with --world-model {out}")


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
    trained = set(fitted.get("trained_runs") or [])
    if not trained and _same(fitted.get("traces"), traces):  # a fit.json from before it listed its training runs
        trained = {c.episode for c in calls} - set(fitted.get("held_out_runs") or [])
    unseen = [c for c in calls if c.episode not in trained]
    if not unseen:
        _fail(ValueError(f"{traces}: every run here trained this world model ({Path(adapter) / FIT_FILE}); "
                         "measure it on runs it never saw"))
    what = (f"{len(unseen)} calls of runs it never trained on (left out: {len(calls) - len(unseen)} of runs it did)"
            if len(unseen) < len(calls) else f"{len(calls)} calls")
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
            result = measure(policy, calls)
            write_report(target, result, {"traces": str(traces), "adapter": str(adapter), "model": model or "embedded",
                                          "calls": len(calls), "which": what})
        except EnvaceError as exc:
            _fail(exc)
    show(result, f"{what}, {traces}")
    console.print(f"wrote {target / 'report.json'}, {target / 'report.png'} and {target / 'trust.json'}")


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
    """The per-tool table: status accuracy, failures foreseen, fields by kind, nll/token and the trust earned."""
    table = Table(title=safe(title))
    for column in ("tool", "calls", "errors", "status", "fail prec", "fail rec", "echoed", "read", "computed",
                   "nll/tok", "trusted to"):
        table.add_column(column, justify="left" if column in ("tool", "trusted to") else "right")
    rows = [(name, figures, result["trust"].get(name, {})) for name, figures in result["tools"].items()]
    rows.append(("all tools", result["overall"], None))
    for name, f, trust in rows:
        earned = ("–" if trust is None else ", ".join(k for k, label in (("stop", "stop"), ("skip_approval", "skip approval"))
                                                       if trust.get(k)) or "nothing")
        fields = f["field_accuracy"]
        table.add_row(safe(name), str(f["calls"]), str(f["failures"]), _figure(f["status_accuracy"]),
                      _figure(f["failure_precision"]), _figure(f["failure_recall"]), _figure(fields["echoed"]),
                      _figure(fields["read"]), _figure(fields["computed"]), _figure(f["nll_per_token"], 3), earned)
    console.print(table)

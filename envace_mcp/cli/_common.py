"""What the `envace` sub-commands share: the Typer apps, the console, option types, helpers."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from envace_mcp._terminal import json_text, safe
from envace_mcp.errors import EnvaceError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Agents that rehearse before they act (EnvACE) for LangGraph + MCP.")
servers_app = typer.Typer(no_args_is_help=True, help="MCP servers: list tools, print configs, serve the bundled ones.")
tasks_app = typer.Typer(no_args_is_help=True, help="The bundled task suites.")
policy_app = typer.Typer(no_args_is_help=True, help="The policy model: try its roles against real tools.")
traces_app = typer.Typer(no_args_is_help=True, help="Recorded runs: list, show, summarise; import tool-call logs or LangSmith datasets; export to OpenTelemetry or LangSmith.")
train_app = typer.Typer(no_args_is_help=True, help="Training: SFT warm start, EnvACE GRPO from recorded runs or fresh rollouts.")

# Off a terminal rich would squeeze tables into 80 columns; logs read better wider.
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 140)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)


@app.callback()
def _options(verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="show third-party warnings, log messages and loading bars")] = False) -> None:
    """Agents that rehearse before they act (EnvACE) for LangGraph + MCP."""
    if verbose:
        os.environ["ENVACE_VERBOSE"] = "1"  # the model loader's own bars too (`engine.model.quiet_loading`)
    elif not os.environ.get("ENVACE_VERBOSE"):
        quiet_third_parties()


def quiet_third_parties() -> None:
    """Keep library noise (deprecation warnings, weight-loading bars, info logs) out of the terminal:
    what the user reads is our own output. Set before transformers or huggingface_hub is imported."""
    import warnings

    for name, value in (("TRANSFORMERS_VERBOSITY", "error"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                        ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(name, value)
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=r"envace_mcp(\.|$)")


def _servers_file(value: Path | None) -> Path | None:
    """`--servers` is read and checked when the command line is parsed, before any model loads."""
    if value is not None:
        from envace_mcp.toolbox.config import load_servers

        try:
            load_servers(value)
        except EnvaceError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be greater than 0, not {value}")
    return value


def _model_name(value: str | None) -> str | None:
    """A Hugging Face id or a folder; something written as a path must be an existing folder."""
    if value is not None:
        path = Path(value).expanduser()
        if path.exists() and not path.is_dir():
            raise typer.BadParameter(f"{value!r} is a file; give a model folder or a Hugging Face id")
        looks_like_path = "://" not in value and (value.startswith((".", "/", "~")) or value.count("/") > 1
                                                  or "\\" in value)  # "org/name" is a hub id; URLs are backends
        if looks_like_path and not path.exists():
            raise typer.BadParameter(f"model folder {value!r} does not exist")
    return value


def _adapter_folder(value: str | None) -> str | None:
    if value is not None and value.lower() != "none":
        path = Path(value).expanduser()
        if not path.is_dir():
            raise typer.BadParameter(f"adapter folder {value!r} {'is a file' if path.exists() else 'does not exist'}"
                                     " (or 'none' for no adapter)")
        from envace_mcp.policy.tool_text import adapter_formats

        try:
            adapter_formats(path)  # its envace.json, read before anything loads
        except EnvaceError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


ServersOpt = Annotated[Optional[Path], typer.Option(
    "--servers", "-s", exists=True, dir_okay=False, callback=_servers_file,
    help="mcpServers JSON file (default: the bundled servers over stdio)")]
ModelOpt = Annotated[Optional[str], typer.Option(callback=_model_name,
                                                 help="Hugging Face id or folder, or vllm:http://HOST:PORT/v1 (a vLLM server; default: embedded SmolLM2)")]
TracesOut = Annotated[Optional[Path], typer.Option(file_okay=False, help="record the run into this trace folder")]
RehearseTokensOpt = Annotated[Optional[int], typer.Option(
    "--rehearse-max-new-tokens", min=1,
    help="the rehearse role's own budget (default: --max-new-tokens); a tool's reply can be far longer than a "
         "tool call, and a rehearsal cut short is no prediction")]
SplitOpt = Annotated[Literal["train", "test", "validation", "fit"], typer.Option(
    help="which split's tasks (validation: every 8th train task of each kind; fit: the rest of train)")]


def _bundled_config() -> dict[str, Any]:
    from envace_mcp.eval import get_suite, suites

    return {"mcpServers": {name: get_suite(name).stdio_config() for name in suites()}}


def _flags(spec: Any) -> Text:
    a = spec.annotations
    if a.read_only:
        return Text("read-only", "green")
    flags = [Text("destructive", "red")] if a.destructive else []
    flags += [Text("idempotent")] if a.idempotent else []
    return Text(", ").join(flags) if flags else Text("write")


def _params(schema: dict[str, Any]) -> Text:
    """`name: type` per parameter, `?` when optional; names and types are the server's text (`safe`)."""
    def kind(prop: Any) -> str:
        if not isinstance(prop, dict):
            return "?"
        alternatives = prop.get("anyOf") if isinstance(prop.get("anyOf"), list) else []
        return json_text(prop.get("type") or "|".join(json_text(p.get("type", "?") if isinstance(p, dict) else "?")
                                                      for p in alternatives) or ("enum" if "enum" in prop else "object"))

    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    return safe(", ".join(f"{name}{'' if name in required else '?'}: {kind(prop)}" for name, prop in properties.items()))


def _catalog_table(catalog: Any) -> Table:
    table = Table(title="Tool catalog", show_lines=False)
    for col in ("tool", "server", "parameters", "returns", "annotations"):
        table.add_column(col)
    for spec in catalog:
        returns = spec.output_schema.get("title", "object") if spec.output_schema else "-"
        table.add_row(safe(str(spec.name)), safe(str(spec.server)), _params(spec.input_schema), safe(json_text(returns)),
                      _flags(spec))
    return table


AdapterOpt = Annotated[Optional[str], typer.Option(
    callback=_adapter_folder,
    help="a LoRA adapter folder; with the embedded model the shipped bank adapter is the default, 'none' for the bare model")]


def _rehearse_adapter_folder(value: str | None) -> str | None:
    """As `_adapter_folder`; 'none' is no second adapter (the act adapter rehearses, as without the option)."""
    value = _adapter_folder(value)
    return None if value is not None and value.lower() == "none" else value


RehearseAdapterOpt = Annotated[Optional[str], typer.Option(
    "--world-model", callback=_rehearse_adapter_folder,
    help="the rehearse role runs the model with this adapter instead: a world model fitted to your tools "
         "(`envace world-model fit`), its trust table deciding whose predictions the gate acts on; a second copy of the weights")]


def _fail(exc: Exception) -> NoReturn:
    """Bad input or a failed service: one `error:` line on stderr (no traceback), exit code 2."""
    err_console.print(Text.assemble(("error: ", "bold red"), safe(str(exc), newlines=True)))
    raise typer.Exit(2)


@contextlib.contextmanager
def _holding(folder: Path) -> Iterator[None]:
    """The command writes into `folder`: held against a second `envace` process for the command's life
    (`_files.hold_folder`), and a write that fails there (unwritable, a link refused) is one error line."""
    from envace_mcp._files import hold_folder, unwritable

    held = hold_folder(folder)
    try:
        held.__enter__()
    except EnvaceError as exc:
        _fail(exc)
    try:
        yield
    except OSError as exc:
        _fail(unwritable(exc, folder))
    finally:
        held.__exit__(None, None, None)


def _suite(domain: str, seed: int = 0) -> Any:
    from envace_mcp.eval import get_suite

    try:
        return get_suite(domain, seed)
    except EnvaceError as exc:
        _fail(exc)



GateOpt = Annotated[Optional[str], typer.Option(
    help="gate settings over the adapter's recommendation, e.g. rehearse=all,on_unusable=block,"
         "evidence=[repeated_writes],require_approval=never (docs/graph.md)")]
LimitsOpt = Annotated[Optional[str], typer.Option(
    help="run limits, e.g. max_steps=8,max_real_calls=10,max_rehearsals=none (default 12, 50, 100)")]


def _gate_text(spec: str | None) -> dict[str, Any]:
    """`--gate`'s settings, checked as every other form of gate settings is (`gate.gate_text`)."""
    from envace_mcp.graph.gate import gate_text

    try:
        return gate_text(spec or "", "--gate")
    except EnvaceError as exc:
        _fail(exc)


def _config_layers(values: list[str] | None, model: Any) -> list[dict[str, Any]]:
    """`--config`/`-c` values in order: a JSON file of `model`'s fields (a path: it ends in .json or exists),
    or `key=value,...` pairs typed as its fields (`config.parse_text`); later ones win."""
    import json

    from envace_mcp.config import parse_text

    layers = []
    for value in values or []:
        path = Path(value).expanduser()
        if value.endswith(".json") or path.is_file():
            try:
                layers.append(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                _fail(ValueError(f"--config {value}: not a readable JSON settings file ({exc})"))
        else:
            try:
                layers.append(parse_text(value, model, "--config"))
            except EnvaceError as exc:
                _fail(exc)
    return layers


def _limits(spec: str | None, defaults: dict[str, Any] | None = None) -> Any:
    """`--limits max_steps=8,...` as RunLimits, over the command's own `defaults`: one door per limit."""
    from envace_mcp.graph import RunLimits
    from envace_mcp.graph.gate import limits_text

    try:
        return RunLimits(**{**(defaults or {}), **limits_text(spec or "", "--limits")})
    except EnvaceError as exc:
        _fail(exc)


def _sampling(max_new_tokens: int, temperature: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """Per-role sampling as every run starts (`policy.types.run_sampling`): the act and critique roles
    share `max_new_tokens`; the rehearse role has its own budget."""
    from envace_mcp.policy.types import run_sampling

    return run_sampling(max_new_tokens, temperature, seed)



TracesDir = Annotated[Path, typer.Argument(exists=True, file_okay=False, help="a trace folder")]


def _store(directory: Path) -> Any:
    from envace_mcp.traces import TraceStore

    if not directory.exists():
        _fail(ValueError(f"trace folder {str(directory)!r} does not exist"))
    return TraceStore(directory)


def _report_problems(store: Any) -> None:
    for problem in store.problems:
        console.print(Text.assemble(("warning: ", "yellow"), safe(str(problem), newlines=True)))




YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="approve destructive calls without asking (they are still shown)")]

INTERACTIVE_GATE = {"require_approval": "destructive"}
"""`envace demo` and `envace run` ask before any destructive call (the terminal shows the call and its
rehearsed outcome); `--gate require_approval=never` or `--yes` for unattended runs."""


EMBEDDED_NAME = "the embedded SmolLM2-135M-Instruct"


@contextlib.contextmanager
def loading(model: str | None, adapter: Any = None, world_model: Any = None) -> Iterator[None]:
    """Before a model loads, one line on stderr naming what loads (model, adapter, world model; the names
    escaped): on a small CPU loading takes a minute or more, and a run that prints nothing meanwhile looks
    hung, whatever stdout is. On a terminal a spinner runs beside it until the model is in; the loader
    offers no progress of its own beyond transformers' weight bar, which `-v` shows."""
    line = Text.assemble("loading ", safe(model) if model else EMBEDDED_NAME, style="dim")
    for label, folder in (("adapter", adapter), ("world model", world_model)):
        if folder is not None:
            line.append_text(Text.assemble(f", {label} ", safe(str(folder)), style="dim"))
    err_console.print(Text.assemble(line, (" …", "dim")))
    with err_console.status(Text("loading …", "dim")):  # nothing off a terminal
        yield


def whole_pieces(pieces: list[tuple[str, str]], width: int, indent: int = 4) -> Text:
    """`(separator, piece)` pairs laid out in lines of at most `width` columns, broken only at a separator
    (a space is dropped there, a comma ends the line) and never inside a piece: a flag, a `key=value`
    setting or a phrase that reads wrong cut in two. A piece longer than the width gets a line of its own,
    whole."""
    lines = [""]
    for i, (separator, piece) in enumerate(pieces):
        closing = len(pieces[i + 1][0].strip()) if i + 1 < len(pieces) else 0  # the comma it may end with
        if lines[-1].strip() and len(lines[-1]) + len(separator) + len(piece) + closing > width:
            lines[-1] += separator.strip()  # a comma stays at the end of the line it closes
            lines.append(" " * indent + piece)
        else:
            lines[-1] += (separator if lines[-1] else "") + piece
    return Text("\n".join(lines))


def _agent_gate(spec: str | None, model: str | None, adapter: str | None, announce: bool = True,
                rehearse_adapter: str | None = None) -> tuple[Any, str | None]:
    """`envace demo` / `envace run`: the adapter to load (`default_adapter`) and the gate, built from
    INTERACTIVE_GATE, then what the world model's adapter recommends in its envace.json (`adapter_gate`;
    the rehearse adapter's when there is one, since the recommendation says how far to trust the
    rehearsals measured with those weights), then `--gate`. The recommendation is printed, so a run
    never hides where a setting came from."""
    from envace_mcp.graph import adapter_gate
    from envace_mcp.policy.embedded import default_adapter

    try:
        folder = default_adapter(model, adapter)
        recommended = adapter_gate(rehearse_adapter if rehearse_adapter is not None else folder)
    except EnvaceError as exc:
        _fail(exc)
    from envace_mcp.graph import GateConfig

    config = GateConfig(**{**INTERACTIVE_GATE, **recommended, **_gate_text(spec)})
    if recommended and announce:  # after every check of the command line: a bad one prints nothing else
        from envace_mcp.config import settings_text

        from envace_mcp._text import visible

        whose = "the rehearse adapter's" if rehearse_adapter is not None else "the adapter's"
        settings = [("," if i else " ", visible(settings_text({k: v})))  # the adapter file's text: escaped
                    for i, (k, v) in enumerate(recommended.items())]
        pieces = [(" " if i else "", word) for i, word in enumerate(f"gate from {whose} envace.json:".split())]
        line = whole_pieces([*pieces, *settings, (" ", "(--gate overrides)")], console.width)
        line.stylize("dim")
        console.print(line, soft_wrap=True)  # laid out here: rich would fold a long setting mid-way
    return config, folder


def announce_trust(policy: Any) -> None:
    """What the loaded world model's trust table lets the gate act on, and each thing its re-check
    refused or found (`policy.trust.read_trust`), one line each, escaped."""
    table = getattr(policy, "trust", None)
    if table is None:
        return
    acted = sorted(name for name, t in table.tools.items() if t.believe_failures or t.fail_closed or t.skip_approval)
    # Text, never markup: a tool named `[/]` or `[conceal]` in an adapter's table is shown as written
    console.print(Text.assemble("trust table ", safe(str(table.path)), f": the gate acts on the world model's "
                                f"predictions for {len(acted)} of the {len(table.tools)} tool(s) it measured "
                                "(others: shown, not acted on)", style="dim"))
    for note in table.notes:
        console.print(safe(note, "yellow"))

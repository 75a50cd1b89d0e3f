"""What the `envace` sub-commands share: the Typer apps, the console, option types, helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from envace_mcp.errors import EnvaceError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Agents that rehearse before they act (EnvACE) for LangGraph + MCP.")
servers_app = typer.Typer(no_args_is_help=True, help="MCP servers: list tools, print configs, serve the bundled ones.")
tasks_app = typer.Typer(no_args_is_help=True, help="The bundled task suites.")
policy_app = typer.Typer(no_args_is_help=True, help="The policy model: try its roles against real tools.")
traces_app = typer.Typer(no_args_is_help=True, help="Recorded runs: list, show, summarise.")
train_app = typer.Typer(no_args_is_help=True, help="Training from recorded runs: SFT warm start, offline GRPO.")

console = Console()

ServersOpt = Annotated[Optional[Path], typer.Option("--servers", "-s", help="mcpServers JSON file (default: the bundled servers over stdio)")]


def _bundled_config() -> dict[str, Any]:
    from envace_mcp.eval import get_suite, suites

    return {"mcpServers": {name: get_suite(name).stdio_config() for name in suites()}}


def _flags(spec: Any) -> str:
    a = spec.annotations
    if a.read_only:
        return "[green]read-only[/]"
    return ", ".join(x for x, on in (("[red]destructive[/]", a.destructive), ("idempotent", a.idempotent)) if on) or "write"


def _params(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    parts = []
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") or "|".join(p.get("type", "?") for p in prop.get("anyOf", [])) or ("enum" if "enum" in prop else "object")
        parts.append(f"{name}{'' if name in required else '?'}: {kind}")
    return ", ".join(parts)


def _catalog_table(catalog: Any) -> Table:
    table = Table(title="Tool catalog", show_lines=False)
    for col in ("tool", "server", "parameters", "returns", "annotations"):
        table.add_column(col)
    for spec in catalog:
        returns = spec.output_schema.get("title", "object") if spec.output_schema else "-"
        table.add_row(spec.name, spec.server, _params(spec.input_schema), returns, _flags(spec))
    return table


AdapterOpt = Annotated[Optional[str], typer.Option(
    help="a LoRA adapter folder; with the embedded model the shipped bank adapter is the default, 'none' for the bare model")]


def _adapter(model: str | None, adapter: str | None) -> str | None:
    """The adapter to load: 'none' = no adapter; unset = the shipped one for the embedded model, none otherwise."""
    if adapter is not None:
        return None if adapter.lower() == "none" else adapter
    if model is None:
        from envace_mcp.policy.embedded import embedded_adapter

        return str(embedded_adapter())
    return None


def _fail(exc: Exception) -> None:
    console.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(2)


def _suite(domain: str, seed: int = 0) -> Any:
    from envace_mcp.eval import get_suite

    try:
        return get_suite(domain, seed)
    except EnvaceError as exc:
        _fail(exc)



def _gate(spec: str | None, **overrides: Any) -> Any:
    """`rehearse=all,require_approval=destructive,max_steps=6` as a GateConfig."""
    import dataclasses

    from envace_mcp.graph import GateConfig

    values: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(GateConfig)}
    for item in filter(None, (spec or "").split(",")):
        key, _, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in fields:
            _fail(ValueError(f"unknown gate setting {key!r}; known: {', '.join(fields)}"))
        default = getattr(GateConfig(), key)
        raw = raw.strip()
        if isinstance(default, bool):
            values[key] = raw.lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int) or key.startswith("max_"):
            values[key] = None if raw.lower() in ("none", "") else int(raw)
        else:
            values[key] = raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return GateConfig(**values)
    except TypeError as exc:
        _fail(ValueError(f"bad gate settings: {exc}"))


def _sampling(max_new_tokens: int, temperature: float, seed: int) -> dict[str, Any]:
    from envace_mcp.policy import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    return {"act": params, "rehearse": params, "critique": params}



TracesDir = Annotated[Path, typer.Argument(help="a trace folder")]


def _store(directory: Path) -> Any:
    from envace_mcp.traces import TraceStore

    if not directory.exists():
        _fail(ValueError(f"trace folder {str(directory)!r} does not exist"))
    return TraceStore(directory)


def _report_problems(store: Any) -> None:
    for problem in store.problems:
        console.print(f"[yellow]warning:[/] {problem}")



"""How far the gate may act on a world model's predictions, tool by tool: a measurement, not a setting.

`envace world-model report` (and `fit`) measures a world model on calls it never trained on and writes
`trust.json` beside its adapter:

    {"tools": {"reserve": {"believe_failures": true, "min_p_error": 0.7, "fail_closed": true,
                           "skip_approval": false, "server": "inventory", "behaviour": "3f1c…",
                           "calls": 41, "status_accuracy": 0.93, "floors": {...}, "stop_curve": [...], ...}},
     "weights": "9ab2…", "measured_on": {...}, "bars": {...}}

What a tool may earn, each by the bars below and only where the model beat its floors (the status
accuracy of "always succeeds", of the majority status the training calls had and, for a world model that
recalls logged calls, of the status of the logged call most like each one):

- `believe_failures`: a predicted failure at P(error) ≥ `min_p_error` may stop a call (the gate's block
  and feedback): the threshold is the lowest at which its held-out stops were precise enough;
- `skip_approval`: a predicted success may stand in for approval, where the caller asked for that
  (`require_approval="measured"`);
- `fail_closed`: with `on_unusable="block"`, an unreadable rehearsal of this tool blocks a destructive
  call. It only ever stops calls, so a table may say it without figures; an unmeasured tool's unreadable
  rehearsal says nothing, and does not.

A table is re-checked when it is read, since an adapter folder is untrusted input: a flag its own figures
do not earn (figures out of a report's range earn nothing), a table bound to other weights than the
folder's (`weights`: the adapter file's digest), to none, or in a folder without that file, a
`skip_approval` whose entry binds no tool, and a table that names no tool are each announced in one line
naming the file (its tool names escaped), and nothing they claim loosens the gate. An entry binds the tool it measured (`server`, `behaviour`: `ToolSpec.behaviour`);
another server's tool of the same name, or one whose schemas changed, is not covered by it (`ToolTrust.covers`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError, model_validator

from envace_mcp._text import visible
from envace_mcp.config import Settings
from envace_mcp.errors import UserError
from envace_mcp.policy import copying, status_rules
from envace_mcp.policy.recall import RECALL_FILE
from envace_mcp.policy.tool_text import adapter_file

if TYPE_CHECKING:
    from envace_mcp.toolbox.catalog import ToolSpec

TRUST_FILE = "trust.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MIN_STOPS = 3
"""Held-out calls a tool's predicted failures must stop before they may stop its calls…"""
STOP_PRECISION = 0.8
"""…of which at least this share must have been real failures."""
MIN_SUCCESSES = 10
"""Predicted successes a tool needs before they may stand in for approval (`require_approval=measured`)…"""
SKIP_PRECISION = 0.95
"""…of which at least this share must have been real successes, with `status_accuracy` at least
`SKIP_STATUS`."""
SKIP_STATUS = 0.9
MAX_BYTES = 8 << 20
"""A trust table larger than this is not a report's (one is a few KB a tool) and is not read whole."""
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
"""P(error) thresholds of the precision-vs-coverage curve (`stop_curve`) a tool's `min_p_error` is
chosen from."""

log = logging.getLogger("envace_mcp.trust")


class ToolTrust(Settings):
    """What the world model earned on one tool (see the module)."""

    believe_failures: bool = False
    """A predicted failure (at P(error) ≥ `min_p_error`, where the rehearsal has one) may stop a call."""
    min_p_error: float | None = None
    fail_closed: bool = False
    """With `on_unusable="block"`, an unreadable rehearsal blocks a destructive call to this tool."""
    skip_approval: bool = False
    """A predicted success may stand in for approval, where the caller set `require_approval="measured"`."""
    server: str | None = None
    """The server of the tool measured (None: any; tables written before tools were bound)."""
    behaviour: str | None = None
    """`ToolSpec.behaviour` of the tool measured: its schemas and annotations (None: any)."""

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """`stop` (tables before its two meanings were split) reads as both."""
        if isinstance(data, dict) and "stop" in data:
            data = dict(data)
            stop = data.pop("stop")
            data.setdefault("believe_failures", stop)
            data.setdefault("fail_closed", stop)
        return data

    def covers(self, spec: ToolSpec | None) -> bool:
        """Whether this entry was measured on `spec` (the same server and behaviour, where it says)."""
        if spec is None:
            return False
        return ((self.server is None or self.server == getattr(spec, "server", None))
                and (self.behaviour is None or self.behaviour == getattr(spec, "behaviour", None)))


# ---------------------------------------------------------------------------- what figures earn


def best_floor(figures: Mapping[str, Any]) -> float | None:
    """The highest status accuracy of a trivial predictor on the same calls (`floors`)."""
    floors = figures.get("floors")
    values = [v for v in (floors.values() if isinstance(floors, Mapping) else ())
              if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(values) if values else None


def earned(figures: Mapping[str, Any]) -> dict[str, Any]:
    """What one tool's held-out figures earn (`believe_failures`, `min_p_error`, `skip_approval`) and why,
    by the module's bars. Figures that are missing, of the wrong type or out of range (a share outside
    0–1, a count that is not a whole number ≥ 0) earn nothing."""
    try:
        status = _share(figures.get("status_accuracy"))
        floors = figures.get("floors") or {}
        if not isinstance(floors, Mapping):
            raise TypeError("floors")
        known = [share for share in map(_share, floors.values()) if share is not None]
        floor = max(known) if known else None
        beats = status is not None and floor is not None and status > floor
        threshold = None
        for point in figures.get("stop_curve") or []:
            if not isinstance(point, Mapping):
                raise TypeError("stop_curve")
            stopped, precision, p_error = _count(point["stopped"]), _share(point.get("precision")), point["p_error"]
            if _share(p_error) is None:
                raise ValueError("p_error")
            if stopped >= MIN_STOPS and precision is not None and precision >= STOP_PRECISION:
                threshold = float(p_error)
                break
        believe = beats and threshold is not None
        oks, ok_precision = _count(figures.get("predicted_successes") or 0), _share(figures.get("success_precision"))
        skip = (beats and oks >= MIN_SUCCESSES and ok_precision is not None and ok_precision >= SKIP_PRECISION
                and status is not None and status >= SKIP_STATUS)
    except (KeyError, TypeError, ValueError):
        return {"believe_failures": False, "min_p_error": None, "skip_approval": False,
                "why": "its figures are not a report's"}
    why = [f"status {status:.2f} vs floor {floor:.2f}" if status is not None and floor is not None
           else "no status accuracy beside a floor"]
    if not beats:
        why.append("it does not beat its floor, so it earns nothing")
    else:
        why.append(f"its predicted failures stop at P(error) ≥ {threshold:g}" if believe else
                   f"no P(error) threshold stops {MIN_STOPS}+ calls at precision {STOP_PRECISION:.0%}")
        why.append("its predicted successes may stand in for approval" if skip else
                   f"fewer than {MIN_SUCCESSES} predicted successes at precision {SKIP_PRECISION:.0%}, or status "
                   f"below {SKIP_STATUS:.0%}")
    return {"believe_failures": believe, "min_p_error": threshold if believe else None, "skip_approval": skip,
            "why": "; ".join(why)}


def _share(value: Any) -> float | None:
    """A share as a report writes it (None where there was nothing to divide by); anything else, NaN and
    a 400-digit integer included, is a ValueError or TypeError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"not a share: {value!r:.40}")
    return float(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a count: {value!r:.40}")
    return value


def bars() -> dict[str, Any]:
    """The bars `earned` holds tools to, as written beside a trust table."""
    return {"floor": "status accuracy above every floor (always succeeds; the training calls' majority status; "
                     "the nearest logged call's status, where the world model recalls a log)",
            "believe_failures": f"the lowest P(error) at which at least {MIN_STOPS} held-out calls were stopped, "
                                f"at least {STOP_PRECISION:.0%} of them real failures",
            "skip_approval": f"at least {MIN_SUCCESSES} predicted successes, of which at least {SKIP_PRECISION:.0%} "
                             f"real, status accuracy at least {SKIP_STATUS:.0%}",
            "fail_closed": "every tool measured"}


def weights_digest(folder: str | Path) -> str | None:
    """The digest of an adapter folder's weights (`WEIGHTS_FILE`) and of what its rehearsals were measured
    with, where it has them: the log they recall (`recall.jsonl`), the rules they apply (`copy_rules.json`,
    `status_rules.json`), each named with its length (a file renamed is another folder), and the reply
    budgets in its `envace.json`; None where it has no weights."""
    path = Path(folder) / WEIGHTS_FILE
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    for part in (path, *(Path(folder) / name for name in (RECALL_FILE, copying.RULES_FILE, status_rules.RULES_FILE))):
        if part == path or part.is_file():
            if part != path:
                digest.update(f"\0{part.name}\0{part.stat().st_size}\0".encode())
            with part.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    try:
        budgets = adapter_file(folder).get("reply_tokens")
    except UserError:
        budgets = None
    if budgets is not None:
        digest.update(b"\0reply_tokens\0" + json.dumps(budgets, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:32]


# ---------------------------------------------------------------------------- the table


@dataclass
class TrustTable:
    """A trust table as the gate may use it: what each tool earned once re-checked, and what the check
    announced (`notes`, one line each, naming the file)."""

    tools: dict[str, ToolTrust] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    path: Path | None = None


def read_trust(folder: str | Path | None) -> TrustTable | None:
    """The trust table in an adapter folder (`trust.json`), re-checked (see the module); None when the
    folder has none. A torn or malformed file is a UserError naming it (nothing is trusted by accident)."""
    if folder is None:
        return None
    path = Path(folder) / TRUST_FILE
    if not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ValueError(f"it is larger than {MAX_BYTES >> 20} MiB")
        data = json.loads(raw.decode("utf-8"))
        tools = data["tools"] if isinstance(data, dict) else None
        if not isinstance(tools, dict):
            raise ValueError('it has no "tools" object')
        claimed = {str(name): (entry, ToolTrust(**{k: v for k, v in entry.items() if k in ToolTrust.model_fields
                                                   or k == "stop"}))
                   for name, entry in tools.items() if isinstance(entry, dict)}
    except RecursionError:
        raise UserError(f"{path}: not a trust table (nested too deep); refit or remove it") from None
    except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
        reason = visible((str(exc).splitlines() or [type(exc).__name__])[0])
        raise UserError(f"{path}: not a trust table ({reason}); refit or remove it") from None
    table = TrustTable(path=path)
    if not claimed:
        table.notes.append(f"{path}: names no tool, so the gate acts on none of this world model's predictions "
                           "(every one is shown, none stops a call)")
    bound = data.get("weights")
    actual = weights_digest(folder)
    unbound = None
    if not isinstance(bound, str):
        unbound = "is bound to no weights (written by hand, or before tables were bound)"
    elif actual is None:  # weights PEFT loads from another file (adapter_model.bin) are weights it cannot check
        unbound = f"names weights its folder does not have ({WEIGHTS_FILE} to check them against)"
    elif bound != actual:
        unbound = (f"was measured on other weights than {Path(folder) / WEIGHTS_FILE} (or another recall log or "
                   "rules than the folder's)")
    for name, (entry, trust) in claimed.items():
        allowed = earned(entry) if unbound is None else {"believe_failures": False, "min_p_error": None,
                                                          "skip_approval": False}
        # what stands in for a person's approval must name the tool it measured, as a report's entries do
        unbinding = allowed["skip_approval"] and (trust.server is None or trust.behaviour is None)
        if unbinding:
            allowed = {**allowed, "skip_approval": False}
        refused = [flag for flag in ("believe_failures", "skip_approval") if getattr(trust, flag) and not allowed[flag]]
        if refused:
            by_figures = [flag for flag in refused if not (unbinding and flag == "skip_approval")]
            why = f"the table {unbound}" if unbound else "; ".join(
                ([f"its own figures do not earn it ({allowed['why']})"] if by_figures else [])
                + (["skip_approval needs the entry to bind its tool (server and behaviour, as a report's do)"]
                   if unbinding else []))
            table.notes.append(f"{path}: '{visible(name)}' claims {' and '.join(refused)}, not believed: {why}")
        table.tools[name] = trust.model_copy(update={
            "believe_failures": trust.believe_failures and allowed["believe_failures"],
            "skip_approval": trust.skip_approval and allowed["skip_approval"],
            "min_p_error": allowed["min_p_error"] if trust.believe_failures and allowed["believe_failures"] else None})
    for note in table.notes:
        log.warning("%s", note)
    return table


def write_trust(folder: str | Path, tools: dict[str, dict[str, Any]], measured_on: dict[str, Any],
                weights: str | None) -> Path:
    """Save a trust table (`tools`: name -> `ToolTrust` fields and the figures they rest on), bound to
    the adapter weights it measured (`weights_digest`)."""
    path = Path(folder) / TRUST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"tools": tools, "weights": weights, "measured_on": measured_on, "bars": bars()},
                               indent=2, ensure_ascii=False) + "\n")
    return path


def require_report(folder: str | Path) -> TrustTable:
    """The trust table of a world model folder someone's agent is about to use; a folder without one is a
    UserError saying how to measure it (a world model nobody measured is not one the gate should read)."""
    table = read_trust(folder)
    if table is None:
        raise UserError(f"world model {str(folder)!r} has no report ({TRUST_FILE}): measure it first, "
                        f"envace world-model report --adapter {folder} --traces DIR (it writes the trust table there)")
    return table

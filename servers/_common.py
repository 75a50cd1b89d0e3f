"""What the bundled servers share: per-episode state, task records, the checker, the CLI.

Episode isolation: every tool call may carry `_meta` keys `envace/episode` (a state key) and
`envace/task` (a suite task id). The first call of an episode builds its state from that task's
initial state (or from the server's seeded default world), so parallel rollouts never share state
and a new key is a reset. The state of an episode is readable as the resource
`envace://episodes/{episode}/state` (the checker reads it; agents have no tool for it).
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

EPISODE_KEY = "envace/episode"
TASK_KEY = "envace/task"
DEFAULT_EPISODE = "default"
STATE_URI = "envace://episodes/{episode}/state"


class DomainError(Exception):
    """A business-rule failure (insufficient funds, order not cancellable): an `isError` result."""


# ---------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class Action:
    """One tool call of a reference solution."""

    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Requirement:
    """Something the final answer must contain: a number (compared numerically) or a phrase."""

    kind: Literal["number", "text"]
    value: Any

    def satisfied_by(self, answer: str) -> bool:
        if self.kind == "number":
            return any(abs(n - float(self.value)) < 0.005 for n in numbers_in(answer))
        return str(self.value).lower() in answer.lower()


@dataclass(frozen=True)
class Task:
    """One task of a suite: instruction, initial state, reference solution and what to check.

    `outcome` says what a correct agent ends with: `success` (the request is carried out),
    `error` (the request cannot be carried out and the agent says why) or `refusal` (policy
    forbids it; `trap` is the careless destructive call that a correct agent does not make).
    """

    id: str
    domain: str
    split: Literal["train", "test"]
    kind: str
    instruction: str
    initial_state: dict[str, Any]
    actions: tuple[Action, ...]
    answer: str
    requirements: tuple[Requirement, ...] = ()
    outcome: Literal["success", "error", "refusal"] = "success"
    trap: Action | None = None
    writes: tuple[str, ...] = field(default=(), repr=False)
    """Names of the domain's state-changing tools (to find "the last write" in tests and tools)."""
    turns: tuple[str, ...] = ()
    """Later user messages of a multi-turn task (BFCL), each sent once the agent answered the last."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def write_actions(self) -> list[Action]:
        return [a for a in self.actions if a.tool in self.writes]


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class CheckResult:
    """The checker's verdict: score in [0, 1] (the fraction of checks passed) and every check."""

    score: float
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return self.score >= 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score, "checks": [asdict(c) for c in self.checks]}


Apply = Callable[[dict[str, Any], str, dict[str, Any]], Any]


def replay(initial_state: Mapping[str, Any], actions: Sequence[Action], apply: Apply) -> dict[str, Any]:
    """Run actions on a copy of a state with the domain's own tool functions; errors leave state as is."""
    state = copy.deepcopy(dict(initial_state))
    for action in actions:
        try:
            apply(state, action.tool, dict(action.arguments))
        except DomainError:
            pass
    return state


def check_task(task: Task, final_state: Mapping[str, Any], answer: str, apply: Apply) -> CheckResult:
    """τ²-style check: the final state must equal the reference actions' final state, and the
    answer must contain every required number or phrase. Score = fraction of checks passed."""
    expected = replay(task.initial_state, task.actions, apply)
    differences = diff_states(expected, dict(final_state))
    checks = [Check("state", not differences, "; ".join(differences[:5]))]
    for req in task.requirements:
        label = f"answer has {req.value:.2f}" if req.kind == "number" else f"answer mentions {req.value!r}"
        checks.append(Check(label, req.satisfied_by(answer or "")))
    score = sum(c.passed for c in checks) / len(checks)
    return CheckResult(score=round(score, 6), checks=tuple(checks))


def diff_states(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Human-readable differences between two JSON-like values (empty when equal)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out: list[str] = []
        for key in sorted(set(expected) | set(actual), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in actual:
                out.append(f"{sub}: missing")
            elif key not in expected:
                out.append(f"{sub}: unexpected")
            else:
                out.extend(diff_states(expected[key], actual[key], sub))
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: {len(actual)} entries, expected {len(expected)}"]
        out = []
        for i, (e, a) in enumerate(zip(expected, actual)):
            out.extend(diff_states(e, a, f"{path}[{i}]"))
        return out
    if isinstance(expected, float) or isinstance(actual, float):
        try:
            if abs(float(expected) - float(actual)) < 0.005:
                return []
        except (TypeError, ValueError):
            pass
    return [] if expected == actual else [f"{path}: {actual!r}, expected {expected!r}"]


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def numbers_in(text: str) -> list[float]:
    """Numbers in free text, tolerating `$1,234.50` and `1 234.5`."""
    cleaned = re.sub(r"(?<=\d)[,\u00a0 ](?=\d{3}\b)", "", text.replace("$", ""))
    return [float(m) for m in _NUMBER.findall(cleaned)]


def money(value: float) -> float:
    return round(float(value) + 0.0, 2)


# ---------------------------------------------------------------------------- episodes


class EpisodeStore:
    """Per-episode copies of a domain's state, created lazily, bounded in number (LRU)."""

    def __init__(self, initial_for: Callable[[str | None], dict[str, Any]], capacity: int = 4096) -> None:
        self._initial_for = initial_for
        self._capacity = capacity
        self._states: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def state(self, episode: str = DEFAULT_EPISODE, task_id: str | None = None) -> dict[str, Any]:
        if episode in self._states:
            self._states.move_to_end(episode)
            return self._states[episode]
        state = copy.deepcopy(self._initial_for(task_id))
        self._states[episode] = state
        while len(self._states) > self._capacity:
            self._states.popitem(last=False)
        return state

    def for_request(self, meta: Mapping[str, Any] | None) -> dict[str, Any]:
        meta = meta or {}
        episode = str(meta.get(EPISODE_KEY) or DEFAULT_EPISODE)
        task = meta.get(TASK_KEY)
        return self.state(episode, str(task) if task else None)

    def peek(self, episode: str) -> dict[str, Any] | None:
        """The episode's state, or `None` if no call has touched it yet (its task's initial state)."""
        return self._states.get(episode)

    def reset(self, episode: str = DEFAULT_EPISODE) -> None:
        self._states.pop(episode, None)

    def __len__(self) -> int:
        return len(self._states)


def request_meta(ctx: Any) -> dict[str, Any]:
    """The `_meta` of the request being handled (empty when none)."""
    return meta_dict(getattr(getattr(ctx, "request_context", None), "meta", None))


def meta_dict(meta: Any) -> dict[str, Any]:
    """A request's `_meta` (a mapping or the SDK's model with extra keys) as a plain dict."""
    if meta is None:
        return {}
    if isinstance(meta, Mapping):
        return dict(meta)
    return dict(getattr(meta, "model_extra", None) or {}) | {
        k: v for k, v in vars(meta).items() if not k.startswith("_")
    }


def dump_state(state: Mapping[str, Any] | None) -> str:
    return json.dumps(state, sort_keys=True)


# ---------------------------------------------------------------------------- CLI


def module_args(module: str, *args: str) -> list[str]:
    """Interpreter arguments that run `module` from any working directory.

    `-P` (Python 3.11+) keeps `python -m` from putting the working directory first on `sys.path`: in the
    root of a source checkout the folder `envace_mcp/` (which has no `servers/`; setuptools installs
    `servers/` as `envace_mcp.servers`) would shadow the installed package and the server would not start.
    """
    return ["-P", "-m", module, *args]


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
"""Binds that listen on every address: no one name says which Host header clients will send."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def remote_refusal(host: str, allow_remote: bool, allowed_hosts: Sequence[str] = ()) -> str | None:
    """Why serving over HTTP on `host` is refused, or None. The bundled servers have no authentication:
    off loopback, anyone who can reach the port can call every tool, so that takes an explicit flag."""
    if is_loopback(host):
        return None
    if not allow_remote:
        return (f"--host {host!r} is not a loopback address and the server has no authentication: anyone who can "
                "reach it could call every tool; pass --allow-remote to serve it there anyway")
    if host in WILDCARD_HOSTS and not allowed_hosts:
        return (f"--host {host!r} listens on every address: name the host names or addresses clients will use with "
                "--allowed-host (requests naming any other host are refused, against DNS rebinding)")
    return None


def http_security(host: str, allowed_hosts: Sequence[str] = ()) -> Any:
    """DNS-rebinding protection for a streamable HTTP server bound to `host`: a request's Host header must
    name `host`, loopback (when `host` is loopback) or one of `allowed_hosts`, and a browser's Origin one
    of those too. The SDK turns it on by itself only for exactly 127.0.0.1, localhost and ::1, and leaves
    it off for any other bind."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = [*allowed_hosts, *([] if host in WILDCARD_HOSTS else [host]), *(LOOPBACK_HOSTS if is_loopback(host) else ())]
    hosts = [_host_form(name) for name in dict.fromkeys(names)]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[form for h in hosts for form in (h, f"{h}:*")],
        allowed_origins=[f"{scheme}://{form}" for h in hosts for scheme in ("http", "https") for form in (h, f"{h}:*")],
    )


def _host_form(name: str) -> str:
    """An address as a Host header writes it (IPv6 in brackets)."""
    try:
        return f"[{name}]" if ipaddress.ip_address(name).version == 6 else name
    except ValueError:
        return name


def serve(build: Callable[..., Any], description: str, argv: Sequence[str] | None = None) -> None:
    """`python -P -m envace_mcp.servers.X [--transport stdio|http] [--host H] [--port P] [--seed N]
    [--allow-remote] [--allowed-host NAME ...]`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--transport", choices=["stdio", "http", "streamable-http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0, help="seed of the default world and of the task suite")
    parser.add_argument("--allow-remote", action="store_true",
                        help="serve on a --host other than loopback (the server has no authentication)")
    parser.add_argument("--allowed-host", action="append", default=[],
                        help="a Host header clients may send besides --host (repeatable)")
    args = parser.parse_args(argv)
    refusal = None if args.transport == "stdio" else remote_refusal(args.host, args.allow_remote, args.allowed_host)
    if refusal:
        parser.error(refusal)
    server = build(seed=args.seed)
    if args.transport == "stdio":
        server.run("stdio")
        return
    server.run("streamable-http", host=args.host, port=args.port,
               transport_security=http_security(args.host, args.allowed_host))

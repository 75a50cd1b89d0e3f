"""What the bundled servers share: per-episode state and the command line.

Episode isolation (`envace_mcp.envs.episode`): every tool call may carry `_meta` keys `envace/episode` (a
state key) and `envace/task` (a suite task id). The first call of an episode builds its state from that
task's initial state (or from the server's seeded default world), so parallel rollouts never share state
and a new key is a reset. The state of an episode is readable as the resource
`envace://episodes/{episode}/state` (the checker reads it; agents have no tool for it).
"""

from __future__ import annotations

import argparse
import copy
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envace_mcp.envs.episode import EPISODE_KEY, TASK_KEY

from .security import http_security, remote_refusal

DEFAULT_EPISODE = "default"


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

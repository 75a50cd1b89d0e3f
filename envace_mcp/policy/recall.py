"""Calls a world model recalls: the user's logged calls of each tool, so a rehearsal sees how this very
server answered calls like the one it predicts — from the moment a log is imported, before any fit.

    log = CallLog(entries)                      # or CallLog.read(folder); worldmodel.calls.call_log(calls)
    log.similar(call, tool, k=3)                -> the k logged calls of that tool most like `call`, as `Example`s
    log.write(folder)                           -> recall.jsonl, which a policy loaded with that adapter carries

A call is like another when its arguments are: the same value at the same place counts most, the same
argument names with other values a little, arguments only one of them has count against. Ties go to the
later call. Only calls of the same tool (name, and server where both name one) are recalled, and never the
run the call itself belongs to (`exclude`), so a measurement never shows a call its own answer.

A `recall.jsonl` is read like any file from outside: size and nesting bounded, a malformed line skipped
and counted, replies clipped; it only ever reaches a prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace_mcp._files import read_bounded
from envace_mcp.policy.types import Example, ToolCall

if TYPE_CHECKING:
    from envace_mcp.toolbox.catalog import ToolSpec

RECALL_FILE = "recall.jsonl"
K = 3
"""Logged calls shown per rehearsal: enough to show the tool's error and its result, few enough to keep the
prompt short."""
PER_TOOL = 256
"""Logged calls kept per tool (the latest): the search stays fast and the file small."""
REPLY_CHARS = 400
"""A recalled reply is clipped to this many characters: its status and first fields are what a rehearsal
needs of it, and every character is paid for in each rehearsal and each training row."""
MAX_BYTES = 16 << 20
"""A `recall.jsonl` larger than this is not read."""


@dataclass(frozen=True)
class Logged:
    """One logged call: what was called and what the server answered."""

    tool: str
    arguments: dict[str, Any]
    reply: str
    """The reply as the agent saw it (`ToolResult.text_of`), clipped to `REPLY_CHARS`."""
    failed: bool
    server: str | None = None
    episode: str = ""
    """The run it came from (a rehearsal of a call in that run never recalls it)."""

    def example(self) -> Example:
        """As a rehearse prompt shows it (`RehearseRequest.similar`)."""
        return Example(self.tool, self.arguments, self.reply)


def _leaves(value: Any, path: str = "") -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_leaves(item, f"{path}.{key}"))
        return out or {path: "{}"}
    if isinstance(value, list):
        out = {}
        for i, item in enumerate(value):
            out.update(_leaves(item, f"{path}[{i}]"))
        return out or {path: "[]"}
    return {path: json.dumps(value, sort_keys=True, default=str)}


def likeness(a: dict[str, str], b: dict[str, str]) -> float:
    """How alike two calls' flattened arguments are: +1 per place with the same value, +0.25 per place
    both have with different values, −0.25 per place only one has."""
    same = sum(1.0 if a[p] == b[p] else 0.25 for p in a.keys() & b.keys())
    return same - 0.25 * len(a.keys() ^ b.keys())


class CallLog:
    """Logged calls by tool, searchable by how alike their arguments are (`similar`)."""

    def __init__(self, entries: Iterable[Logged] = (), *, source: str | None = None) -> None:
        self.by_tool: dict[str, list[tuple[Logged, dict[str, str]]]] = {}
        for entry in entries:
            kept = self.by_tool.setdefault(entry.tool, [])
            kept.append((entry, _leaves(entry.arguments)))
            if len(kept) > PER_TOOL:
                del kept[0]
        self.source = source
        self.skipped = 0
        """Lines of the file it was read from that could not be read."""

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_tool.values())

    def entries(self) -> list[Logged]:
        return [entry for kept in self.by_tool.values() for entry, _ in kept]

    def nearest(self, call: ToolCall, server: str | None = None, k: int = K, exclude: str | None = None) -> list[Logged]:
        """The `k` logged calls of `call`'s tool most like it, most alike first (ties: the later one)."""
        arguments = call.arguments if isinstance(call.arguments, dict) else {}
        leaves = _leaves(arguments)
        ranked = []
        for order, (entry, theirs) in enumerate(self.by_tool.get(call.name, [])):
            if exclude and entry.episode == exclude:
                continue
            if server and entry.server and server != entry.server:
                continue
            ranked.append((likeness(leaves, theirs), order, entry, theirs))
        ranked.sort(key=lambda r: (r[0], r[1]), reverse=True)
        out: list[Logged] = []
        seen: set[tuple[frozenset[tuple[str, str]], str]] = set()
        for _, _, entry, theirs in ranked:
            key = (frozenset(theirs.items()), entry.reply)  # its flattened arguments, already at hand
            if key in seen:  # the same call answered the same way teaches nothing twice
                continue
            seen.add(key)
            out.append(entry)
            if len(out) == k:
                break
        return out

    def similar(self, call: ToolCall, tool: ToolSpec | None = None, k: int = K,
                exclude: str | None = None) -> list[Example]:
        """`nearest` as the examples a rehearse prompt shows (`RehearseRequest.similar`); `tool`: the
        called `ToolSpec` (its server narrows the search)."""
        server = getattr(tool, "server", None) or None
        return [e.example() for e in self.nearest(call, server, k, exclude)]

    # ------------------------------------------------------------------ files

    def write(self, folder: str | Path) -> Path:
        path = Path(folder) / RECALL_FILE
        with path.open("w", encoding="utf-8") as handle:
            for entry in self.entries():
                handle.write(json.dumps(asdict(entry), ensure_ascii=False, default=str) + "\n")
        return path

    @classmethod
    def read(cls, folder: str | Path | None) -> CallLog | None:
        """The `recall.jsonl` of an adapter folder; None where it has none (or it is past `MAX_BYTES`)."""
        if folder is None:
            return None
        path = Path(folder) / RECALL_FILE
        text = read_bounded(path, MAX_BYTES)
        if text is None:
            return None
        lines = text.splitlines()
        entries, skipped = [], 0
        for line in lines:
            entry = _entry(line)
            if entry is None:
                skipped += line.strip() != ""
            else:
                entries.append(entry)
        log = cls(entries, source=str(path))
        log.skipped = skipped
        return log


def _entry(line: str) -> Logged | None:
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    tool, arguments, reply = data.get("tool"), data.get("arguments"), data.get("reply")
    server, episode = data.get("server"), data.get("episode", "")
    if not (isinstance(tool, str) and tool and isinstance(arguments, dict) and isinstance(reply, str)
            and isinstance(data.get("failed"), bool) and (server is None or isinstance(server, str))
            and isinstance(episode, str)):
        return None
    try:
        json.dumps(arguments)  # nesting too deep to write back is too deep to keep
    except (ValueError, RecursionError):
        return None
    return Logged(tool, arguments, reply[:REPLY_CHARS], data["failed"], server, episode)

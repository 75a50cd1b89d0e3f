r"""Untrusted text on a terminal: shown as written, never obeyed.

Arguments, rehearsals, tool replies, task texts, traces and catalog fields come from models, servers
and files. Printed as rich markup, `[conceal]` in a memo hides what follows and `[/]` crashes the
command; written raw, `ESC M` or `ESC c` moves the cursor or wipes the screen, so a reply can paint
over the call a person is approving. Everything here is a rich `Text` (never parsed as markup) whose
control characters are replaced by visible escapes:

    console.print(safe("pay\x1bM[/]"))   # prints: pay\x1bM[/]

And a question asked on a terminal is answered only by what is typed after it (`discard_typed_ahead`).
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from envace_mcp._text import json_text, key_text, visible

__all__ = ["call_display", "call_lines", "discard_typed_ahead", "inline_call", "json_text", "key_text", "safe",
           "visible"]

def safe(value: Any, style: str = "", *, newlines: bool = False) -> Text:
    """Untrusted text (or a value, as JSON) as a `Text` a terminal shows and does not obey."""
    return Text(visible(json_text(value), newlines=newlines), style=style)


def inline_call(name: Any, args: Any, prefix: Text | str = "") -> Text:
    """`name({...})` on one line, whole."""
    shown = json.dumps(args, ensure_ascii=False) if isinstance(args, str) else args
    return Text.assemble(prefix, safe(name, "bold"), "(", safe(shown), ")")


def call_lines(name: Any, args: Any, prefix: Text | str = "", *, indent: int = 0) -> RenderableType:
    """A call with every argument whole, one per line: `prefix name(` at `indent` columns, then
    `key: <json value>` lines, then `)`. A long value folds under itself, never under the names, so no
    part of it can pass for an argument."""
    if not isinstance(args, dict) or not args:
        return _indented(inline_call(name, args, prefix), indent)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(overflow="fold", max_width=32)
    grid.add_column(overflow="fold")
    for key, value in args.items():
        grid.add_row(Text(key_text(key) + ":"), safe(json.dumps(value, ensure_ascii=False, default=str)))
    return Group(_indented(Text.assemble(prefix, safe(name, "bold"), "("), indent), _indented(grid, indent + 4),
                 _indented(Text(")"), indent))


def call_display(name: Any, args: Any, width: int, prefix: Text | str = "", *, indent: int = 0) -> RenderableType:
    """`inline_call` when it fits in `width` columns, else `call_lines`: never cut."""
    line = inline_call(name, args, prefix)
    if indent + line.cell_len <= width:
        return _indented(line, indent)
    return call_lines(name, args, prefix, indent=indent)


def _indented(renderable: RenderableType, columns: int) -> Padding:
    return Padding(renderable, (0, 0, 0, columns), expand=False)


def discard_typed_ahead(stdin: Any) -> None:
    """Keys pressed before a question is shown do not answer it (a second `y` typed for the call before, or
    one typed while a model loaded): called right before the question is printed, by every question asked
    on a terminal."""
    try:
        import termios

        termios.tcflush(stdin.fileno(), termios.TCIFLUSH)
    except (ImportError, OSError, ValueError, AttributeError):
        pass

r"""Untrusted text made visible: every control, format and separator character written as an escape.

What a model, a server, a tool reply, a task or a trace file says reaches a person as text they can
read, never as instructions to their terminal (`ESC M` moving the cursor over an approval line,
`U+202E` reversing an id). Plain strings, no rich: the graph's approval descriptions use it as the
CLI's `_terminal` does.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SUSPECT = re.compile(r"[^\x20-\x7e]")
# Cc: C0, DEL, C1. Cf: bidi overrides and isolates (U+202A-U+202E, U+2066-U+2069), marks, zero-width and tag
# characters: text that reorders or hides what is around it. Zl/Zp: line breaks of their own. Cs: lone
# surrogates (undecodable bytes from a server), which a UTF-8 terminal cannot even be sent.
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
# Characters that draw nothing (or only blank) though no category above says so: Unicode's default-ignorable
# code points outside Cf (combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian and
# other variation selectors), the blank Braille pattern, and every space but U+0020 (Zs): "ali\u034fce"
# must not pass for "alice", nor a no-break space for a space.
_BLANK = frozenset({0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x2800, 0x3164, 0xFFA0,
                    *range(0x180B, 0x1810), *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)})


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100 and unicodedata.category(char) == "Cc":
        return f"\\x{code:02x}"
    if unicodedata.category(char) in _HIDDEN or code in _BLANK or unicodedata.category(char) == "Zs":
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return char


def visible(text: str, *, newlines: bool = False) -> str:
    """`text` with every control, format and separator character written as an escape (`\\x1b`, `\\n`,
    `\\u202e`). `newlines`: keep line breaks as breaks (prose and indented JSON), each line still escaped."""
    if newlines:
        return "\n".join(_SUSPECT.sub(_escape, line) for line in text.split("\n"))
    return _SUSPECT.sub(_escape, text)


def json_text(value: Any) -> str:
    """A value as one line of JSON (strings as they are)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def key_text(key: Any) -> str:
    """An argument's name: bare when it reads as an identifier, else quoted JSON (a name holding `: `
    or quotes cannot pass for two arguments)."""
    key = str(key)
    return key if _KEY.fullmatch(key) else visible(json.dumps(key, ensure_ascii=False))

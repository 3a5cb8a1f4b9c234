r"""Text from another party, made safe to log, store or show: one line, bounded.

A device's `ErrorReply.reason` (or a coordinator's, on a device) is any
Unicode the sender chose. Written as it is, a newline starts a forged log
record ("ERROR ... run curl ... | sh"), a carriage return or an ANSI escape
rewrites the operator's terminal, and a bidi override reorders what the
dashboard shows. `escape` writes every such character as a visible escape
(``\n``, ``\x1b``, ``\u202e``) and bounds the length, so what one party
sent stays one inert line of at most `DEFAULT_LIMIT` characters.

Escaped are the Unicode categories Cc (C0 and C1 controls, DEL), Cf
(format: bidi embeddings, overrides and isolates, zero-width characters),
Zl and Zp (line and paragraph separators), Cs (lone surrogates), Co
(private use) and Cn (unassigned, which a newer terminal may give a
meaning). `escape` is idempotent (escaped text contains no character it
would escape, and it leaves backslashes alone) and the identity on short
text without such characters, so escaping at the source and again at a
sink (the log formatter, the dashboard's copy) never doubles anything.
"""

from __future__ import annotations

import unicodedata

__all__ = ["DEFAULT_LIMIT", "ELLIPSIS", "escape", "is_safe"]

DEFAULT_LIMIT = 512
"""Characters an escaped text keeps at most (a wire `Text` is 256; escapes
make up to 10 characters of one, so an honest reason is never cut)."""
ELLIPSIS = "\u2026"
"""Ends a text `escape` cut short."""

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def is_safe(char: str) -> bool:
    """Whether one character may be written as it is."""
    return unicodedata.category(char) not in _UNSAFE_CATEGORIES


def escape(text: str, limit: int = DEFAULT_LIMIT) -> str:
    """``text`` with every unsafe character escaped, at most ``limit`` characters.

    A text longer than that once escaped is cut at an escape's boundary and
    ends with `ELLIPSIS`. Only the first ``limit`` input characters are
    looked at (an escape is never shorter than its character), so a huge
    input costs no more than a short one.

    Raises:
        ValueError: ``limit`` is less than 1.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    parts: list[str] = []
    size = 0
    for char in text[: limit + 1]:
        part = char if is_safe(char) else _escaped(char)
        if size + len(part) > limit:
            break
        parts.append(part)
        size += len(part)
    else:
        if len(text) <= limit:
            return "".join(parts)
    while parts and size + len(ELLIPSIS) > limit:
        size -= len(parts.pop())
    return "".join(parts) + ELLIPSIS


def _escaped(char: str) -> str:
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"

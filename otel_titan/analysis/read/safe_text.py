"""Text and JSON that always encode, and never drive the terminal, whatever the records held.

Every string the analysis prints comes, in the end, from files anyone with
write access to a run could have written: span names, tags, file names. Two
things can go wrong with such text, and both are handled here, once, for
every output:

* **Encoding.** JSON allows ``"\\ud800"`` (a lone UTF-16 surrogate), and the
  file system hands back undecodable bytes of a file name as surrogates too;
  neither can be written as UTF-8, so ``print`` raises ``UnicodeEncodeError``
  and orjson raises "str is not valid UTF-8". `escape_surrogates` turns each
  into its visible escape (the six characters ``\\ud800``).
* **The terminal.** An ESC (``\\x1b[2J``), a carriage return or a bidi
  override in a span name would rewrite the operator's screen. `printable`
  shows every control character as an escape instead.

`json_bytes` is the one JSON encoder of the analysis outputs (the trace, the
summary's ``--json``): orjson, and when orjson refuses a value (a lone
surrogate, an int beyond 64 bits, nesting deeper than it allows), the same
value made safe by `json_safe`, so that one odd record never costs the rest.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import orjson

__all__ = ["printable", "escape_surrogates", "json_safe", "json_bytes", "MAX_DEPTH"]

#: Nesting kept by `json_safe`; deeper values become a marker string (orjson refuses 255 and more).
MAX_DEPTH = 64
#: Unicode categories shown as escapes: controls (C0, DEL, C1), surrogates, line and paragraph
#: separators.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
#: Format characters that reorder what a terminal shows (bidi embeddings, overrides, isolates,
#: marks).
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape_char(char: str) -> str:
    if unicodedata.category(char) not in _ESCAPED_CATEGORIES and char not in _BIDI_CONTROLS:
        return char
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """`text` with every control character, surrogate and bidi control shown as an escape.

    For each piece of text printed for a person (a table line, a warning, an
    error): what the records hold is shown, never executed by the terminal,
    and it always encodes as UTF-8. Letters, CJK, emoji and ordinary spaces
    pass unchanged.

    Example:
        >>> printable("fwd\\x1b[2Jpwned"), printable("a\\nb"), printable("\\ud800x"), printable("步骤 ok")
        ('fwd\\\\x1b[2Jpwned', 'a\\\\nb', '\\\\ud800x', '步骤 ok')
    """
    if text.isprintable():  # the common case, in C: nothing to escape
        return text
    return "".join(map(_escape_char, text))


def escape_surrogates(text: str) -> str:
    """`text` with each lone surrogate written as its escape (``\\udXXX``), so it encodes as UTF-8.

    Example:
        >>> escape_surrogates("fwd\\ud800"), escape_surrogates("ok")
        ('fwd\\\\ud800', 'ok')
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def json_safe(value: Any, depth: int = 0) -> Any:
    """A copy of `value` that orjson can always write.

    Strings (and keys) with lone surrogates are escaped; ints beyond 64 bits
    become their decimal string (JSON numbers that size are not portable);
    keys that are not strings become strings; nesting deeper than `MAX_DEPTH`
    becomes ``"(nested too deep)"``; any other object its ``str``.

    Example:
        >>> json_safe({"rank": 1 << 70, "name": "a\\ud800", 3: [1.5, None]})
        {'rank': '1180591620717411303424', 'name': 'a\\\\ud800', '3': [1.5, None]}
    """
    kind = type(value)
    if kind is str:
        return escape_surrogates(value)
    if kind is int:
        return value if -(1 << 63) <= value < (1 << 64) else str(value)
    if value is None or kind is float or kind is bool:
        return value
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return "(nested too deep)"
        return {
            escape_surrogates(key if type(key) is str else str(key)): json_safe(item, depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            return "(nested too deep)"
        return [json_safe(item, depth + 1) for item in value]
    if isinstance(value, str):
        return escape_surrogates(str(value))
    if isinstance(value, (int, float)):
        return json_safe(int(value) if isinstance(value, int) else float(value), depth)
    return escape_surrogates(str(value))


def json_bytes(value: Any, option: int = 0) -> bytes:
    """`value` as JSON (orjson `option` flags), whatever it holds: never raises for odd data.

    Example:
        >>> import json
        >>> json.loads(json_bytes({"name": "fwd\\ud800", "rank": 1 << 70}))
        {'name': 'fwd\\\\ud800', 'rank': '1180591620717411303424'}
    """
    try:
        return orjson.dumps(value, option=option)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return orjson.dumps(json_safe(value), option=option)

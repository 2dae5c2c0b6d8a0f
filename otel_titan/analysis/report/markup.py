"""The report's HTML pieces: every string from the records escaped, raw HTML only from what this
package makes.

Why: the report is made to be shared, and every string in it (span, scalar
and source names, tags, file names, host names) comes from files anyone with
write access to the run could have written. HTML text and attributes are
escaped (`html.escape`); a table cell is raw HTML only when it is an `Html`
made here; the figures' JSON sits in inline scripts with ``<``, ``>``, ``&``
and the JavaScript line separators written as ``\\uXXXX`` escapes
(`script_json`), so no string can close the script.
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["Html", "named_rank", "ms", "script_json", "table"]


class Html:
    """HTML made by the report itself (never from the records), kept as is in a table cell."""

    def __init__(self, text: str) -> None:
        self.text = text


def named_rank(source: str, rank: int) -> Html:
    """A rank named as a finding: marked up so that a reader (and a test) can find every rank the
    page names.

    Example:
        >>> named_rank("<b>", 3).text
        "<span class=named-rank data-source='&lt;b&gt;' data-rank='3'>rank 3</span>"
    """
    return Html(
        f"<span class=named-rank data-source='{html.escape(source)}' data-rank='{int(rank)}'>rank "
        f"{int(rank)}</span>"
    )


def ms(value: Any) -> str:
    """A duration in ms, two decimals ('' for None)."""
    return "" if value is None else f"{value:,.2f}"


def table(headers: list[str], rows: list[list[Any]], classes: str = "") -> str:
    """An HTML table: headers and cells escaped, but `Html` cells kept as made."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table class='{classes}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    """A table cell's HTML: raw HTML only from `Html` (made here), everything else escaped."""
    if isinstance(value, Html):
        return value.text
    if isinstance(value, float):
        return html.escape(f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}")
    return "" if value is None else html.escape(str(value))


def script_json(text: str) -> str:
    """JSON text made safe inside an inline ``<script>``: ``<``, ``>``, ``&`` and U+2028/9 as
    ``\\uXXXX`` escapes.

    These characters are only ever inside JSON strings, where the escapes
    mean the same characters, so the data are unchanged; but no string can
    now close the script (``</script>``) or open a comment (``<!--``).

    Example:
        >>> script_json('{"name": "</script><script>x()</script>"}')
        '{"name": "\\\\u003c/script\\\\u003e\\\\u003cscript\\\\u003ex()\\\\u003c/script\\\\u003e"}'
    """
    for char, escape in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escape)
    return text

"""Where in the program a process is, from a stack: the innermost frame of the program's own code.

Why its own module: the Hang section (`model.hang`), the crash record's line
(`model.ending`) and `watch` all answer it, by this one rule.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["program_frame", "program_line", "where", "parse_frames"]

_LIBRARY = re.compile(
    r"(^|/)(site-packages|dist-packages|otel_titan|lib/python\d+\.\d+)/|^<frozen |^<string>"
)


def program_frame(frames: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame of the program's own code (`frames` innermost first), else the
    innermost."""
    for frame in frames:
        if not _LIBRARY.search(str(frame.get("file", ""))):
            return frame
    return frames[0] if frames else None


def program_line(frames: Sequence[dict[str, Any]]) -> str | None:
    """``file:line function`` of the innermost frame of the program's own code in a black box's
    stack (innermost first).

    Why: a stuck rank's innermost frame is nearly always a library's (a queue's
    ``get``, torch's collective wrapper, ``selectors``): the line to read is the
    program's call into it. The one rule for `summarize` and `watch`.

    Example:
        >>> program_line([{"file": "/usr/lib/python3.11/queue.py", "line": 171, "function": "get"}, {"file": "train.py", "line": 42, "function": "load_batch"}])
        'train.py:42 load_batch'
        >>> program_line([])
    """
    return where(program_frame(frames))


def where(frame: dict[str, Any] | None) -> str | None:
    """``file:line function`` of one frame, or None."""
    if not frame:
        return None
    return f"{frame.get('file')}:{frame.get('line')} {frame.get('function')}"


def parse_frames(frames: Any) -> list[dict[str, Any]]:
    """``["path:line:function", ...]`` (an ``uncaught_exception`` record's ``error_frames``,
    innermost first) as frames; malformed entries skipped.

    Example:
        >>> parse_frames(["train.py:88:fwd_bwd", "bad"])
        [{'file': 'train.py', 'line': 88, 'function': 'fwd_bwd'}]
    """
    out = []
    for text in frames if isinstance(frames, list) else []:
        parts = text.rsplit(":", 2) if isinstance(text, str) else []
        if len(parts) == 3 and parts[1].isdigit():
            out.append({"file": parts[0], "line": int(parts[1]), "function": parts[2]})
    return out

"""Counts in words, as a person writes them: "1 process", "2 processes", "1,024 ranks".

Why a module: every output of the analysis counts things (processes, ranks,
steps, records, hosts), and "1 processes" in a tool's first line reads as
carelessness; one function, used everywhere, gets the singular right.
"""

from __future__ import annotations

__all__ = ["plural"]

_IRREGULAR = {"process": "processes", "is": "are", "was": "were", "has": "have"}


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and `noun`, singular for exactly 1 (thousands separated); `many` when the plural is
    not `noun` + s.

    Example:
        >>> plural(1, "process"), plural(2, "process"), plural(1024, "rank"), plural(0, "step")
        ('1 process', '2 processes', '1,024 ranks', '0 steps')
    """
    if count == 1:
        return f"1 {noun}"
    return f"{count:,} {many or _IRREGULAR.get(noun, noun + 's')}"

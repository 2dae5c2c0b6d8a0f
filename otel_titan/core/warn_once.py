"""Warn about something the first time it happens, count it every time: the one helper for it.

A logger must not flood the log it lives next to (a bad value every step, an
exporter failing every batch), and must not hide a fault either: so the first
occurrence of each kind (a key: a scalar name, an exporter, an error site) is
logged, in full, and the later ones are only counted, in a counter that ends up
in the file or in `PipelineStats`. Bounded: past `limit` distinct keys no new
key is remembered, and so none is warned about (the counting goes on).

Example:
    >>> once = WarnOnce()
    >>> once.first("loss"), once.first("loss"), once.first("lr")
    (True, False, True)
    >>> once.count("loss")
    2
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["WarnOnce"]


class WarnOnce:
    """Remembers which keys were already reported; thread-safe enough (a lost race warns twice,
    never zero times)."""

    __slots__ = ("_counts", "_limit")

    def __init__(self, limit: int = 1000) -> None:
        self._counts: dict[Hashable, int] = {}
        self._limit = limit

    def first(self, key: Hashable = None) -> bool:
        """Count one occurrence of `key`; True when it is the first (so the caller warns)."""
        counts = self._counts
        count = counts.get(key)
        if count is not None:
            counts[key] = count + 1
            return False
        if len(counts) >= self._limit:
            return False
        counts[key] = 1
        return True

    def count(self, key: Hashable = None) -> int:
        """How many times `key` occurred (0 for a key never seen, or past the limit)."""
        return self._counts.get(key, 0)

    def reset(self) -> None:
        """Forget every key (a new logger warns again)."""
        self._counts.clear()

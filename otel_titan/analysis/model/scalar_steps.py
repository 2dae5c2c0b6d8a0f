"""The scalars over steps (``sl.log_trace_scalar``: loss, learning rate, ...): per name and step,
the values of every rank.

Why in the model: the report draws each scalar's min, median and max across
ranks per step, and it draws them from the summary's one read of the run
(it once loaded the run into DuckDB for this alone, a second read). What is
kept is bounded by what is drawn: the first `SERIES_KEPT` names (in name
order, as the report shows them), per step their finite values, 8 bytes
each (the phases' durations cost the same); a name beyond them costs one
comparison per record. NaN and ±Infinity (``"NaN"`` in the files) and
values without a step are not drawn, so not kept.

Example:
    >>> kept = ScalarSteps()
    >>> for rank in range(3):
    ...     kept.observe({"event_name": "loss", "step": 1, "value": 2.0 + rank})
    >>> kept.observe({"event_name": "loss", "step": 1, "value": "NaN"})
    >>> {name: {step: list(values) for step, values in steps.items()} for name, steps in kept.series.items()}
    {'loss': {1: [2.0, 3.0, 4.0]}}
"""

from __future__ import annotations

import math
from array import array
from typing import Any

__all__ = ["ScalarSteps", "SERIES_KEPT"]

#: Scalars kept (and drawn by the report) at most: the first by name.
SERIES_KEPT = 12


class ScalarSteps:
    """Per scalar name (the first `kept` by name) and step: its finite values, every rank's."""

    def __init__(self, kept: int = SERIES_KEPT) -> None:
        self.kept = kept
        # name → step → values (one per record of that name and step, every rank's)
        self.series: dict[str, dict[int, array]] = {}
        # Once `kept` names are held: the largest of them (a name above it is not kept).
        self._cutoff: str | None = None

    def observe(self, record: dict[str, Any]) -> None:
        """Take one ``metric_value`` record (malformed ones are ignored: any field may be
        anything)."""
        name, step, value = record.get("event_name"), record.get("step"), record.get("value")
        if type(name) is not str or type(step) is not int or type(value) not in (float, int):
            return
        cutoff = self._cutoff
        if cutoff is not None and name > cutoff:
            return
        series = self.series.get(name)
        if series is None:
            if not math.isfinite(value):  # type: ignore[arg-type]  # a float or int: its type() was checked above
                return
            series = self._add(name)
        elif not math.isfinite(value):  # type: ignore[arg-type]  # a float or int: its type() was checked above
            return
        values = series.get(step)
        if values is None:
            values = series[step] = array("d")
        values.append(float(value))  # type: ignore[arg-type]  # a float or int: its type() was checked above

    def _add(self, name: str) -> dict[int, array]:
        """A new series for `name`, dropping the largest name kept when `kept` are already held."""
        if len(self.series) >= self.kept:
            del self.series[max(self.series)]
        series = self.series[name] = {}
        self._cutoff = max(self.series) if len(self.series) >= self.kept else None
        return series

    def merge(self, other: ScalarSteps) -> None:
        """Add another worker's values (disjoint processes); the first `kept` names of both are
        kept."""
        for name, steps in other.series.items():
            mine = self.series.get(name)
            if mine is None:
                if self._cutoff is not None and name > self._cutoff:
                    continue
                mine = self._add(name)
            for step, values in steps.items():
                held = mine.get(step)
                if held is None:
                    mine[step] = array("d", values)
                else:
                    held.extend(values)

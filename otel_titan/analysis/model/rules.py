"""The rules that define a step, the step-closing span and a robust z: written once, here, for
Python and SQL alike.

Why one place: ``summarize`` (`model.collect`, `model.stragglers`), ``sql``
(`query.sql`'s views and its clock alignment), ``report`` and ``watch`` all
answer "how long was step N", "which span closed it", "how far from its
peers is this rank". When each wrote its own, they drifted apart (SQL's
``steps`` started a step at any record stamped with it, the logger's own
records and ``_end``\\ s included; its step-closing spans left out every
process's last step; its list of the logger's records had no ``stall``).
Here each rule is a constant or a function with the reason beside it, and the
SQL text is built from the same constants (`sql_in_list`, `STEP_BEGIN_SQL`),
so that a change here changes every command. tests/analysis/model/test_rules.py
checks that SQL and Python give the same steps, step-closing spans and
spread on a generated run.

Example:
    >>> attempt_step(1, 5) - attempt_step(0, 5) == ATTEMPT_STRIDE
    True
    >>> sql_in_list(["a", "b'c"])
    "('a', 'b''c')"
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from typing import Any

from otel_titan.schema import META_EVENTS

__all__ = [
    "ATTEMPT_STRIDE",
    "attempt_step",
    "LOGGER_RECORDS",
    "begins_step",
    "logger_scalar",
    "STEP_BEGIN_SQL",
    "CLOSING_SPAN_SQL",
    "MAD_TO_SD",
    "MEDIAN_SE",
    "robust_sd",
    "sql_in_list",
]

#: A restart replays the first attempt's step numbers: (attempt, step) is one number, ``attempt ×
#: 2⁴⁰ + step``, so that restart 1's step 5 is never the first attempt's step 5 (2⁴⁰ steps: more
#: than any run takes).
ATTEMPT_STRIDE = 1 << 40

#: The logger's own records (docs/schema.md): process-level markers, never phases, and never the
#: start of a step (a heartbeat stamped with the current step says nothing about when the step
#: began).
LOGGER_RECORDS: frozenset[str] = META_EVENTS


def attempt_step(attempt: int | None, step: int) -> int:
    """One number per (attempt, step) (`ATTEMPT_STRIDE`): a restart's step N is not the first
    attempt's.

    Example:
        >>> attempt_step(None, 7), attempt_step(2, 7) == 2 * ATTEMPT_STRIDE + 7
        (7, True)
    """
    return (attempt or 0) * ATTEMPT_STRIDE + step


def begins_step(name: str) -> bool:
    """Whether a record named `name` (``log_type_name``) stamped with a new step can begin that
    step.

    A step begins at the first ``_start``, instant or scalar stamped with a
    step above every earlier one (`model.timeline`). ``_end`` and ``_error``
    records carry the step their span *started* in, so they never begin one;
    nor do the logger's own records (`LOGGER_RECORDS`). A step ends where the
    next begins; a process's last step has no end (its time is unknown).

    Example:
        >>> begins_step("fwd_start"), begins_step("fwd_end"), begins_step("heartbeat"), begins_step("metric_value")
        (True, False, False, True)
    """
    return not (name.endswith("_end") or name.endswith("_error") or name in LOGGER_RECORDS)


#: A ``caller`` in otel-titan's own core (the step sampler): the logger wrote the record itself, the
#: program did not.
_LOGGER_CODE = re.compile(r"(^|/)otel_titan/core/[a-z_]+\.py(:\d+:\w+)?$")
#: caller → whether it is the logger's (a run has a handful of distinct ones).
_LOGGER_FILES: dict[str, bool] = {}


def logger_scalar(record: dict[str, Any]) -> bool:
    """Whether a ``metric_value`` record is one the logger wrote itself (the per-step memory and
    process figures), not the program.

    Why: where a process stopped is its program's last record. The figures are
    written by the logger's background thread at each step boundary and at
    shutdown, after the program's last record (after the ``fwd_bwd_error`` of a
    crash too), so "after metric_value" said where the logger stopped. They are
    recognised by their ``caller``, otel-titan's own code (the program's
    scalars name the program's line; summarize's trimmed records keep
    ``caller``, not ``log_file``).

    Example:
        >>> logger_scalar({"log_type_name": "metric_value", "caller": "/venv/lib/python3.11/site-packages/otel_titan/core/step_sampler.py:72:_sample"})
        True
        >>> logger_scalar({"log_type_name": "metric_value", "caller": "train.py:9:main"}), logger_scalar({"log_type_name": "fwd_start", "caller": "otel_titan/core/x.py:1:f"})
        (False, False)
    """
    if record.get("log_type_name") != "metric_value":
        return False
    path = record.get("caller")
    if not isinstance(path, str):
        return False
    known = _LOGGER_FILES.get(path)
    if known is None:
        known = _LOGGER_CODE.search(path) is not None
        if len(_LOGGER_FILES) < 1024:
            _LOGGER_FILES[path] = known
    return known


def sql_in_list(values: Iterable[str]) -> str:
    """`values` as an SQL list of string literals, sorted (quotes doubled): for ``x IN (...)``."""
    return "(" + ", ".join("'" + value.replace("'", "''") + "'" for value in sorted(values)) + ")"


#: `begins_step` in SQL, over the ``records`` table's ``log_type_name`` (used by the ``steps``
#: view).
STEP_BEGIN_SQL = (
    "log_type_name IS NOT NULL AND NOT suffix(log_type_name, '_end') AND NOT "
    "suffix(log_type_name, '_error') "
    f"AND log_type_name NOT IN {sql_in_list(LOGGER_RECORDS)}"
)

#: The step-closing span of a process's step: the top-level span (no parent) started in the step
#: that ended last, once complete. In synchronous training that is the collective every rank leaves
#: together (the clocks are aligned on its end, `model.clocks`), and arriving late at it is what a
#: straggler does to the others. Only spans that ended before the next step began count
#: (`model.timeline` reads records in file order: a later end belongs to no closed step). Every step
#: counts, the process's last included (it may end in its closing span before the process stops). In
#: SQL, over the ``spans`` view: this condition on a span, the end before the next step's start (the
#: ``steps`` view), then per (process, step) ``arg_max(name, end_us)``
#: (`query.sql.CLOSING_SPANS_QUERY`).
CLOSING_SPAN_SQL = "parent_span_id IS NULL AND NOT incomplete AND step IS NOT NULL"

#: The median absolute deviation (MAD) × this estimates a standard deviation for normal data, robust
#: to outliers.
MAD_TO_SD = 1.4826
#: ... × this / √n more: the standard error of a median of n values (π/2 ≈ 1.2533², the median's
#: efficiency).
MEDIAN_SE = 1.2533


def robust_sd(values: list[float]) -> float:
    """`MAD_TO_SD` × the median absolute deviation of `values` (0.0 for none): the robust spread z
    is measured in.

    Written in SQL as ``MAD_TO_SD * mad(x)`` (DuckDB's ``mad``: the same median absolute deviation).

    Example:
        >>> round(robust_sd([1.0, 2.0, 3.0, 4.0, 100.0]), 4)
        1.4826
    """
    if not values:
        return 0.0
    center = statistics.median(values)
    return MAD_TO_SD * statistics.median([abs(v - center) for v in values])

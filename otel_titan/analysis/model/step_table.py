"""The step table: per (source, attempt, rank, step) the step time, each phase's count and total,
the step-closing span.

Two ways to the same table. From the writer's rollups (`read.rollups`: one
line per rank and step, a few percent of the bytes, the rest of the files
only searched, never parsed) when every process's rollups hold everything
its spans do (`read.rollups.ProcessRollups.why_not`); else from the spans,
through the model's own accumulators (`model.collect`: per rank one time per
step, per phase and rank one total and count per step, per process its
step-closing spans), the ones the straggler verdicts are computed from.
Both are put in one shape and merged by one function (`_rows`), so that
several processes of one rank merge alike (the later file's step wins, phase
by phase).

What a row says (docs/analysis.md, "The step table"):

* `step_ms`: from the step's first record to the next step's, None for a
  process's last step (nothing ends it: summarize leaves it out too);
* `phases`: span name → (count, total ms) of the spans that started in the
  step and ended, to the µs;
* `closing`, `closing_enter_us`, `closing_exit_us`: the step-closing span
  (`schema.StepCloser`) and when the rank entered and left it, on the
  rank's own clock as written (no clock alignment).

The two agree exactly but where the reader corrects what was written: a
child span whose end pokes out of its parent's by a few µs (the reader ends
the parent with it, the writer sums end − start as written), a span whose
wall clock jumped (the reader takes its monotonic duration).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_titan.analysis.model.collect import _attempt_step
from otel_titan.analysis.read.rollups import ProcessRollups

__all__ = ["StepRow", "StepTable", "rows_from_collected", "rows_from_rollups"]

_Key = tuple[str, "int | None", int]


@dataclass(slots=True)
class StepRow:
    """One rank's step: its time, its phases' counts and totals, its step-closing span.

    Example:
        >>> row = StepRow("training", 0, 3, 5, 100.034, {"fwd": (1, 30.231)}, "all_reduce", 1_000_000, 1_020_004)
        >>> row.phases["fwd"], row.closing_exit_us - row.closing_enter_us
        ((1, 30.231), 20004)
    """

    source: str
    attempt: int | None
    rank: int
    step: int
    #: From the step's first record to the next step's (ms); None when no next step ended it (a
    #: process's last).
    step_ms: float | None
    #: Span name → (count, total ms, to the µs) of its spans that started in the step and ended.
    phases: dict[str, tuple[int, float]]
    #: The step-closing span's name, and when the rank entered and left it (µs, its own clock as
    #: written).
    closing: str | None = None
    closing_enter_us: int | None = None
    closing_exit_us: int | None = None


@dataclass
class StepTable:
    """The rows, ordered by source, attempt, rank, step, and where they came from.

    `source`: ``"rollups"`` or ``"spans"``; `why_spans`: when from the spans,
    why not from rollups (the first process found whose rollups do not hold
    every span, and why); `parsed_bytes` of `total_bytes`: what was parsed to
    answer (from rollups: their lines and each file's first and last).
    """

    rows: list[StepRow]
    source: str
    why_spans: list[str] = field(default_factory=list)
    parsed_bytes: int = 0
    total_bytes: int = 0


def rows_from_collected(collected: tuple[Any, Any, Any, Any]) -> list[StepRow]:
    """The rows from the model's accumulators: `(step_ms, phase_step_ms, phase_step_count, closing)`
    of `model.collect`'s collector."""
    step_ms, phase_ms, phase_count, closing = collected
    times: dict[_Key, dict[int, float]] = {}
    # Rounded to the µs here: sums of float ms (the rollups' totals are whole µs already).
    for (source, attempt), per_rank in step_ms.items():
        for rank, steps in per_rank.items():
            times.setdefault((source, attempt, rank), {}).update(
                (step, round(ms, 3)) for step, ms in steps.items()
            )
    phases: dict[_Key, dict[int, dict[str, tuple[int, float]]]] = {}
    for (source, attempt, name), per_rank in phase_ms.items():
        counts_of = phase_count.get((source, attempt, name), {})
        for rank, steps in per_rank.items():
            counts = counts_of.get(rank, {})
            own = phases.setdefault((source, attempt, rank), {})
            for step, ms in steps.items():
                own.setdefault(step, {})[name] = (counts.get(step, 0), round(ms, 3))
    closers: dict[_Key, dict[int, tuple[str, int, int]]] = {}
    for process, spans in closing:
        if process.rank is None:
            continue
        base = _attempt_step(process.attempt, 0)
        own_closing = closers.setdefault((process.source, process.attempt, process.rank), {})
        for step, name, start_us, end_us in zip(spans.steps, spans.names, spans.starts, spans.ends):
            own_closing[step - base] = (name, start_us, end_us)
    return _rows(times, phases, closers)


def rows_from_rollups(scans: Iterable[ProcessRollups]) -> list[StepRow]:
    """The rows from the processes' rollups (`read.rollups.scan_rollups`), merged as the model
    merges processes: in order, the later one's step winning, phase by phase."""
    times: dict[_Key, dict[int, float]] = {}
    phases: dict[_Key, dict[int, dict[str, tuple[int, float]]]] = {}
    closers: dict[_Key, dict[int, tuple[str, int, int]]] = {}
    for scan in scans:
        process = scan.process
        if process.rank is None:
            continue
        key = (process.source, process.attempt, process.rank)
        own_times, own_phases, own_closing = (
            times.setdefault(key, {}),
            phases.setdefault(key, {}),
            closers.setdefault(key, {}),
        )
        for step, rollup in scan.steps.items():
            if rollup.complete:
                own_times[step] = (rollup.end_us - rollup.begin_us) / 1000.0
            if rollup.phases:
                merged = {
                    name: (count, total_us / 1000.0)
                    for name, (count, total_us) in rollup.phases.items()
                }
                # another process of this rank had the step: phase by phase, as the model merges
                if step in own_phases:
                    own_phases[step].update(merged)
                else:
                    own_phases[step] = merged
            if rollup.closing is not None:
                own_closing[step] = rollup.closing
    return _rows(times, phases, closers)


def _rows(
    times: dict[_Key, dict[int, float]],
    phases: dict[_Key, dict[int, dict[str, tuple[int, float]]]],
    closers: dict[_Key, dict[int, tuple[str, int, int]]],
) -> list[StepRow]:
    out: list[StepRow] = []
    nothing: dict[str, tuple[int, float]] = {}
    for key in sorted(
        {*times, *phases, *closers}, key=lambda k: (k[0], -1 if k[1] is None else k[1], k[2])
    ):
        source, attempt, rank = key
        own_times, own_phases, own_closing = (
            times.get(key, {}),
            phases.get(key, {}),
            closers.get(key, {}),
        )
        for step in sorted({*own_times, *own_phases, *own_closing}):
            closing = own_closing.get(step)
            # Positional, in the fields' order: one row per rank and step. Each row's phases are its
            # own dict (built per step above).
            if closing is None:
                out.append(
                    StepRow(
                        source,
                        attempt,
                        rank,
                        step,
                        own_times.get(step),
                        own_phases.get(step) or dict(nothing),
                    )
                )
            else:
                out.append(
                    StepRow(
                        source,
                        attempt,
                        rank,
                        step,
                        own_times.get(step),
                        own_phases.get(step) or dict(nothing),
                        closing[0],
                        closing[1],
                        closing[2],
                    )
                )
    return out

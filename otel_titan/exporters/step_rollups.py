"""Per-step totals of one process's spans, summed on the writer's thread as the records pass: the
``step_rollup`` records.

The JSONL writer hands every timeline it encodes to `StepRollups.observe`
(the processor thread; the training thread does nothing more than before).
The rules are the reader's (analysis/timeline.py, docs/schema.md), so a
rollup says what the reader would compute from the spans it sums:

* step N begins at the first span start, instant or scalar stamped with a
  step above every earlier one (the logger's own records never move the
  step), and ends where the next begins;
* a span belongs to the step it started in; its time is end − start of its
  two records' whole-µs timestamps; spans still open are not in the totals;
* the step-closing span is `schema.StepCloser`'s: the last top-level span of
  the step to end before the next step begins.

A step's rollup is written once the next step has begun and every span
that started in it has ended (an asynchronous checkpoint span may end
later); a step waits for its open spans only until two more steps have
begun, and then goes out with their count in ``open_spans``. A span that
ends after its step's rollup is out (one of those, or a span a thread
stamped with an older step) is in no rollup: ``late_spans`` counts them,
for the whole file so far, so that a reader knows the rollups no longer hold
every span the file does. `final` writes
what is left: at a clean shutdown the last step (``complete`` false: it has
no next step to end it), at SIGTERM the step under way so far (and, if the
process lives on, a later rollup of the same step supersedes it).

Memory: the totals of at most three steps, one entry per span name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from otel_titan.core.titan_span import TitanSpan
from otel_titan.environment_variables import OTEL_TITAN_STEP_ROLLUPS, flag
from otel_titan.schema import META_EVENTS, MetaEvent, RecordKind, StepCloser, rollup_fields

__all__ = ["StepRollups", "WAIT_STEPS", "STEP_ROLLUPS_ENV", "step_rollups_on"]

#: Set to ``0`` / ``false`` / ``no`` / ``off`` to write no ``step_rollup`` records (the
#: ``step_rollups`` option wins).
STEP_ROLLUPS_ENV = OTEL_TITAN_STEP_ROLLUPS

#: A step whose spans are still open waits for them until this many later steps have begun.
WAIT_STEPS = 2

_SPAN = RecordKind.SPAN
_INSTANT = RecordKind.INSTANT
_SIGNAL = MetaEvent.SIGNAL_RECEIVED


def step_rollups_on(option: bool | None, environ: Any = None) -> bool:
    """The ``step_rollups`` option, else ``OTEL_TITAN_STEP_ROLLUPS`` (`environment_variables.flag`:
    ``0``, ``false``, ``no``, ``off``: off), else on.

    Example:
        >>> step_rollups_on(None, {}), step_rollups_on(None, {"OTEL_TITAN_STEP_ROLLUPS": "off"}), step_rollups_on(True, {"OTEL_TITAN_STEP_ROLLUPS": "0"})
        (True, False, True)
    """
    if option is not None:
        return option
    return flag(STEP_ROLLUPS_ENV, True, environ)


class _Step:
    """One step's totals while they are being summed."""

    __slots__ = ("step", "begin_us", "end_us", "phases", "open", "closing", "over", "tags")

    def __init__(self, step: int, begin_us: int, tags: tuple[str, ...]) -> None:
        self.step = step
        self.begin_us = begin_us
        self.end_us = begin_us
        self.phases: dict[str, list[int]] = {}
        self.open = 0
        self.closing: tuple[str, int, int] | None = None
        self.over = False  # the next step began
        self.tags = tags


class StepRollups:
    """Sum one process's spans per step and hand back the ``step_rollup`` fields of steps that are
    over.

    Not thread-safe: one per JSONL file, used on the processor thread.

    Example:
        >>> rollups = StepRollups()
        >>> rollups.observe([])
        []
        >>> rollups.final("close")
        []
    """

    def __init__(self) -> None:
        self._steps: dict[int, _Step] = {}  # not written yet, oldest first
        self._current: _Step | None = None
        self._closer = StepCloser()
        self._last_us = 0
        self._signalled = False
        #: Rollup records handed out so far.
        self.written = 0
        #: Spans that ended after their step's rollup was out (in no rollup): every later rollup
        #: says how many, so far.
        self.late = 0

    @property
    def last_us(self) -> int:
        """The latest time (µs) of a record seen so far: a rollup's own time, so that it never
        extends the process's time."""
        return self._last_us

    def observe(self, timeline: Iterable[tuple[bool, Any]]) -> list[dict[str, Any]]:
        """Take one exported timeline; the fields of every rollup now due, oldest step first.

        The writer thread's hot path beside the encoding (about a fifth of
        its cost per record), so written flat: most records belong to the
        step under way, which is kept at hand.
        """
        steps = self._steps
        closer = self._closer
        span_ended = closer.span_ended
        current = self._current
        current_step = current.step if current is not None else None
        last_us = self._last_us
        titan = TitanSpan
        for ended, span in timeline:
            if not isinstance(span, titan):
                continue  # only the logger's own spans carry the step fields
            kind = span.record_kind
            step = span.step
            if ended and kind == _SPAN:
                start_us = span._start_time // 1000
                end_us = (span._end_time or span._start_time) // 1000
                if end_us > last_us:
                    last_us = end_us
                if step is None:
                    continue
                name = span._name
                if span._parent is None:  # only a top-level span can close its step
                    span_ended(step, name, start_us, end_us, True)
                totals = current if step == current_step else steps.get(step)
                if totals is None:
                    self.late += 1  # its step's rollup is out already (a span outlived the wait, or a thread with an older step of its own)
                    continue
                if totals.open > 0:
                    totals.open -= 1
                phase = totals.phases.get(name)
                if phase is None:
                    totals.phases[name] = [1, end_us - start_us]
                else:
                    phase[0] += 1
                    phase[1] += end_us - start_us
                continue
            time_us = span._start_time // 1000
            if time_us > last_us:
                last_us = time_us
            if kind == _INSTANT and span._name == _SIGNAL:
                self._signalled = True
            if type(step) is not int:
                continue
            if step != current_step:
                # Rare (once a step per thread): out of the loop, which stays flat for the rest.
                begun = self._begun(span, step, time_us, current)
                if begun is not None:
                    current, current_step = begun, step
            elif span.step_tags:
                current.tags = tuple(span.step_tags)  # type: ignore[union-attr]  # the same step, so it is open; its latest tags
            if kind == _SPAN:
                totals = current if step == current_step else steps.get(step)
                if totals is not None:
                    totals.open += 1
        self._current = current
        self._last_us = last_us
        out = self._due()
        if self._signalled:
            self._signalled = False
            out.extend(self.final("signal"))
        return out

    def _begun(self, span: Any, step: int, time_us: int, current: _Step | None) -> _Step | None:
        """The step `span` (of another step than `current`) begins, now under way; None when it
        begins none: an older step's (another thread's), or the logger's own record.

        The step under way is over when a later one begins: its end and its closing collective
        are settled here.
        """
        if current is not None and step < current.step or span._name in META_EVENTS:
            return None
        if current is not None:
            current.over = True
            current.end_us = time_us
            current.closing = self._closer.closing(current.step)
        begun = self._steps[step] = _Step(step, time_us, tuple(span.step_tags or ()))
        return begun

    def _due(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        steps = self._steps
        while steps:
            oldest = next(iter(steps.values()))
            if not oldest.over or (oldest.open > 0 and len(steps) <= WAIT_STEPS + 1):
                break
            del steps[oldest.step]
            out.append(self._fields(oldest, complete=True, ended_by="next_step"))
        return out

    def final(self, ended_by: str) -> list[dict[str, Any]]:
        """The rollups of every step not written yet, at shutdown (`ended_by` ``"close"``) or
        SIGTERM (``"signal"``).

        At SIGTERM the step under way is written as it stands and kept, so
        that a process that survives the signal writes it again, complete,
        when it is over; at shutdown everything is written and forgotten.
        """
        out: list[dict[str, Any]] = []
        for totals in list(self._steps.values()):
            if totals.over:
                del self._steps[totals.step]
                out.append(self._fields(totals, complete=True, ended_by="next_step"))
            else:
                totals.end_us = max(self._last_us, totals.begin_us)
                totals.closing = self._closer.closing(totals.step)
                out.append(self._fields(totals, complete=False, ended_by=ended_by))
        if ended_by != "signal":
            self._steps.clear()
            self._current = None
        return out

    def _fields(self, totals: _Step, *, complete: bool, ended_by: str) -> dict[str, Any]:
        self.written += 1
        # Copies: a step kept after SIGTERM goes on summing into its own lists.
        phases = {name: list(pair) for name, pair in totals.phases.items()}
        return rollup_fields(
            totals.step,
            totals.begin_us,
            totals.end_us,
            phases,
            totals.closing,
            complete=complete,
            ended_by=ended_by,
            open_spans=totals.open,
            step_tags=totals.tags,
            late_spans=self.late,
        )

"""One process's records → spans, instants, scalars, markers and steps, in one streaming pass.

Shared by the Chrome-trace export and the summary: both see the same spans.

Durations: end − start of the two records' ``time_us`` (whole µs, so nested
spans stay nested to the µs), unless that disagrees with the ``_end``'s
``value`` (a monotonic clock) by more than rounding: then the wall clock
jumped, and ``value`` is the duration. A span never ends before a span nested
in it on its lane ended (ends are start + a monotonic duration, so a child's
can come out a few µs after its parent's): it is stretched to cover it, so
the bars nest as the spans did.

Pairing: by ``span_id`` when the record has one (otel-titan's files); else
last-in-first-out per *lane* and name, as torchtitan's Gantt generator does
(a lane is a thread, or an asyncio task on it: ``(tid, task_name)``). An
``_end`` with no ``_start`` (its segment rotated away, or a torchtitan file)
starts at end − ``value``. An ``_error`` marks its open span as failed. A
``_start`` still open when the records end is reported as incomplete,
extended to the process's last timestamp, in the order the ``_start``s were
read. Nesting (`OpenSpan.parent`) comes from ``parent_span_id``, else from
the lane's LIFO stack; never from timestamps (a child can start in the same
µs as its parent).

Steps: step N begins at the first ``_start``, instant or scalar stamped with
a step above every earlier one, and ends where the next begins (the last one
at the process's last record). ``_end`` and ``_error`` records never move the
step: they carry the step their span started in.

State is per open span and per lane; nothing is kept per record. It is a
`WalkState`: a walk can stop after any record (``finish=False``), be pickled
(the analysis cache, `model.cache`) and go on later with the records appended
since, as if it had never stopped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from otel_titan.analysis.read.records import META_EVENTS

__all__ = [
    "OpenSpan",
    "TimelineVisitor",
    "ProcessExtent",
    "WalkState",
    "walk_process",
    "finish_walk",
    "error_details",
]

Lane = tuple  # (tid, task_name): a thread, or an asyncio task on it
#: A span ``value`` (ms) at or above this (~30 years) is not a duration: the timestamps are used
#: instead.
_MAX_MS = 1e12
#: The name of a span whose records are just ``_start`` / ``_end``.
_UNNAMED = "(unnamed)"


class OpenSpan:
    """A span between its ``_start`` and ``_end``: what the visitors get for every span.

    `start` is the ``_start`` record (None when it was never seen), `error`
    the ``_error`` record when the span failed, `track` whatever the visitor's
    `lane_opened` returned for the span's lane.
    """

    __slots__ = (
        "name",
        "start_us",
        "start",
        "lane",
        "track",
        "error",
        "children_end",
        "parent",
        "order",
    )

    def __init__(
        self,
        name: str,
        start_us: int,
        start: dict[str, Any] | None,
        lane: Lane,
        track: Any,
        parent: OpenSpan | None = None,
        order: int = 0,
    ) -> None:
        self.name = name
        self.start_us = start_us
        self.start = start
        self.lane = lane
        self.track = track
        self.error: dict[str, Any] | None = None
        self.children_end = 0  # the latest end of a span nested in this one on its lane
        #: The open span it is nested in when it started: by ``parent_span_id``, else its lane's
        #: innermost (LIFO).
        self.parent = parent
        #: Its ``_start``'s position in the file: orders spans that started in the same µs.
        self.order = order

    def __repr__(self) -> str:
        return f"OpenSpan({self.name!r}, start_us={self.start_us}, lane={self.lane!r})"


class TimelineVisitor:
    """Receives what `walk_process` finds; override what you need (every method is a no-op here)."""

    def lane_opened(self, lane: Lane) -> Any:
        """A lane gets its first open span: return the track its spans go on."""
        return None

    def lane_closed(self, lane: Lane, track: Any) -> None:
        """The lane's last open span ended."""

    def span_begun(self, span: OpenSpan) -> None:
        """A span's ``_start`` was read (its lane's track is `span.track`); `span` is reported again
        when it ends.

        For writers that emit a begin and an end (Perfetto's native slices): in file order, a
        parent's begin comes before its children's, so nesting holds even when they share a
        timestamp to the nanosecond.
        """

    def span(
        self,
        span: OpenSpan,
        end: dict[str, Any] | None,
        end_us: int,
        dur_us: float,
        incomplete: bool,
    ) -> None:
        """A span ended (`end` is its ``_end`` record), or is still open at the end (`incomplete`).

        `dur_us` is an int when it comes from the timestamps, a float when from ``value``.
        """

    def instant(self, record: dict[str, Any], track: Any) -> None:
        """A user instant; `track` is its lane's open track, or None when the lane has no open
        span."""

    def scalar(self, record: dict[str, Any], track: Any) -> None:
        """A ``metric_value`` record (``event_name`` = metric, ``value`` = number or
        "NaN"/"Infinity" string)."""

    def error(self, record: dict[str, Any], span: OpenSpan | None, track: Any) -> None:
        """An ``_error`` record; `span` is the span it failed (None when its ``_start`` was not
        seen)."""

    def meta(self, record: dict[str, Any]) -> None:
        """A record the logger wrote about itself (opened, records_dropped, signal_received,
        closed)."""

    def step_begun(self, step: int, begin_us: int) -> None:
        """Step `step` begins at `begin_us` on this process (called before any of its records)."""

    def step(self, step: int, begin_us: int, end_us: int, first: dict[str, Any]) -> None:
        """Step `step` ran from `begin_us` to `end_us` on this process (`first`: its first
        record)."""


class ProcessExtent(NamedTuple):
    """How many records a process had, and its first and last timestamps (µs; None without
    records)."""

    records: int
    first_us: int | None
    last_us: int | None


class WalkState:
    """Where a walk stands between two records: open spans (by id and per lane), tracks, the current
    step, the extent so far.

    Picklable (its open spans hold their ``_start`` records), so that a walk
    over a file that grows can go on from where it stopped (`walk_process`
    with ``finish=False``, then again with the same state).
    """

    __slots__ = (
        "by_id",
        "stacks",
        "tracks",
        "last_us",
        "first_us",
        "count",
        "step",
        "step_begin",
        "step_first",
    )

    def __init__(self) -> None:
        self.by_id: dict[str, OpenSpan] = {}
        self.stacks: dict[Lane, list[OpenSpan]] = {}
        self.tracks: dict[Lane, Any] = {}
        self.last_us: int | None = None
        self.first_us: int | None = None
        self.count = 0
        self.step: int | None = None
        self.step_begin = 0
        self.step_first: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


def walk_process(
    records: Iterable[dict[str, Any]],
    visitor: TimelineVisitor,
    state: WalkState | None = None,
    finish: bool = True,
) -> ProcessExtent:
    """Feed one process's records (in file order) through the pairing rules; returns their count and
    time extent.

    `state`: go on from where an earlier walk with ``finish=False`` stopped
    (it is updated in place). `finish` False: stop after the last record
    without closing what is open (`finish_walk` does that later), so that more
    records can follow.

    Example:
        >>> class Bars(TimelineVisitor):
        ...     def span(self, span, end, end_us, dur_us, incomplete):
        ...         print(span.name, span.start_us, dur_us, incomplete)
        >>> walk_process([
        ...     {"log_type": "event", "log_type_name": "fwd_start", "time_us": 10, "tid": 1},
        ...     {"log_type": "event", "log_type_name": "fwd_end", "time_us": 30, "tid": 1, "value": 0.02},
        ...     {"log_type": "event", "log_type_name": "opt_start", "time_us": 40, "tid": 1},
        ... ], Bars())
        fwd 10 20 False
        opt 40 0 True
        ProcessExtent(records=3, first_us=10, last_us=40)
    """
    state = WalkState() if state is None else state
    _walk(records, visitor, state)
    if not finish:
        return ProcessExtent(state.count, state.first_us, state.last_us)
    return finish_walk(state, visitor)


def _walk(records: Iterable[dict[str, Any]], visitor: TimelineVisitor, state: WalkState) -> None:
    """`walk_process`'s loop: every record through the pairing rules, from where `state` stands
    and back into it (the loop works on locals: it runs for every record the reader reads)."""
    by_id, stacks, tracks = state.by_id, state.stacks, state.tracks
    count = state.count
    # Until the first record, bounds every time passes: no None test per record.
    last_us: float = -math.inf if state.last_us is None else state.last_us
    first_us: float = math.inf if state.first_us is None else state.first_us
    step, step_begin, step_first = state.step, state.step_begin, state.step_first
    # What each record name is (`_event_kind`, `_other_kind`), worked out once per name, not once
    # per record: a pure function of the name, so kept across walks (watch resumes one per batch).
    event_kinds, other_kinds = _EVENT_KINDS, _OTHER_KINDS
    # Bound once: these run for nearly every record.
    on_scalar, on_instant, on_begun = visitor.scalar, visitor.instant, visitor.span_begun

    for record in records:
        time_us = record["time_us"]
        count += 1
        if time_us > last_us:
            last_us = time_us
        if time_us < first_us:
            first_us = time_us
        name = record["log_type_name"]
        if record["log_type"] == "event":
            known = event_kinds.get(name)
            if known is None:
                known = _event_kind(name, event_kinds, other_kinds)
            kind, base = known
            if kind == _END:
                span_id = record.get("span_id")
                span = (
                    by_id.pop(span_id, None)
                    if span_id
                    else _pop_lifo(stacks, (record.get("tid"), record.get("task_name")), base)
                )
                if span is None:
                    _orphan_end(record, base, time_us, record.get("value"), stacks, tracks, visitor)
                else:
                    _close_span(span, record, time_us, stacks, tracks, visitor)
                continue
            if kind == _ERROR:
                _span_failed(record, base, by_id, stacks, tracks, visitor)
                continue
        else:
            kind = other_kinds.get(name)  # type: ignore[assignment]  # a record kind, or None for one it does not know
            if kind is None:
                kind = _other_kind(name, other_kinds)
            base = name

        if kind == _META:
            visitor.meta(record)
            continue

        # A _start, an instant or a scalar stamped with a higher step begins that step.
        record_step = record.get("step")
        if (
            record_step != step
            and type(record_step) is int
            and (step is None or record_step > step)
        ):
            _step_over(visitor, step, step_begin, step_first, time_us)
            step, step_begin, step_first = record_step, time_us, record
            visitor.step_begun(step, time_us)

        if kind == _START:
            lane = (record.get("tid"), record.get("task_name"))
            stack = stacks.get(lane)  # None until the lane's first span
            if not stack:
                stack = stacks[lane] = []
                tracks[lane] = visitor.lane_opened(lane)
            parent_id = record.get("parent_span_id")
            span_id = record.get("span_id")
            # Nesting from the records' own parent ids; without them (torchtitan's files), the
            # lane's innermost.
            innermost = stack[-1] if stack else None
            if parent_id and type(parent_id) is str:
                # a parent seen in no segment read: the lane's
                parent = by_id.get(parent_id) or innermost
            else:
                parent = None if span_id else innermost
            span = OpenSpan(base, time_us, record, lane, tracks[lane], parent, count)
            stack.append(span)
            if span_id:
                by_id[span_id] = span
            on_begun(span)
        else:
            (on_scalar if kind == _SCALAR else on_instant)(
                record, tracks.get((record.get("tid"), record.get("task_name"))) if tracks else None
            )

    state.count = count
    if count:
        state.last_us, state.first_us = last_us, first_us  # type: ignore[assignment]  # records' times, no longer the bounds
    state.step, state.step_begin, state.step_first = step, step_begin, step_first


def _step_over(
    visitor: TimelineVisitor,
    step: int | None,
    begin_us: int,
    first: dict[str, Any] | None,
    end_us: int,
) -> None:
    """The step under way (None: none yet) ends at `end_us`: the visitor is told."""
    if step is not None and first is not None:
        visitor.step(step, begin_us, end_us, first)


def _close_span(
    span: OpenSpan,
    record: dict[str, Any],
    time_us: int,
    stacks: dict[Lane, list[OpenSpan]],
    tracks: dict[Lane, Any],
    visitor: TimelineVisitor,
) -> None:
    """`span` ended with `record` at `time_us`: off its lane (closed when it was the last open),
    its duration settled, handed to the visitor, its end covered by the span around it."""
    lane = span.lane
    stack = stacks[lane]
    if stack[-1] is span:
        stack.pop()
    else:
        stack.remove(span)
    start_us = span.start_us
    elapsed = time_us - start_us
    value: Any = record.get("value")  # a number where its type says so
    if type(value) in _NUMBERS and 0 <= value < _MAX_MS:
        monotonic = value * 1000.0
        # Both timestamps are whole µs, rounded alike, so a child never pokes out of its parent;
        # `value` (ms, a monotonic clock) is only needed when the wall clock jumped during the span.
        dur_us = elapsed if abs(elapsed - monotonic) <= 2.0 + monotonic * 1e-3 else monotonic
    else:
        dur_us = elapsed if elapsed > 0 else 0
    end_us = start_us + int(dur_us)
    if span.children_end > end_us:
        # A child's end, computed from another clock reading, can come a few µs later: cover it.
        end_us = span.children_end
        dur_us = end_us - start_us
    visitor.span(span, record, end_us, dur_us, False)
    if stack:
        enclosing = stack[-1]
        if end_us > enclosing.children_end:
            enclosing.children_end = end_us
    else:
        del stacks[lane]
        visitor.lane_closed(lane, tracks.pop(lane))


def _span_failed(
    record: dict[str, Any],
    base: str,
    by_id: dict[str, OpenSpan],
    stacks: dict[Lane, list[OpenSpan]],
    tracks: dict[Lane, Any],
    visitor: TimelineVisitor,
) -> None:
    """An ``_error`` record: marks the open span it belongs to (None: none is), for the visitor."""
    lane = (record.get("tid"), record.get("task_name"))
    span = _find_open(by_id, stacks, lane, record.get("span_id"), base)
    if span is not None:
        span.error = record
    visitor.error(record, span, span.track if span is not None else tracks.get(lane))


def finish_walk(state: WalkState, visitor: TimelineVisitor) -> ProcessExtent:
    """The records have ended: the spans still open are reported as incomplete, the last step ends
    at the last record."""
    stacks, tracks, last_us, step, step_begin, step_first, count = (
        state.stacks,
        state.tracks,
        state.last_us,
        state.step,
        state.step_begin,
        state.step_first,
        state.count,
    )
    if last_us is None:
        return ProcessExtent(0, None, None)
    # In file order (never by timestamp: a child can start in its parent's µs), so a parent comes
    # before its children.
    still_open = sorted(
        (span for stack in stacks.values() for span in stack), key=lambda s: s.order
    )
    for span in still_open:
        end_us = max(last_us, span.children_end)
        visitor.span(span, None, end_us, max(end_us - span.start_us, 0), True)
    for lane in list(stacks):
        visitor.lane_closed(lane, tracks.pop(lane))
    _step_over(visitor, step, step_begin, step_first, last_us)
    return ProcessExtent(count, state.first_us, last_us)


#: What a record is, by its name (and whether its ``log_type`` is "event"): `walk_process`'s
#: branches.
_END, _ERROR, _START, _SCALAR, _META, _INSTANT = range(6)
#: Distinct names remembered; beyond, the tables start again (a file of random names stays small).
_KINDS_KEPT = 4096
#: Record name → (kind, span name) of ``event`` records, and → kind of the others (`_event_kind`,
#: `_other_kind`).
_EVENT_KINDS: dict[str, tuple[int, str]] = {}
_OTHER_KINDS: dict[str, int] = {}
#: The types of a ``value`` that is a number (bool is not: its type is not int).
_NUMBERS = (float, int)


def _event_kind(
    name: str, event_kinds: dict[str, tuple[int, str]], other_kinds: dict[str, int]
) -> tuple[int, str]:
    """(kind, span name) of an ``event`` record named `name`, remembered in `event_kinds`."""
    if name.endswith("_end"):
        known = (_END, name[:-4] or _UNNAMED)
    elif name.endswith("_error"):
        known = (_ERROR, name[:-6] or _UNNAMED)
    elif name.endswith("_start"):
        known = (_START, name[:-6] or _UNNAMED)
    else:
        known = (_other_kind(name, other_kinds), name)
    if len(event_kinds) >= _KINDS_KEPT:
        event_kinds.clear()
    event_kinds[name] = known
    return known


def _other_kind(name: str, other_kinds: dict[str, int]) -> int:
    """The kind of a record that opens, ends or fails no span: a scalar, one of the logger's own, or
    an instant."""
    kind = _SCALAR if name == "metric_value" else _META if name in META_EVENTS else _INSTANT
    if len(other_kinds) >= _KINDS_KEPT:
        other_kinds.clear()
    other_kinds[name] = kind
    return kind


def _find_open(
    by_id: dict[str, OpenSpan],
    stacks: dict[Lane, list[OpenSpan]],
    lane: Lane,
    span_id: Any,
    base: str,
) -> OpenSpan | None:
    """The open span an ``_error`` belongs to: by id, else the latest open one of that name in its
    lane."""
    if span_id:
        return by_id.get(span_id)
    stack = stacks.get(lane)
    if stack:
        for span in reversed(stack):
            if span.name == base and (span.start is None or not span.start.get("span_id")):
                return span
    return None


def _pop_lifo(stacks: dict[Lane, list[OpenSpan]], lane: Lane, base: str) -> OpenSpan | None:
    """For an ``_end`` without a span id: the latest open span of that name in its lane
    (torchtitan's rule)."""
    stack = stacks.get(lane)
    if stack:
        for span in reversed(stack):
            if span.name == base and (span.start is None or not span.start.get("span_id")):
                return span  # the caller removes it from its lane
    return None


def _orphan_end(
    record: dict[str, Any],
    base: str,
    time_us: int,
    value: Any,
    stacks: dict[Lane, list[OpenSpan]],
    tracks: dict[Lane, Any],
    visitor: TimelineVisitor,
) -> None:
    """An ``_end`` whose ``_start`` was never seen (rotated away, or never written): it began
    `value` ms before."""
    dur_us = float(value) * 1000.0 if type(value) in (int, float) and 0 <= value < _MAX_MS else 0.0
    lane = (record.get("tid"), record.get("task_name"))
    if stacks.get(lane):
        track = tracks[lane]
    else:
        track = visitor.lane_opened(lane)
        visitor.lane_closed(lane, track)
    visitor.span(
        OpenSpan(base, int(time_us - dur_us), None, lane, track), record, time_us, dur_us, False
    )


def error_details(record: dict[str, Any]) -> tuple[str, str]:
    """(type, message) of an ``_error`` record; torchtitan's only say it in ``message``.

    Example:
        >>> error_details({"message": "[step 5] optim_error: ValueError: boom"})
        ('ValueError', 'boom')
        >>> error_details({"error_type": "KeyError", "error_message": "'x'"})
        ('KeyError', "'x'")
    """
    error_type, error_message = record.get("error_type"), record.get("error_message")
    if isinstance(error_type, str):
        return error_type, error_message if isinstance(error_message, str) else ""
    message = record.get("message")
    if not isinstance(message, str):
        return "error", ""
    name = record.get("log_type_name", "")
    _, found, detail = message.partition(f"{name}: ")
    detail = detail if found else message
    error_type, sep, error_message = detail.partition(": ")
    return (error_type, error_message) if sep else (detail or "error", "")

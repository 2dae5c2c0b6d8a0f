"""Captured tuples become `TitanSpan`s (OpenTelemetry `ReadableSpan`s), on the background thread.

One `TitanSpan` per `log_trace_span` call, announced when it starts and
finished (end time, status, events) when it ends. Instants and scalars become
zero-length spans, and also events on their enclosing span (so a backend that
shows span events shows them in place). Ids follow `trace_ids.py`.

A parent captured under another logger (a span of the parent process, inherited
by a forked child; a span left open across shutdown and re-init) is named by
the ids its own logger gave it, the ones its own file records: never
re-derived with this logger's salt, which would name a span that exists
nowhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import CodeType
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Status, StatusCode

from otel_titan.core.clock import WallClock
from otel_titan.core.events import (
    H_GEN,
    H_MONO,
    H_PARENT,
    H_SEQ,
)
from otel_titan.core.titan_span import ATTR, RecordKind, TitanSpan
from otel_titan.core.trace_ids import SpanIdAllocator, StepTraceIds, trace_id_of_handle

__all__ = ["SpanBuilder"]

_SAMPLED = trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED)
_SpanContext = trace_api.SpanContext
_SPAN = RecordKind.SPAN
_TRACE_STATE = trace_api.DEFAULT_TRACE_STATE
_new_tuple = tuple.__new__


def _context(trace_id: int, span_id: int) -> trace_api.SpanContext:
    # SpanContext.__new__ re-validates ids that are valid by construction here
    # (non-zero, in range); building the tuple directly costs a third.
    return _new_tuple(_SpanContext, (trace_id, span_id, False, _SAMPLED, _TRACE_STATE, True))


def _checked_context(trace_id: int, span_id: int) -> trace_api.SpanContext:
    return _SpanContext(trace_id, span_id, False, _SAMPLED, _TRACE_STATE)


def _tuple_layout_matches() -> bool:
    """Whether building `SpanContext`'s tuple directly gives what its constructor gives (checked
    once, at import).

    The shortcut relies on the SDK's field order; a future SDK that changes it
    gets the constructor instead of silently wrong ids, as `TitanSpan`'s own
    layout check does for `ReadableSpan`.
    """
    try:
        fast, real = _context(0x1234, 0x5678), _checked_context(0x1234, 0x5678)
        return tuple(fast) == tuple(real) and (
            fast.trace_id,
            fast.span_id,
            fast.is_remote,
            fast.is_valid,
        ) == (0x1234, 0x5678, False, True)
    except Exception:  # noqa: BLE001 - any surprise: use the constructor
        return False


if not _tuple_layout_matches():
    _context = _checked_context


class SpanBuilder:
    """Turn captured events into `TitanSpan`s with ids, parents and typed fields.

    One instance lives on the processor thread; it is not thread-safe.
    """

    #: Open spans remembered for their children and ends; the oldest is forgotten past this.
    MAX_OPEN_SPANS = 100_000

    def __init__(
        self,
        resource: Resource,
        scope: InstrumentationScope,
        trace_ids: StepTraceIds,
        span_ids: SpanIdAllocator,
        cwd: str | None = None,
    ) -> None:
        self.resource = resource
        self.scope = scope
        self.trace_ids = trace_ids
        self.span_ids = span_ids
        self._cwd = (cwd or os.getcwd()).rstrip(os.sep) + os.sep
        self.clock = WallClock()
        self._for_step = trace_ids.for_step
        self._for_seq = span_ids.for_seq
        self.span_class = TitanSpan.bind(resource, scope)
        self._make_span = self.span_class.make
        self._open: dict[int, TitanSpan] = {}
        self._code_info: dict[CodeType, tuple[str, str]] = {}

    # -- helpers ----------------------------------------------------------------------------
    def code_info(self, code: CodeType) -> tuple[str, str]:
        """(path relative to the working directory when under it, function name) of `code`."""
        info = self._code_info.get(code)
        if info is None:
            path = code.co_filename
            if path.startswith(self._cwd):
                path = path[len(self._cwd) :]
            info = (path, code.co_name)
            if len(self._code_info) > 10_000:
                self._code_info.clear()
            self._code_info[code] = info
        return info

    def _trace_and_parent(
        self, parent_handle: tuple[Any, ...] | None, remote: Any, step: int | None
    ) -> tuple[int, Any]:
        if parent_handle is None:
            if remote is not None:
                return remote.trace_id, remote
            return self.trace_ids.for_step(step), None
        generation = parent_handle[H_GEN]
        if generation.span_ids is not self.span_ids:
            return self._foreign_parent(parent_handle, generation, step)
        parent_span = self._open.get(parent_handle[H_SEQ])
        if parent_span is not None:
            context = parent_span._context
            return context.trace_id, context
        # The parent's start was dropped or it already ended (a context copied
        # to another thread): derive its ids, which never depend on its span.
        trace_id = self._trace_of_handle(parent_handle)
        return trace_id, _context(trace_id, self.span_ids.for_seq(parent_handle[H_SEQ]))

    def _foreign_parent(
        self, parent_handle: tuple[Any, ...], generation: Any, step: int | None
    ) -> tuple[int, Any]:
        """Trace and parent context for a parent captured under another logger (fork, re-init).

        Its ids are the ones its own logger computed (same allocators, still in
        this process's memory), so the parent id is one that logger's file
        records; without them the span is top-level here (null parent).
        """
        if generation.span_ids is None:
            return self.trace_ids.for_step(step), None
        trace_id = trace_id_of_handle(parent_handle, self.trace_ids)
        return trace_id, _context(trace_id, generation.span_ids.for_seq(parent_handle[H_SEQ]))

    def _trace_of_handle(self, handle: tuple[Any, ...]) -> int:
        # An open ancestor already knows its trace; otherwise derive it from the top-level one.
        ancestor: tuple[Any, ...] | None = handle
        while ancestor is not None:
            open_span = (
                self._open.get(ancestor[H_SEQ])
                if ancestor[H_GEN].span_ids is self.span_ids
                else None
            )
            if open_span is not None:
                return open_span._context.trace_id
            ancestor = ancestor[H_PARENT]
        return trace_id_of_handle(handle, self.trace_ids)

    def _new_span(
        self,
        kind: str,
        name: str,
        span_id: int,
        trace_id: int,
        parent: Any,
        start: int,
        end: int | None,
        code: CodeType,
        lineno: int,
        state: Any,
        tid: int,
        task: str | None,
    ) -> TitanSpan:
        info = self._code_info.get(code) or self.code_info(code)
        return self._make_span(
            name,
            _context(trace_id, span_id),
            parent,
            start,
            end,
            kind,
            state.step,
            state.relative_step,
            state.tags,
            task,
            info[0],
            lineno,
            info[1],
            tid,
        )

    # -- spans -------------------------------------------------------------------------------
    def started(self, handle: tuple[Any, ...]) -> TitanSpan:
        """Build and remember the open span of a START capture."""
        (
            _start,
            seq,
            name,
            description,
            mono,
            code,
            lineno,
            parent_handle,
            state,
            tid,
            task,
            remote,
            _generation,
        ) = handle
        step = state.step
        if parent_handle is None and remote is None:  # the common top-level span
            trace_id, parent = self._for_step(step), None
        else:
            trace_id, parent = self._trace_and_parent(parent_handle, remote, step)
        info = self._code_info.get(code) or self.code_info(code)
        span = self._make_span(
            name,
            _new_tuple(
                _SpanContext, (trace_id, self._for_seq(seq), False, _SAMPLED, _TRACE_STATE, True)
            ),
            parent,
            mono + self.clock.offset,
            None,
            _SPAN,
            step,
            state.relative_step,
            state.tags,
            task,
            info[0],
            lineno,
            info[1],
            tid,
        )
        if description is not None:
            span.description = description
        opened = self._open
        if len(opened) >= self.MAX_OPEN_SPANS:
            # Only reachable when ends were dropped: forget the oldest open span.
            del opened[next(iter(opened))]
        opened[seq] = span
        return span

    def ended(
        self, handle: tuple[Any, ...], end_mono: int, error: tuple[str, str, Any] | None
    ) -> TitanSpan:
        """Finish the span of an END capture (building it if its START was dropped)."""
        span = self._open.pop(handle[H_SEQ], None)
        if span is None:
            span = self.started(handle)
            self._open.pop(handle[H_SEQ], None)
        # End on the span's start plus its monotonic duration, so the length is
        # the monotonic one even if the wall clock stepped while it was open.
        end_time = span._start_time + (end_mono - handle[H_MONO])
        if error is None:  # the common case, inlined: no status, no event, attributes unchanged
            span._end_time = end_time
            span.ended = True
            return span
        type_name, message, summary = error
        stacktrace = ""
        if summary is not None:
            try:
                stacktrace = "".join(summary.format())
            except Exception:  # noqa: BLE001 - a stack we cannot format is still an error
                stacktrace = ""
        span.error_type = type_name
        span.error_message = message
        event = Event(
            "exception",
            {
                "exception.type": type_name,
                "exception.message": message,
                "exception.stacktrace": stacktrace,
                "exception.escaped": True,
            },
            end_time,
        )
        span._finish(
            end_time,
            Status(StatusCode.ERROR, f"{type_name}: {message}" if message else type_name),
            event,
        )
        return span

    def open_spans(self) -> Sequence[TitanSpan]:
        """Spans started and not yet ended, oldest first."""
        return list(self._open.values())

    # -- zero-length spans ------------------------------------------------------------------
    def instant(
        self,
        name: str,
        mono: int,
        code: CodeType,
        lineno: int,
        parent_handle: Any,
        state: Any,
        tid: int,
        task: str | None,
        extra: Mapping[str, Any] | None,
    ) -> TitanSpan:
        """A zero-length span for an instant, also added as an event to its enclosing span."""
        wall = mono + self.clock.offset
        trace_id, parent = self._trace_and_parent(parent_handle, None, state.step)
        span = self._new_span(
            RecordKind.INSTANT,
            name,
            self.span_ids.fresh(),
            trace_id,
            parent,
            wall,
            wall,
            code,
            lineno,
            state,
            tid,
            task,
        )
        if extra:
            span.extra = dict(extra)
        if parent_handle is not None and parent_handle[H_GEN].span_ids is self.span_ids:
            enclosing = self._open.get(parent_handle[H_SEQ])
            if enclosing is not None:
                enclosing._add_event(Event(name, {ATTR.RECORD_KIND: RecordKind.INSTANT}, wall))
                span.attached_to_parent = True
        return span

    def scalars(
        self,
        values: dict[str, int | float],
        mono: int,
        code: CodeType,
        lineno: int,
        parent_handle: Any,
        state: Any,
        tid: int,
        task: str | None,
    ) -> list[TitanSpan]:
        """One zero-length span per metric (named after it), and an event per metric on the
        enclosing span."""
        wall = mono + self.clock.offset
        trace_id, parent = self._trace_and_parent(parent_handle, None, state.step)
        enclosing = (
            self._open.get(parent_handle[H_SEQ])
            if parent_handle is not None and parent_handle[H_GEN].span_ids is self.span_ids
            else None
        )
        spans = []
        for metric, value in values.items():
            span = self._new_span(
                RecordKind.SCALAR,
                metric,
                self.span_ids.fresh(),
                trace_id,
                parent,
                wall,
                wall,
                code,
                lineno,
                state,
                tid,
                task,
            )
            span.metric_name = metric
            span.metric_value = value
            spans.append(span)
            if enclosing is not None:
                enclosing._add_event(
                    Event(
                        metric,
                        {ATTR.RECORD_KIND: RecordKind.SCALAR, ATTR.METRIC_VALUE: value},
                        wall,
                    )
                )
                span.attached_to_parent = True
        return spans

"""Building real TitanSpans through a real SpanBuilder, for the core tests (no logger, no
thread)."""

from __future__ import annotations

import sys

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_titan.core import capture
from otel_titan.core.event_queue import EventQueue
from otel_titan.core.span_builder import SpanBuilder
from otel_titan.core.trace_ids import SpanIdAllocator, StepTraceIds


def new_builder() -> SpanBuilder:
    return SpanBuilder(
        Resource.get_empty(),
        InstrumentationScope("test"),
        StepTraceIds("run", 0),
        SpanIdAllocator(),
    )


class Captured:
    """Point the real hot path at a queue of our own; the events it appends are what the processor
    would get."""

    def __init__(self, builder: SpanBuilder | None = None, capacity: int = 1000) -> None:
        self.builder = builder or new_builder()
        self.queue = EventQueue(capacity)

    def __enter__(self) -> Captured:
        capture.attach(self.queue, trace_ids=self.builder.trace_ids, span_ids=self.builder.span_ids)
        return self

    def __exit__(self, *exc: object) -> None:
        capture.detach()

    def events(self) -> list[tuple]:
        events = list(self.queue.items)
        self.queue.items.clear()
        return events


def this_line() -> int:
    return sys._getframe(1).f_lineno

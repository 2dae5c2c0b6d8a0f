"""The handler interface: an OpenTelemetry `SpanExporter`, optionally told of starts.

Any SDK `SpanExporter` (console, OTLP, in-memory, your own) can be registered by
a handler factory: it receives finished spans, instants and scalars (the last
two as zero-length spans) through `export`, in batches, on otel-titan's
background thread.

An exporter that also needs to see spans *when they start*, as the JSONL
writer does so that a hung rank's open span is on disk, subclasses
`StartAwareSpanExporter` and implements `export_timeline`: it receives every
start and end in the order they happened, as ``(ended, span)`` pairs. A span
appears twice in the timeline (started, then ended) and is the same object both
times; while it is open its ``end_time`` is None.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["StartAwareSpanExporter", "Timeline", "TimelineItem", "PipelineStats", "SpanExporter", "SpanExportResult"]

#: ``(ended, span)``: ``ended`` is False when the span just started.
TimelineItem = tuple[bool, ReadableSpan]


class Timeline(Sequence[TimelineItem]):
    """Starts and ends in capture order: a sequence of ``(ended, span)`` pairs.

    Stored as two parallel lists, so a batch of thousands of items allocates
    no pair until an exporter iterates (and `zip` reuses its pair when it can):
    fewer objects for the garbage collector on the writer thread's hot path.

    Example:
        >>> t = Timeline()
        >>> t.append(False, "span")
        >>> list(t), len(t), t[0]
        ([(False, 'span')], 1, (False, 'span'))
    """

    __slots__ = ("ended", "spans")

    def __init__(self) -> None:
        self.ended: list[bool] = []
        self.spans: list[ReadableSpan] = []

    def append(self, ended: bool, span: ReadableSpan) -> None:
        """Add one item."""
        self.ended.append(ended)
        self.spans.append(span)

    def __iter__(self) -> Iterator[TimelineItem]:
        return zip(self.ended, self.spans)

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(zip(self.ended[index], self.spans[index]))
        return (self.ended[index], self.spans[index])


@runtime_checkable
class PipelineStats(Protocol):
    """Counters of the capture queue, readable from any thread."""

    @property
    def dropped_records(self) -> int:
        """Records lost because the queue was full (process-wide, since init)."""
        ...


class StartAwareSpanExporter(SpanExporter):
    """A `SpanExporter` that also sees span starts, in emission order.

    Example:
        >>> class Printer(StartAwareSpanExporter):
        ...     def export_timeline(self, timeline):
        ...         for ended, span in timeline:
        ...             print("end" if ended else "start", span.name)
        ...         return SpanExportResult.SUCCESS
    """

    def export_timeline(self, timeline: Sequence[TimelineItem]) -> SpanExportResult:
        """Receive starts and ends, in the order they were captured."""
        raise NotImplementedError

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Plain `SpanExporter` entry point: finished spans only."""
        return self.export_timeline([(True, span) for span in spans])

    def heartbeat(self, time_ns: int, open_spans: Sequence[ReadableSpan]) -> None:
        """Nothing was emitted for a while and `open_spans` are still open (optional)."""

    def shutdown(self) -> None:
        """Release resources; called once, on the processor thread, after the last export."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Push buffered data to its destination."""
        return True

"""QueuedSpanExporter on its own: a bounded queue and a thread in front of a slow or failing
exporter."""

from __future__ import annotations

import threading

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_titan import structured_logger as sl
from otel_titan.core.exporter import Drainable
from otel_titan.exporters.queued import QueuedSpanExporter
from tests.core._spans import Captured


def _spans(count: int) -> list:
    with Captured() as captured:
        for _ in range(count):
            with sl.log_trace_span("s"):
                pass
    events = captured.events()
    return [captured.builder.ended(end[1], end[2], None) for end in events[1::2]]


class _Gated(SpanExporter):
    """Blocks in export until the gate opens (a collector that does not answer)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.exported: list = []
        self.entered = threading.Event()

    def export(self, spans):
        self.entered.set()
        self.gate.wait(30)
        self.exported.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def test_export_never_waits_and_drain_delivers():
    memory = InMemorySpanExporter()
    queued = QueuedSpanExporter(memory, name="memory", schedule_delay_s=10)
    try:
        assert isinstance(queued, Drainable)
        assert queued.export(_spans(5)) is SpanExportResult.SUCCESS
        assert queued.drain(10)  # wakes the thread and waits for the queue to empty
        assert len(memory.get_finished_spans()) == 5 and queued.exported_spans == 5
    finally:
        assert queued.shutdown()
    assert queued.export(_spans(1)) is SpanExportResult.FAILURE  # after shutdown


def test_a_full_queue_drops_and_counts_while_the_backend_hangs():
    gated = _Gated()
    queued = QueuedSpanExporter(
        gated,
        name="gated",
        max_queue_size=3,
        max_export_batch_size=1,
        schedule_delay_s=0.01,
        shutdown_timeout_s=5,
    )
    try:
        queued.export(_spans(1))
        assert gated.entered.wait(10)  # the thread is stuck delivering the first span
        assert queued.export(_spans(5)) is SpanExportResult.SUCCESS  # returns at once all the same
        assert queued.dropped_spans == 2  # room for 3 of the 5
        assert not queued.drain(0.05)  # cannot deliver while the backend hangs
        gated.gate.set()
        assert queued.drain(10)
    finally:
        gated.gate.set()
        assert queued.shutdown()
    assert len(gated.exported) == 4 and queued.exported_spans == 4


def test_a_raising_backend_is_counted_not_raised():
    class Raising(SpanExporter):
        def export(self, spans):
            raise ConnectionError("collector down")

        def shutdown(self):
            pass

    queued = QueuedSpanExporter(Raising(), name="down", schedule_delay_s=0.01)
    try:
        queued.export(_spans(3))
        assert queued.drain(10)
        assert queued.failed_spans == 3 and queued.exported_spans == 0
    finally:
        assert queued.shutdown()


def test_keep_filters_what_is_queued():
    memory = InMemorySpanExporter()
    queued = QueuedSpanExporter(memory, name="memory", keep=lambda span: False)
    try:
        queued.export(_spans(2))
        assert queued.drain(10) and memory.get_finished_spans() == () and queued.dropped_spans == 0
    finally:
        queued.shutdown()

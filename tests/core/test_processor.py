"""BatchProcessor: a real thread turning captured events into exports, exporters isolated from each
other."""

from __future__ import annotations

import logging
import time

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_titan import structured_logger as sl
from otel_titan.core.exporter import StartAwareSpanExporter
from otel_titan.core.processor import BatchProcessor
from tests.core._spans import Captured


class _Timeline(StartAwareSpanExporter):
    def __init__(self) -> None:
        self.items: list[tuple[bool, str]] = []
        self.beats = 0

    def export_timeline(self, timeline):
        self.items.extend((ended, span.name) for ended, span in timeline)
        return SpanExportResult.SUCCESS

    def heartbeat(self, time_ns, open_spans):
        self.beats += 1


class _Finished(SpanExporter):
    def __init__(self) -> None:
        self.names: list[str] = []
        self.incomplete: list[str] = []

    def export(self, spans):
        for span in spans:
            (self.incomplete if span.attributes.get("titan.incomplete") else self.names).append(
                span.name
            )
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


class _Raising(SpanExporter):
    calls = 0

    def export(self, spans):
        self.calls += 1
        raise OSError("disk on fire")

    def shutdown(self):
        pass


def test_starts_and_ends_in_order_finished_spans_only_to_plain_exporters_and_a_raising_one_isolated(
    caplog,
):
    caplog.set_level(logging.ERROR, logger="otel_titan")
    timeline, finished, raising = _Timeline(), _Finished(), _Raising()
    with Captured() as captured:
        processor = BatchProcessor(
            captured.queue, captured.builder, [raising, timeline, finished], schedule_delay=0.01
        )
        processor.start()
        try:
            with sl.log_trace_span("outer"):
                with sl.log_trace_span("inner"):
                    pass
                assert processor.flush(timeout=10)
                sl.log_trace_instant("mark")
                assert processor.flush(timeout=10, open_spans=True)  # as on SIGTERM
        finally:
            assert processor.shutdown(timeout=10)
    assert timeline.items == [
        (False, "outer"),
        (False, "inner"),
        (True, "inner"),
        (True, "mark"),
        (True, "outer"),
    ]
    assert finished.names == ["inner", "mark", "outer"] and finished.incomplete == ["outer"]
    assert raising.calls == 3
    logged = [r for r in caplog.records if "raised in export" in r.getMessage()]
    assert len(logged) == 1  # the first failure in full; later ones only counted


def test_an_event_that_cannot_be_built_is_counted_and_skipped(caplog):
    caplog.set_level(logging.ERROR, logger="otel_titan")
    timeline = _Timeline()
    with Captured() as captured:
        processor = BatchProcessor(
            captured.queue, captured.builder, [timeline], schedule_delay=0.01
        )
        processor.start()
        try:
            captured.queue.put((2, "broken"))  # an INSTANT with most fields missing
            captured.queue.put((2, "broken"))
            sl.log_trace_instant("fine")
            assert processor.flush(timeout=10)
        finally:
            assert processor.shutdown(timeout=10)
    assert processor.failed_events == 2 and timeline.items == [(True, "fine")]
    assert len([r for r in caplog.records if "could not build a span" in r.getMessage()]) == 1


def test_a_quiet_process_with_spans_open_gets_heartbeats():
    timeline = _Timeline()
    with Captured() as captured:
        processor = BatchProcessor(
            captured.queue, captured.builder, [timeline], schedule_delay=0.01, heartbeat_s=0.05
        )
        processor.start()
        try:
            with sl.log_trace_span("hung"):
                assert processor.flush(timeout=10)
                deadline = time.monotonic() + 10
                while timeline.beats < 2 and time.monotonic() < deadline:
                    time.sleep(0.02)
        finally:
            assert processor.shutdown(timeout=10)
    assert timeline.beats >= 2

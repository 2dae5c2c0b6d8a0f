"""OTEL_* variables: which handlers run, which protocol, and the queued exporter's accounting."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_titan import structured_logger as sl
from otel_titan.exporters.otel_env import (
    CONSOLE_HANDLER,
    OTLP_HANDLER,
    otlp_protocol,
    traces_exporter_handler_specs,
)
from otel_titan.exporters.queued import QueuedSpanExporter
from otel_titan.structured_logger.handler_factories import JSONL_HANDLER, resolve_handler_specs


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, [JSONL_HANDLER]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, [JSONL_HANDLER, OTLP_HANDLER]),
        ({"OTEL_TRACES_EXPORTER": "console"}, [JSONL_HANDLER, CONSOLE_HANDLER]),
        ({"OTEL_TRACES_EXPORTER": "none"}, [JSONL_HANDLER]),
        (
            {"OTEL_TRACES_EXPORTER": "otlp,console,otlp"},
            [JSONL_HANDLER, OTLP_HANDLER, CONSOLE_HANDLER],
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, [JSONL_HANDLER]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "TITAN_STRUCT_LOGGER_HANDLERS": "a.b.c"}, ["a.b.c"]),
    ],
)
def test_default_handlers_follow_otel_traces_exporter(env, expected):
    assert resolve_handler_specs(None, env)[0] == expected


def test_unknown_values_of_the_standard_variables_are_warned_about_once_and_ignored_never_failing_init(
    run_dir, monkeypatch, caplog
):
    """The specification: unknown values are warned about and ignored. A site-wide
    OTEL_LOGS_EXPORTER=console or OTEL_EXPORTER_OTLP_PROTOCOL=http/json (read by every OpenTelemetry
    program) made init fail: the job never started."""
    from tests.helpers.otlp_signals_receiver import OtlpSignalsReceiver

    backend = OtlpSignalsReceiver()
    try:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,zipkin")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        monkeypatch.setenv("OTEL_LOGS_EXPORTER", "console")
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "statsd,otlp")
        # unknown: the generic variable decides, then the default
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc2")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"{backend.endpoint}/v1/metrics")
        monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "lots")
        monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
        with caplog.at_level(logging.WARNING, logger="otel_titan"):
            sl.init_structured_logger(
                "training", run_dir, rank=0, world_size=1, run_id="ignored-values"
            )
            kinds = sorted(type(e).__name__ for e in sl.get_exporters())
            # no logs exporter: console ignored
            assert kinds == ["JsonlSpanExporter", "MetricsSpanExporter", "QueuedSpanExporter"], (
                kinds
            )
            (traces,) = [e for e in sl.get_exporters() if isinstance(e, QueuedSpanExporter)]
            assert traces.name == "otlp-http-protobuf" and traces.max_queue_size == 16384
            sl.set_step(1)
            sl.log_trace_scalar({"loss": 0.5})
            assert sl.shutdown_structured_logger(10)
        ignored = [
            r.getMessage()
            for r in caplog.records
            if "ignored, as the OpenTelemetry specification asks" in r.getMessage()
        ]
        for variable in (
            "OTEL_TRACES_EXPORTER='otlp,zipkin'",
            "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'",
            "OTEL_LOGS_EXPORTER='console'",
            "OTEL_METRICS_EXPORTER='statsd,otlp'",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL='grpc2'",
            "OTEL_BSP_MAX_QUEUE_SIZE='lots'",
        ):
            # once each, though read more than once
            assert sum(variable in message for message in ignored) == 1, (
                variable,
                ignored,
            )
    finally:
        backend.stop()


def test_metrics_still_arrive_when_a_standard_variable_has_an_unknown_value(run_dir, monkeypatch):
    from tests.helpers.otlp_signals_receiver import OtlpSignalsReceiver

    backend = OtlpSignalsReceiver()
    try:
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp,statsd")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        # ignored: the generic grpc decides
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/thrift")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", backend.endpoint)
        monkeypatch.setenv("OTEL_LOGS_EXPORTER", "console")
        monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
        sl.init_structured_logger(
            "training", run_dir, rank=0, world_size=1, run_id="ignored-values-2"
        )
        sl.set_step(1)
        sl.log_trace_scalar({"loss": 0.5})
        assert sl.shutdown_structured_logger(10)
        assert backend.wait_for(lambda b: any(p.metric == "loss" for p in b.points()), timeout=20)
    finally:
        backend.stop()


def test_protocol_precedence_and_default():
    assert otlp_protocol({}) == "http/protobuf"
    assert otlp_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "grpc"
    assert (
        otlp_protocol(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            }
        )
        == "http/protobuf"
    )
    assert traces_exporter_handler_specs({"OTEL_TRACES_EXPORTER": " OTLP "}) == [OTLP_HANDLER]


def test_sdk_disabled_skips_an_explicitly_listed_otlp_factory(run_dir, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    sl.init_structured_logger(
        "training", run_dir, world_size=1, handlers=[JSONL_HANDLER, OTLP_HANDLER]
    )
    assert [type(e).__name__ for e in sl.get_exporters()] == ["JsonlSpanExporter"]


class Stuck(SpanExporter):
    """An exporter that blocks until released (a collector that does not answer)."""

    def __init__(self):
        self.release = threading.Event()
        self.received = 0

    def export(self, spans):
        self.release.wait(30)
        self.received += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.release.set()


def test_queued_exporter_never_blocks_counts_drops_and_bounds_shutdown():
    stuck = Stuck()
    queued = QueuedSpanExporter(
        stuck,
        name="stuck",
        max_queue_size=100,
        max_export_batch_size=10,
        schedule_delay_s=0.01,
        shutdown_timeout_s=0.5,
    )
    spans = [ReadableSpan(f"s{i}") for i in range(10)]
    queued.export(spans)
    time.sleep(0.2)  # the thread takes the first batch and blocks in the exporter
    for _ in range(20):
        assert queued.export(spans) is SpanExportResult.SUCCESS  # returns at once
    assert queued.dropped_spans == 100  # 200 offered while blocked, 100 fit
    started = time.monotonic()
    assert queued.shutdown() is False  # the backend never took the rest
    assert time.monotonic() - started < 5
    assert queued.dropped_spans == 210  # plus the 100 still queued and the 10 stuck in the exporter


def test_queued_exporter_delivers_and_skips_events_sent_with_their_parent():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    queued = QueuedSpanExporter(
        memory, name="memory", schedule_delay_s=0.01, keep=lambda s: s.name != "skip"
    )
    queued.export([ReadableSpan("a"), ReadableSpan("skip"), ReadableSpan("b")])
    assert queued.drain(5)
    assert [s.name for s in memory.get_finished_spans()] == ["a", "b"]
    assert queued.shutdown() is True and queued.exported_spans == 2

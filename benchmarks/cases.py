"""The span implementations compared by the benchmark, each set up the way its users would.

Every case provides `span(name)` (a context manager around one span, with the
current step attached), `drain()` (wait until every background thread has
finished the work of the spans so far) and `close()`.

1. ``floor``: two wall-clock timestamps and two tuples appended to a deque inside
   a minimal context manager: what Python itself costs.
2. ``logging_queue``: a `logging.Logger` with a `QueueHandler` whose records are
   formatted to JSON on the caller, written by a `QueueListener` (torchtitan's
   README's handler).
3. ``logging_sync``: a `logging.FileHandler` formatting and flushing every record
   on the caller (torchtitan's main branch).
4. ``otel_sdk``: `tracer.start_as_current_span` with a `BatchSpanProcessor` and a
   no-op exporter.
5. ``otel_sdk_jsonl``: SDK spans exported to a JSON-lines file by a
   `BatchSpanProcessor` exporter using `ReadableSpan.to_json`.
6. ``otel_titan``: this project, JSONL handler only; ``otel_titan_otlp``: with the
   OTLP handler added, exporting over gRPC to a local receiver process;
   ``otel_titan_otlp_sdk``: the same with the SDK's own encoder (``encode_spans``),
   the way the OTLP handler encoded before ``otlp_encoder``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import logging.handlers
import os
import queue
import time
from collections.abc import Iterator
from typing import Any

STEP = [1]  # the "current step" every case attaches to its records


class Floor:
    name = "floor"

    def __init__(self, directory: str) -> None:
        self.events: collections.deque = collections.deque()

    def span(self, name: str) -> Any:
        return _FloorSpan(self.events, name)

    def drain(self) -> None:
        self.events.clear()

    def close(self) -> None:
        pass


class _FloorSpan:
    __slots__ = ("events", "name")

    def __init__(self, events: collections.deque, name: str) -> None:
        self.events = events
        self.name = name

    def __enter__(self) -> None:
        self.events.append((time.time_ns(), self.name))

    def __exit__(self, *exc: Any) -> None:
        self.events.append((time.time_ns(), self.name))


class _JsonFormatter(logging.Formatter):
    """torchtitan-style record: its fields, serialised with the standard json module."""

    def __init__(self, rank: int = 0, source: str = "training") -> None:
        super().__init__()
        self.rank, self.source = rank, source
        self.seq = 0

    def format(self, record: logging.LogRecord) -> str:
        self.seq += 1
        time_us = int(record.created * 1_000_000)
        return json.dumps(
            {
                "tid": record.thread,
                "rank": self.rank,
                "global_rank": self.rank,
                "local_rank": self.rank,
                "source": self.source,
                "host_name": "host",
                "pid": record.process,
                "step": getattr(record, "step", None),
                "time": time_us // 1_000_000,
                "time_ms": time_us // 1000,
                "time_us": time_us,
                "log_type": "event",
                "log_type_name": record.log_type_name,  # type: ignore[attr-defined]
                "event_name": None,
                "value": getattr(record, "value", None),
                "caller": f"{record.pathname}:{record.lineno}:{record.funcName}",
                "log_file": record.pathname,
                "log_function": record.funcName,
                "log_level": record.levelname,
                "logger_name": record.name,
                "seq_id": self.seq,
                "message": record.getMessage(),
            }
        )


class _LoggingSpan:
    __slots__ = ("logger", "name", "start")

    def __init__(self, logger: logging.Logger, name: str) -> None:
        self.logger = logger
        self.name = name

    def __enter__(self) -> None:
        self.start = time.perf_counter()
        self.logger.info(
            "[step %d] %s_start",
            STEP[0],
            self.name,
            extra={"log_type_name": f"{self.name}_start", "step": STEP[0]},
            stacklevel=2,
        )

    def __exit__(self, *exc: Any) -> None:
        value = (time.perf_counter() - self.start) * 1000
        self.logger.info(
            "[step %d] %s_end",
            STEP[0],
            self.name,
            extra={"log_type_name": f"{self.name}_end", "step": STEP[0], "value": value},
            stacklevel=2,
        )


class _FormattingQueueHandler(logging.handlers.QueueHandler):
    def prepare(self, record: logging.LogRecord) -> Any:
        return self.format(record)  # JSON on the calling thread


class _LineWriter(logging.Handler):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.file = open(path, "a", encoding="utf-8")

    def handle(self, record: Any) -> bool:  # the listener passes the formatted string
        self.file.write(record + "\n")
        return True

    def close(self) -> None:
        self.file.close()
        super().close()


class LoggingQueue:
    name = "logging_queue"

    def __init__(self, directory: str) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.logger = logging.getLogger(f"bench.queue.{id(self)}")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        handler = _FormattingQueueHandler(self.queue)
        handler.setFormatter(_JsonFormatter())
        self.logger.addHandler(handler)
        self.writer = _LineWriter(os.path.join(directory, "queue.jsonl"))
        self.listener = logging.handlers.QueueListener(self.queue, self.writer)
        self.listener.start()

    def span(self, name: str) -> Any:
        return _LoggingSpan(self.logger, name)

    def drain(self) -> None:
        self.queue.join()
        self.writer.file.flush()

    def close(self) -> None:
        self.listener.stop()
        self.writer.close()


class LoggingSync:
    name = "logging_sync"

    def __init__(self, directory: str) -> None:
        self.logger = logging.getLogger(f"bench.sync.{id(self)}")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        # flushes every record
        self.handler = logging.FileHandler(os.path.join(directory, "sync.jsonl"))
        self.handler.setFormatter(_JsonFormatter())
        self.logger.addHandler(self.handler)

    def span(self, name: str) -> Any:
        return _LoggingSpan(self.logger, name)

    def drain(self) -> None:
        pass

    def close(self) -> None:
        self.handler.close()


class _NoOpExporter:
    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class _JsonLinesExporter(_NoOpExporter):
    def __init__(self, path: str) -> None:
        self.file = open(path, "a", encoding="utf-8")

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.file.write("".join(span.to_json(indent=None) + "\n" for span in spans))
        self.file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.file.close()


class OtelSdk:
    name = "otel_sdk"

    def __init__(self, directory: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.provider = TracerProvider(
            resource=Resource.create({"service.name": "bench", "titan.rank": 0})
        )
        # A queue large enough for a whole repetition: with the default 2048 the SDK
        # drops spans it then never exports, which would understate its CPU cost.
        self.provider.add_span_processor(
            BatchSpanProcessor(self.exporter(directory), max_queue_size=65536)
        )  # type: ignore[arg-type]
        self.tracer = self.provider.get_tracer("bench")

    def exporter(self, directory: str) -> Any:
        return _NoOpExporter()

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        with self.tracer.start_as_current_span(name, attributes={"titan.step": STEP[0]}):
            yield

    def drain(self) -> None:
        self.provider.force_flush()

    def close(self) -> None:
        self.provider.shutdown()


class OtelSdkJsonl(OtelSdk):
    name = "otel_sdk_jsonl"

    def exporter(self, directory: str) -> Any:
        return _JsonLinesExporter(os.path.join(directory, "sdk.jsonl"))


class OtelTitan:
    name = "otel_titan"
    handlers = ["otel_titan.exporters.jsonl.register_jsonl_handler"]

    def __init__(self, directory: str) -> None:
        from otel_titan import structured_logger as sl

        self.sl = sl
        sl.init_structured_logger(
            "training", directory, world_size=1, run_id="bench", handlers=self.handlers
        )
        sl.set_step(STEP[0])

    def span(self, name: str) -> Any:
        return self.sl.log_trace_span(name)

    def drain(self) -> None:
        assert self.sl.flush_structured_logger(timeout=120)
        for exporter in self.sl.get_exporters():
            drain = getattr(exporter, "drain", None)
            if drain is not None:
                assert drain(120)

    def close(self) -> None:
        self.sl.shutdown_structured_logger(timeout=60)


class OtelTitanOtlp(OtelTitan):
    name = "otel_titan_otlp"
    handlers = [
        "otel_titan.exporters.jsonl.register_jsonl_handler",
        "otel_titan.exporters.otlp.register_otlp_handler",
    ]


def register_sdk_encoder_otlp_handler(*, add_span_exporter: Any, **_: Any) -> Any:
    """The OTLP handler as it was before otel-titan's encoder: the SDK's gRPC exporter and
    ``encode_spans``, same queue."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    from otel_titan.exporters.otlp import _queued

    exporter = _queued(OTLPSpanExporter(), "otlp-sdk-encoder")
    add_span_exporter(exporter)
    return exporter


class OtelTitanOtlpSdkEncoder(OtelTitan):
    name = "otel_titan_otlp_sdk"
    handlers = [
        "otel_titan.exporters.jsonl.register_jsonl_handler",
        "benchmarks.cases.register_sdk_encoder_otlp_handler",
    ]


CASES = {
    case.name: case
    for case in (
        Floor,
        LoggingQueue,
        LoggingSync,
        OtelSdk,
        OtelSdkJsonl,
        OtelTitan,
        OtelTitanOtlp,
        OtelTitanOtlpSdkEncoder,
    )
}

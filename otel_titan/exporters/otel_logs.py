"""The training log as OpenTelemetry log records: ``OTEL_LOGS_EXPORTER=otlp``.

The standard `logging` records reaching the root logger (``init_logger()``'s
console logger, and every library logger under it that propagates) also go out
over OTLP, each with the process's Resource (rank, host, run: the same as the
spans and metrics) and, when written inside an `sl` span, that span's trace and
span id (`log_context`), so Grafana shows a log line one click from its step's
trace. The console output is unchanged: this is one more handler on the root
logger, attached at init and removed at shutdown.

What the writing thread pays: the message formatted (as any handler does), the
span ids looked up, and one bounded-deque append; conversion and export happen
on a thread of its own, in batches. A collector that is down, slow or refusing
costs the training nothing: past ``OTEL_BLRP_MAX_QUEUE_SIZE`` (2,048) waiting
records new ones are dropped and counted (`OtelLogsExporter.dropped_logs`),
never waited for; shutdown gives the collector at most 3 s. Records of the
OpenTelemetry SDK's own loggers are never sent (an export failure logged, then
exported, then failing again would feed itself).

Transport: ``OTEL_EXPORTER_OTLP_LOGS_PROTOCOL``, then ``OTEL_EXPORTER_OTLP_PROTOCOL``
(``http/protobuf`` by default, or ``grpc``); endpoint, headers, certificates and
timeout from the standard ``OTEL_EXPORTER_OTLP_*`` variables, read by the SDK's
exporter itself. ``OTEL_BLRP_SCHEDULE_DELAY`` (ms, 1000) and
``OTEL_BLRP_MAX_EXPORT_BATCH_SIZE`` (512) as the specification names them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.sdk._logs import ReadWriteLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_titan._version import __version__
from otel_titan.core.exporter import HandlerSkipped, StartAwareSpanExporter
from otel_titan.core.log_context import current_span_ids
from otel_titan.exporters.batch_sender import run_batches
from otel_titan.exporters.otel_env import (
    exporter_names,
    ignored_value,
    sdk_disabled,
    signal_protocol,
)
from otel_titan.exporters.otlp import quiet_exporter_logs

__all__ = [
    "OtelLogHandler",
    "OtelLogsExporter",
    "register_otel_logs_handler",
    "logs_exporters",
    "logs_exporter_handler_specs",
    "LOGS_HANDLER",
]

_log = logging.getLogger("otel_titan")

LOGS_HANDLER = "otel_titan.exporters.otel_logs.register_otel_logs_handler"
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
#: Loggers whose records are never exported: the SDK's own (a failure to export must not be
#: exported).
_NEVER_SENT = ("opentelemetry", "grpc", "urllib3")


def logs_exporters(environ: Mapping[str, str] | None = None) -> list[str]:
    """The names in ``OTEL_LOGS_EXPORTER`` (``none`` removed); only ``otlp`` is supported, others
    are warned about and ignored.

    ``console`` too: the console already shows every line (a second copy as
    JSON would interleave with it).

    Example:
        >>> logs_exporters({"OTEL_LOGS_EXPORTER": "otlp"}), logs_exporters({})
        (['otlp'], [])
        >>> logs_exporters({"OTEL_LOGS_EXPORTER": "console"})
        []
    """
    return exporter_names(
        "OTEL_LOGS_EXPORTER", ("otlp",), environ, hint="; the console already shows the log"
    )


def logs_exporter_handler_specs(environ: Mapping[str, str] | None = None) -> list[str]:
    """The handler factory ``OTEL_LOGS_EXPORTER`` asks for (none when unset, ``none`` or the SDK is
    disabled).

    Example:
        >>> logs_exporter_handler_specs({"OTEL_LOGS_EXPORTER": "otlp"})
        ['otel_titan.exporters.otel_logs.register_otel_logs_handler']
    """
    if sdk_disabled(environ) or not logs_exporters(environ):
        return []
    return [LOGS_HANDLER]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        ignored_value(name, raw, f"not an int >= 1: {default} is used")
        return default
    return value


def _severity(levelno: int) -> SeverityNumber:
    # The specification's mapping of Python levels: DEBUG 5, INFO 9, WARNING 13, ERROR 17, CRITICAL
    # 21.
    if levelno >= logging.CRITICAL:
        return SeverityNumber.FATAL
    if levelno >= logging.ERROR:
        return SeverityNumber.ERROR
    if levelno >= logging.WARNING:
        return SeverityNumber.WARN
    if levelno >= logging.INFO:
        return SeverityNumber.INFO
    return SeverityNumber.DEBUG


def _exception_attributes(exc_info: Any) -> dict[str, str] | None:
    """``exception.type``, ``.message`` and ``.stacktrace`` (the semantic conventions) of a
    ``logger.exception`` record."""
    if exc_info is True:
        exc_info = sys.exc_info()
    if not isinstance(exc_info, tuple) or exc_info[0] is None:
        return None
    kind, value, tb = exc_info
    return {
        "exception.type": f"{kind.__module__}.{kind.__qualname__}"
        if kind.__module__ not in ("builtins", "__main__")
        else kind.__qualname__,
        "exception.message": str(value),
        "exception.stacktrace": "".join(traceback.format_exception(kind, value, tb)),
    }


class OtelLogHandler(logging.Handler):
    """A `logging.Handler` that queues what it needs of each record for `OtelLogsExporter`'s thread.

    The record is reduced on the writing thread to plain values (its message
    formatted now, as a `QueueHandler` does, so later changes to its arguments
    cannot change what is sent) plus the ids of the enclosing `sl` span.
    """

    def __init__(self, owner: OtelLogsExporter) -> None:
        super().__init__(logging.NOTSET)
        self._owner = owner

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(_NEVER_SENT):
            return
        owner = self._owner
        queue = owner._queue
        if len(queue) >= owner.max_queue_size:
            owner.dropped_logs += 1
            return
        try:
            message = record.getMessage()
            exception = _exception_attributes(record.exc_info) if record.exc_info else None
            ids = current_span_ids()
        except Exception:  # noqa: BLE001 - logging's own convention: report, never raise into the caller
            self.handleError(record)
            return
        queue.append(
            (
                int(record.created * 1e9),
                record.levelno,
                record.levelname,
                message,
                record.name,
                record.pathname,
                record.lineno,
                record.funcName,
                record.thread,
                ids,
                exception,
            )
        )
        if len(queue) >= owner.max_export_batch_size:
            owner._wake.set()


class OtelLogsExporter(StartAwareSpanExporter):
    """Owns the root logger's `OtelLogHandler` and the thread that exports its records.

    It is registered as an exporter only for its lifecycle (attached at init,
    detached and drained at shutdown, SIGTERM and fork handled like any
    exporter's); it takes no spans (``export_timeline`` returns at once, and as
    a start-aware exporter it asks the processor to collect nothing extra).
    """

    def __init__(
        self,
        exporter: Any,
        resource: Resource,
        *,
        max_queue_size: int = 2048,
        max_export_batch_size: int = 512,
        schedule_delay_s: float = 1.0,
        shutdown_timeout_s: float = 3.0,
        logger: logging.Logger | None = None,
    ) -> None:
        self._exporter = exporter
        self._resource = resource
        self._scope = InstrumentationScope("otel_titan.logs", __version__)
        self.max_queue_size = max_queue_size
        self.max_export_batch_size = max_export_batch_size
        self._schedule_delay_s = schedule_delay_s
        self._shutdown_timeout_s = shutdown_timeout_s
        self._queue: deque[tuple[Any, ...]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._idle = threading.Event()
        self._idle.set()
        #: Records not sent: the queue was full (a slow or dead collector).
        self.dropped_logs = 0
        #: Records the exporter reported as failed.
        self.failed_logs = 0
        #: Records handed to the exporter successfully.
        self.sent_logs = 0
        self._warned_drop = False
        self._logger = logging.getLogger() if logger is None else logger
        self.handler = OtelLogHandler(self)
        self._logger.addHandler(self.handler)
        self._thread = threading.Thread(target=self._run, name="otel-titan-logs", daemon=True)
        self._thread.start()

    # -- the exporter interface -------------------------------------------------------------
    def export_timeline(self, timeline: Sequence[Any]) -> SpanExportResult:
        """Spans are not this exporter's business."""
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing synchronous here: the records go every ``OTEL_BLRP_SCHEDULE_DELAY`` and at
        shutdown."""
        return True

    def delivery_losses(self) -> tuple[str, int, int]:
        """``("logs:otlp", dropped, failed)`` records since init (the closing record, the health
        counters)."""
        return ("logs:otlp", self.dropped_logs, self.failed_logs)

    def drain(self, timeout: float) -> bool:
        """Send what is queued within `timeout` seconds (SIGTERM)."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while (self._queue or not self._idle.is_set()) and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.01)
        return not self._queue and self._idle.is_set()

    def shutdown(self) -> None:
        """Detach the handler, send what is queued (at most `shutdown_timeout_s`), stop."""
        if self._stopping:
            return
        self._logger.removeHandler(self.handler)
        self._stopping = True
        self._wake.set()
        self._thread.join(self._shutdown_timeout_s)
        if self._thread.is_alive():  # time ran out: what is still queued is not sent
            self.dropped_logs += len(self._queue)
            self._queue.clear()
        self._warn_dropped()
        try:
            self._exporter.shutdown()
        except Exception:  # noqa: BLE001 - at exit: nothing to recover
            pass

    def discard(self) -> None:
        """Init failed after this was made: detach, send nothing."""
        self._logger.removeHandler(self.handler)
        self._queue.clear()
        self._stopping = True
        self._wake.set()

    def close_after_fork(self) -> None:
        """In a forked child: detach the parent's handler; its thread does not exist here."""
        self._logger.removeHandler(self.handler)
        self._queue.clear()
        self._stopping = True

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        run_batches(
            self._queue,
            self._wake,
            self._idle,
            self._schedule_delay_s,
            self.max_export_batch_size,
            self._send,
            lambda: self._stopping,
        )

    def _send(self, batch: list[tuple[Any, ...]]) -> None:
        records = [self._record(item) for item in batch]
        try:
            result = self._exporter.export(records)
            ok = getattr(result, "name", str(result)) == "SUCCESS"
        except Exception:  # noqa: BLE001 - counted; the SDK exporter logs its own failures
            ok = False
        if ok:
            self.sent_logs += len(records)
        else:
            self.failed_logs += len(records)
        self._warn_dropped()

    def _warn_dropped(self) -> None:
        """Once, from this thread (never the writing thread, whose handler is the one dropping):
        records were dropped."""
        if self._warned_drop or not self.dropped_logs:
            return
        self._warned_drop = True
        _log.warning(
            "otel-titan: OTLP log records are being dropped: %d waiting records "
            "(OTEL_BLRP_MAX_QUEUE_SIZE) while the collector is slow or down; "
            "counted in the closing record (exporter_losses) and "
            "titan.logger.records{outcome=dropped}, not warned about again",
            self.max_queue_size,
        )

    def _record(self, item: tuple[Any, ...]) -> ReadWriteLogRecord:
        (
            created_ns,
            levelno,
            levelname,
            message,
            name,
            path,
            lineno,
            function,
            thread,
            ids,
            exception,
        ) = item
        context = None
        if ids is not None:
            context = trace.set_span_in_context(
                NonRecordingSpan(SpanContext(ids[0], ids[1], False, _SAMPLED))
            )
        record = LogRecord(
            timestamp=created_ns,
            observed_timestamp=time.time_ns(),
            context=context,
            severity_text=levelname,  # Python's own (WARNING, CRITICAL), as the SDK's handler sends it; the number says WARN, FATAL
            severity_number=_severity(levelno),
            body=message,
            attributes={
                "code.file.path": path,
                "code.line.number": lineno,
                "code.function.name": function,
                "thread.id": thread,
                "logger.name": name,
                **(exception or {}),
            },
        )
        return ReadWriteLogRecord(
            log_record=record, resource=self._resource, instrumentation_scope=self._scope
        )


def register_otel_logs_handler(add_span_exporter: Any, resource: Resource, **_: Any) -> None:
    """Handler factory: the root logger's records also as OTLP log records (module docstring)."""
    if sdk_disabled():
        raise HandlerSkipped("OTEL_SDK_DISABLED=true")
    if not logs_exporters():
        raise HandlerSkipped("OTEL_LOGS_EXPORTER is unset or none")
    max_queue = _env_int("OTEL_BLRP_MAX_QUEUE_SIZE", 2048)
    batch = _env_int("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", 512)
    delay_s = _env_int("OTEL_BLRP_SCHEDULE_DELAY", 1000) / 1000
    quiet_exporter_logs()  # a dead collector: each export error once a minute, with the count, as for traces
    if signal_protocol("LOGS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter  # type: ignore[assignment]  # either protocol's
    add_span_exporter(
        OtelLogsExporter(
            OTLPLogExporter(),
            resource,
            max_queue_size=max_queue,
            max_export_batch_size=min(batch, max_queue),
            schedule_delay_s=delay_s,
        )
    )

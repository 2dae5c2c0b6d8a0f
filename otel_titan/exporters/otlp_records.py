"""The JSONL records over OTLP, as log records: ``OTEL_TITAN_OTLP_RECORDS=true``.

Why: `otel-titan watch` needs every span's *start* (a hung rank is the one
inside a span that never ends), the heartbeats and the black box while the job
runs. OTLP spans arrive only when they end, and a file on NFS can reach
another host tens of seconds late, on a node-local disk never. This exporter
sends each record the JSONL file holds (the same dict, built by the same
`RecordEncoder`: opened, every ``_start``/``_end``/``_error``, instants,
scalars, ``heartbeat``, ``stall``, ``records_dropped``, ``closed``; not the
``step_rollup`` totals, which sum spans the stream already carries) as one OTLP
log record, in the order they happened, to the OTLP endpoint; ``otel-titan
watch --otlp`` (or any collector that forwards logs to it) turns them back
into the same files (otel_titan/receive/).

One stream, not spans plus a side channel for starts: a start that travelled
apart from its end could arrive after it and leave a span "open" forever, the
one thing that must never happen to a watcher naming hung ranks. Here a
record's ``seq_id`` orders it and tells a duplicate (a collector's retry) or a
loss (a full queue) to the receiver.

Each log record: ``body`` = the JSONL line (a JSON object, as a string, so any
collector passes it untouched and Loki-style backends can parse it);
``time_unix_nano`` = the record's time; attributes ``otel_titan.file`` (this
process's file name under the schema's naming rule: the receiver writes the
records there), ``otel_titan.seq`` (the ``seq_id``) and ``otel_titan.record``
(the ``log_type_name``, for a collector's routing or filtering); scope
``otel_titan.records``; the process's Resource, as its spans and metrics.

Off by default: it doubles what a rank sends to its collector (a log record
per record, beside the spans), which a Tempo or Loki user pays for without
having asked. What it costs when on: the training thread nothing (the records
are encoded on the processor thread, as the file's are, and sent from a
thread of its own in batches, their OTLP bytes written directly:
otlp_records_wire.py); a collector or watcher that is down, slow or
refusing costs nothing either: past ``OTEL_TITAN_OTLP_RECORDS_QUEUE`` (65,536)
waiting records new ones are dropped and counted, and reported in a
``records_dropped`` record once there is room. Batches go every
``OTEL_TITAN_OTLP_RECORDS_DELAY_MS`` (200 ms: the watcher's latency, not a
collector's 1 s default) or at 512 records; shutdown sends what is left (the
closing record last) within 3 s.

Transport: ``OTEL_EXPORTER_OTLP_LOGS_PROTOCOL``, then ``OTEL_EXPORTER_OTLP_PROTOCOL``
(``http/protobuf`` by default, or ``grpc``); endpoint, headers, certificates
and timeout from the standard ``OTEL_EXPORTER_OTLP_*`` variables
(``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`` for this stream alone), read by the
SDK's log exporter itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.sdk._logs import ReadWriteLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_titan._version import __version__
from otel_titan.core.exporter import (
    HandlerSkipped,
    PipelineStats,
    SpanExportResult,
    StartAwareSpanExporter,
    TimelineItem,
)
from otel_titan.core.identity import RunIdentity
from otel_titan.environment_variables import (
    OTEL_TITAN_OTLP_RECORDS,
    OTEL_TITAN_OTLP_RECORDS_DELAY_MS,
    OTEL_TITAN_OTLP_RECORDS_QUEUE,
    flag,
)
from otel_titan.exporters.batch_sender import run_batches
from otel_titan.exporters.jsonl import jsonl_file_path, opened_fields
from otel_titan.exporters.otel_env import sdk_disabled
from otel_titan.exporters.otlp_records_wire import (
    RecordsRequestEncoder,
    records_grpc_exporter_class,
    records_http_exporter_class,
)
from otel_titan.exporters.records import RecordEncoder
from otel_titan.schema import MetaEvent, OtlpRecords

__all__ = [
    "OtlpRecordsExporter",
    "register_otlp_records_handler",
    "records_enabled",
    "RECORDS_ENV",
    "RECORDS_HANDLER",
    "SCOPE_NAME",
    "FILE_ATTRIBUTE",
    "SEQ_ATTRIBUTE",
    "RECORD_ATTRIBUTE",
]

_log = logging.getLogger("otel_titan")

#: The variable that turns the stream on (``true``, ``1``, ``yes``, ``on``).
RECORDS_ENV = OTEL_TITAN_OTLP_RECORDS
RECORDS_HANDLER = "otel_titan.exporters.otlp_records.register_otlp_records_handler"
#: The instrumentation scope of the log records, and their attributes (the receiver's contract:
#: `schema.OtlpRecords`).
SCOPE_NAME = OtlpRecords.SCOPE
FILE_ATTRIBUTE = OtlpRecords.FILE
SEQ_ATTRIBUTE = OtlpRecords.SEQ
RECORD_ATTRIBUTE = OtlpRecords.RECORD

_SEVERITY = {
    "DEBUG": SeverityNumber.DEBUG,
    "INFO": SeverityNumber.INFO,
    "WARNING": SeverityNumber.WARN,
    "ERROR": SeverityNumber.ERROR,
    "CRITICAL": SeverityNumber.FATAL,
}
_SEVERITY_TEXT = {"WARNING": "WARN", "CRITICAL": "FATAL"}


def records_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``OTEL_TITAN_OTLP_RECORDS`` asks for the stream (and the OpenTelemetry side is not disabled).

    Example:
        >>> records_enabled({"OTEL_TITAN_OTLP_RECORDS": "true"}), records_enabled({}), records_enabled({"OTEL_TITAN_OTLP_RECORDS": "1", "OTEL_SDK_DISABLED": "true"})
        (True, False, False)
    """
    env = os.environ if environ is None else environ
    return flag(RECORDS_ENV, False, env) and not sdk_disabled(env)


class OtlpRecordsExporter(StartAwareSpanExporter):
    """Send every record of this process as an OTLP log record (module docstring).

    `log_exporter` is one of `otlp_records_wire`'s (the SDK's HTTP or gRPC
    log exporter sending the bytes `RecordsRequestEncoder` writes), or any
    SDK log exporter (``export(records)`` and ``shutdown()``: SDK log records
    are made for it, the slow way). The opening
    record is queued at construction, so a rank that hangs before its first
    span is still known to the receiver. Made by `register_otlp_records_handler`
    when ``OTEL_TITAN_OTLP_RECORDS=true``, not by hand.
    """

    def __init__(
        self,
        log_exporter: Any,
        resource: Resource,
        identity: RunIdentity,
        file_name: str,
        *,
        opened: Mapping[str, Any] | None = None,
        stats: PipelineStats | None = None,
        max_queue_size: int = 65536,
        max_export_batch_size: int = 512,
        schedule_delay_s: float = 0.2,
        shutdown_timeout_s: float = 3.0,
    ) -> None:
        self._exporter = log_exporter
        self._resource = resource
        self._scope = InstrumentationScope(SCOPE_NAME, __version__)
        self.file_name = file_name
        self._wire = RecordsRequestEncoder(resource, self._scope, file_name)
        self._encoder = RecordEncoder(identity)
        self._stats = stats
        self.max_queue_size = max_queue_size
        self.max_export_batch_size = max_export_batch_size
        self._schedule_delay_s = schedule_delay_s
        self._shutdown_timeout_s = shutdown_timeout_s
        self._queue: deque[bytes] = deque()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stopping = False
        self._closed = False
        #: Records not sent because the queue was full (a slow or dead receiver); records the
        #: exporter failed to send; records sent.
        self.dropped_records = 0
        self.failed_records = 0
        self.sent_records = 0
        #: The program's records (starts, ends, instants, scalars) handed to the queue, as the
        #: file's ``written_records``.
        self.queued_records = 0
        self._reported_drops = 0
        self._put([self._encoder.meta_line(MetaEvent.OPENED, dict(opened or {}))])
        self._thread = threading.Thread(
            target=self._run, name="otel-titan-otlp-records", daemon=True
        )
        self._thread.start()

    # -- what the processor thread calls ---------------------------------------------------------
    def export_timeline(self, timeline: Sequence[TimelineItem]) -> SpanExportResult:
        """Encode the records of `timeline` (as the JSONL file does) and queue them for the sender
        thread."""
        if self._closed:
            return SpanExportResult.FAILURE
        lines: list[bytes] = []
        report = self._drop_report()
        if report is not None:
            lines.append(report)
        meta = len(lines)
        self._encoder.encode_timeline(timeline, lines)
        self.queued_records += len(lines) - meta
        self._put(lines)
        return SpanExportResult.SUCCESS

    def heartbeat(self, time_ns: int, open_spans: Sequence[Any]) -> None:
        """A ``heartbeat`` record: alive, quiet, and still inside `open_spans` (the JSONL
        file's)."""
        if self._closed:
            return
        names = [span.name for span in open_spans[-8:]]
        self._put(
            [
                self._encoder.meta_line(
                    MetaEvent.HEARTBEAT,
                    {
                        "open_spans": len(open_spans),
                        "open_span_names": names,
                        "message": f"alive, {len(open_spans)} span(s) open: {', '.join(names)}",
                    },
                    time_ns,
                )
            ]
        )
        self._wake.set()  # news for a watcher: not held back for the batch

    def black_box(self, time_ns: int, record: dict[str, Any]) -> None:
        """A ``stall`` record: the hang black box, sent at once."""
        if self._closed:
            return
        self._put([self._encoder.meta_line(MetaEvent.STALL, record, time_ns)])
        self._wake.set()

    def _put(self, lines: list[bytes]) -> None:
        queue = self._queue
        room = self.max_queue_size - len(queue)
        if room < len(lines):
            self.dropped_records += len(lines) - max(room, 0)
            lines = lines[: max(room, 0)]
        queue.extend(lines)
        if len(queue) >= self.max_export_batch_size:
            self._wake.set()

    def _drop_report(self) -> bytes | None:
        """A ``records_dropped`` record when records were lost since the last one (the capture
        queue's, this stream's queue, or a failed send)."""
        capture = self._stats.dropped_records if self._stats is not None else 0
        # this stream's own losses: its queue full, or a send that failed
        unsent = self.dropped_records + self.failed_records
        lost = unsent + capture
        if lost == self._reported_drops or len(self._queue) >= self.max_queue_size:
            return None
        line = self._encoder.meta_line(
            MetaEvent.DROPPED,
            {
                "value": lost - self._reported_drops,
                "dropped_records": capture,
                "failed_records": unsent,
                "message": f"{lost - self._reported_drops} records lost (capture queue full: {capture} in total; not sent over OTLP, queue full or send failed: {unsent} in total)",
                "log_level": "WARNING",
            },
        )
        self._reported_drops = lost
        return line

    def delivery_losses(self) -> tuple[str, int, int]:
        """``("records:otlp", dropped, failed)`` records since init (the closing record, the health
        counters)."""
        return ("records:otlp", self.dropped_records, self.failed_records)

    # -- lifecycle ---------------------------------------------------------------------------------
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Start sending what is queued now; does not wait (called on the processor thread: a dead
        receiver must not hold it; see `drain`)."""
        self._wake.set()
        return True

    def drain(self, timeout: float) -> bool:
        """Send what is queued within `timeout` seconds (SIGTERM, flush); False if time ran out."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while (
            (self._queue or not self._idle.is_set())
            and time.monotonic() < deadline
            and self._thread.is_alive()
        ):
            self._wake.set()
            time.sleep(0.005)
        return not self._queue and self._idle.is_set()

    def shutdown(self) -> None:
        """Queue the closing record, send everything (at most `shutdown_timeout_s`), stop."""
        if self._closed:
            return
        lines = []
        report = self._drop_report()
        if report is not None:
            lines.append(report)
        capture = self._stats.dropped_records if self._stats is not None else 0
        lines.append(
            self._encoder.meta_line(
                MetaEvent.CLOSED,
                {
                    "closing": True,
                    "written_records": self.queued_records,
                    "dropped_records": capture,
                    "failed_records": self.dropped_records + self.failed_records,
                    "skipped_values": self._stats.skipped_values if self._stats is not None else 0,
                    "message": f"closed cleanly: {self.queued_records} records sent over OTLP, {capture} dropped, {self.dropped_records + self.failed_records} failed",
                },
            )
        )
        self._put(lines)
        self._closed = True
        self._stopping = True
        self._wake.set()
        self._thread.join(self._shutdown_timeout_s)
        try:
            self._exporter.shutdown()
        except Exception:  # noqa: BLE001 - at exit: nothing to recover
            pass

    def discard(self) -> None:
        """Init failed after this was made: send nothing."""
        self._queue.clear()
        self._closed = self._stopping = True
        self._wake.set()

    def close_after_fork(self) -> None:
        """In a forked child: the parent's thread does not exist here; forget its queue."""
        self._queue.clear()
        self._closed = self._stopping = True

    # -- the sender thread ----------------------------------------------------------------------
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

    def _send(self, lines: list[bytes]) -> None:
        exporter = self._exporter
        try:
            if getattr(exporter, "fast", False):
                # The request's bytes written directly (otlp_records_wire.py): a few µs a record
                # instead of the SDK's ~35.
                ok = exporter.export_request(len(lines), self._wire.encode(lines))
            else:
                result = exporter.export([self._log_record(line) for line in lines])
                ok = getattr(result, "name", str(result)) == "SUCCESS"
        except Exception:  # noqa: BLE001 - counted; the SDK exporter logs its own failures
            ok = False
        if ok:
            self.sent_records += len(lines)
        else:
            self.failed_records += len(lines)

    def _log_record(self, line: bytes) -> ReadWriteLogRecord:
        record = orjson.loads(line)
        level = record.get("log_level") if isinstance(record.get("log_level"), str) else "INFO"
        name = record.get("log_type_name")
        body = (
            line[:-1].decode("utf-8", "replace")
            if line.endswith(b"\n")
            else line.decode("utf-8", "replace")
        )
        log = LogRecord(
            timestamp=int(record.get("time_us") or 0) * 1000,
            observed_timestamp=time.time_ns(),
            severity_text=_SEVERITY_TEXT.get(level, level),
            severity_number=_SEVERITY.get(level, SeverityNumber.INFO),
            body=body,
            attributes={
                FILE_ATTRIBUTE: self.file_name,
                SEQ_ATTRIBUTE: int(record.get("seq_id") or 0),
                RECORD_ATTRIBUTE: name if isinstance(name, str) else "",
            },
        )
        return ReadWriteLogRecord(
            log_record=log, resource=self._resource, instrumentation_scope=self._scope
        )


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={raw!r} must be an int >= 1")
    return value


def _log_exporter() -> Any:
    for name in ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = os.environ.get(name, "").strip().lower()
        if value:
            if value not in ("http/protobuf", "grpc"):
                raise ValueError(
                    f"{name}={value!r} is not supported for the records stream (use one of: "
                    "http/protobuf, grpc)"
                )
            if value == "grpc":
                return records_grpc_exporter_class()()  # grpc is heavy: loaded only here
            break
    return records_http_exporter_class()()


def register_otlp_records_handler(
    *,
    identity: RunIdentity,
    resource: Resource,
    add_span_exporter: Any,
    stats: PipelineStats,
    options: Any,
    output_dir: str = ".",
    **_: Any,
) -> OtlpRecordsExporter:
    """Handler factory: every record also as an OTLP log record, for ``otel-titan watch --otlp``
    (module docstring).

    Among the defaults it runs when ``OTEL_TITAN_OTLP_RECORDS=true``; named in a
    handler list (``OTEL_TITAN_HANDLERS``) it runs as named. Skipped (not an
    error) when ``OTEL_SDK_DISABLED=true``.

    Example (a shell line, not Python)::

        OTEL_TITAN_OTLP_RECORDS=true OTEL_EXPORTER_OTLP_ENDPOINT=http://watch-host:4318 torchrun ...
        train.py
    """
    if sdk_disabled():
        raise HandlerSkipped("OTEL_SDK_DISABLED=true")
    exporter = OtlpRecordsExporter(
        _log_exporter(),
        resource,
        identity,
        os.path.basename(jsonl_file_path(output_dir, identity.source, identity.rank)),
        opened=opened_fields(identity, options),
        stats=stats,
        max_queue_size=_env_int(OTEL_TITAN_OTLP_RECORDS_QUEUE, 65536),
        schedule_delay_s=_env_int(OTEL_TITAN_OTLP_RECORDS_DELAY_MS, 200) / 1000,
    )
    add_span_exporter(exporter)
    return exporter

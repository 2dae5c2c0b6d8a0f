"""The records stream's OTLP bytes, written directly, and the SDK's log exporters sending them as
they are.

Why: through the SDK, a record costs about 35 µs of a background thread that
shares the interpreter lock with training (an SDK `LogRecord`, its bounded
attributes, then ``encode_logs`` building a protobuf message field by
field). Every record of the stream has the same shape (a string body, three
attributes, a time, a severity), and its Resource and scope never change, so
`RecordsRequestEncoder` writes the ``ExportLogsServiceRequest`` bytes from
cached fragments: a few µs a record. The bytes mean exactly what the SDK's
encoding of the same log records means (tests/exporters/test_otlp_records_wire.py
decodes both and compares them).

Transport stays the SDK's, as `otlp_http` and `otlp_grpc` do for spans:
endpoint, headers, TLS, compression, timeout and retries from
``OTEL_EXPORTER_OTLP_*``. Over HTTP the request bytes go to the exporter's
client where it would put ``encode_logs(batch).SerializeToString()``; over
gRPC ``_translate_data`` returns them and the stub sends them unserialized.
Where the installed SDK's internals differ from the ones this was written
against (checked when the class is built), the batch is converted to SDK log
records and exported the SDK's own way: slower, never wrong.
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Sequence
from typing import Any

import orjson
from opentelemetry.exporter.otlp.proto.common._internal import _encode_instrumentation_scope

from otel_titan.exporters.otlp_encoder import _len_field, _resource_message, _utf8, _varint
from otel_titan.schema import OtlpRecords

__all__ = [
    "RecordsRequestEncoder",
    "records_http_exporter_class",
    "records_grpc_exporter_class",
    "SEVERITY",
]

#: log_level → (SeverityNumber value, severity text), as the specification maps Python's levels.
SEVERITY = {
    "DEBUG": (5, "DEBUG"),
    "INFO": (9, "INFO"),
    "WARNING": (13, "WARN"),
    "ERROR": (17, "ERROR"),
    "CRITICAL": (21, "FATAL"),
}
_pack_fixed64 = struct.Struct("<Q").pack
_EXPORT_METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


def _key_value(key: str, any_value: bytes) -> bytes:
    return _len_field(b"\x0a", _utf8(key)) + _len_field(b"\x12", any_value)


class RecordsRequestEncoder:
    """JSONL lines of one process → the bytes of one ``ExportLogsServiceRequest``; caches what
    repeats.

    One instance per exporter; used by its sender thread only.

    Example:
        >>> from opentelemetry.sdk.resources import Resource
        >>> from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        >>> from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
        >>> encoder = RecordsRequestEncoder(Resource({"service.name": "t"}), InstrumentationScope("otel_titan.records"), "x.jsonl")
        >>> data = encoder.encode([b'{"log_type_name": "a_start", "time_us": 5, "seq_id": 1, "log_level": "INFO"}\\n'])
        >>> log = ExportLogsServiceRequest.FromString(data).resource_logs[0].scope_logs[0].log_records[0]
        >>> log.body.string_value, log.time_unix_nano, [a.key for a in log.attributes]
        ('{"log_type_name": "a_start", "time_us": 5, "seq_id": 1, "log_level": "INFO"}', 5000, ['otel_titan.file', 'otel_titan.seq', 'otel_titan.record'])
    """

    def __init__(self, resource: Any, scope: Any, file_name: str) -> None:
        # ResourceLogs.resource = 1
        self._resource = _len_field(b"\x0a", _resource_message(resource))
        # ScopeLogs.scope = 1
        self._scope = _len_field(b"\x0a", _encode_instrumentation_scope(scope).SerializeToString())
        # LogRecord.attributes = 6
        self._file = _len_field(
            b"\x32", _key_value(OtlpRecords.FILE, _len_field(b"\x0a", _utf8(file_name)))
        )
        self._seq_key = _len_field(b"\x0a", _utf8(OtlpRecords.SEQ))
        self._kinds: dict[str, bytes] = {}
        self._severities = {
            level: b"\x10" + _varint(number) + _len_field(b"\x1a", text.encode())
            for level, (number, text) in SEVERITY.items()
        }

    def _severity(self, level: Any) -> bytes:
        """A level the specification does not name: INFO's number, its own text (as the SDK path
        sends it)."""
        if not isinstance(level, str) or not level:
            return self._severities["INFO"]
        fragment = b"\x10" + _varint(9) + _len_field(b"\x1a", _utf8(level))
        if len(self._severities) < 64:
            self._severities[level] = fragment
        return fragment

    def encode(self, lines: Sequence[bytes]) -> bytes:
        """The request for `lines` (each a JSONL line, with or without its newline)."""
        # LogRecord.observed_time_unix_nano = 11 (fixed64): one read per batch
        observed = b"\x59" + _pack_fixed64(time.time_ns())
        file, seq_key, kinds, severities = self._file, self._seq_key, self._kinds, self._severities
        records = []
        for line in lines:
            if line.endswith(b"\n"):
                line = line[:-1]
            record = orjson.loads(line)
            name = record.get("log_type_name")
            kind = kinds.get(name) if isinstance(name, str) else b""
            if kind is None:
                kind = _len_field(
                    b"\x32", _key_value(OtlpRecords.RECORD, _len_field(b"\x0a", _utf8(name)))
                )
                if len(kinds) < 4096:
                    kinds[name] = kind
            seq = record.get("seq_id")
            seq = seq if type(seq) is int and seq >= 0 else 0
            time_us = record.get("time_us")
            body = b"".join(
                (
                    b"\x09"
                    # time_unix_nano = 1
                    + _pack_fixed64(
                        time_us * 1000 if type(time_us) is int and 0 <= time_us < 1 << 54 else 0
                    ),
                    severities.get(record.get("log_level"))
                    # severity_number = 2, severity_text = 3
                    or self._severity(record.get("log_level")),
                    # body = 5: AnyValue.string_value (the line is UTF-8: orjson wrote it)
                    _len_field(b"\x2a", _len_field(b"\x0a", line)),
                    file,
                    # AnyValue.int_value = 3
                    _len_field(b"\x32", seq_key + _len_field(b"\x12", b"\x18" + _varint(seq))),
                    kind,
                    observed,
                )
            )
            records.append(b"\x12" + _varint(len(body)) + body)  # ScopeLogs.log_records = 2
        scope_logs = self._scope + b"".join(records)
        resource_logs = self._resource + b"\x12" + _varint(len(scope_logs)) + scope_logs
        # ExportLogsServiceRequest.resource_logs = 1
        return b"\x0a" + _varint(len(resource_logs)) + resource_logs


@functools.cache
def records_http_exporter_class() -> type:
    """The SDK's OTLP/HTTP log exporter taking ``(count, bytes)`` batches
    (`RecordsRequestEncoder`'s) through `export_request`.

    Example:
        >>> exporter = records_http_exporter_class()(endpoint="http://localhost:4318/v1/logs")
        >>> exporter.shutdown()
    """
    from opentelemetry.exporter.otlp.proto.http import _log_exporter as sdk_http  # loads requests

    class TitanHttpRecordsExporter(sdk_http.OTLPLogExporter):
        """The SDK's HTTP log exporter, sending request bytes made elsewhere."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.fast = all(
                hasattr(self, name)
                for name in ("_shutdown", "_metrics", "_client", "_max_request_size")
            )

        def export_request(self, count: int, data: bytes) -> bool:
            """Send one encoded request of `count` records; True when the receiver took it."""
            if self._shutdown:
                return False
            with self._metrics.export_operation(count) as result:
                if len(data) > self._max_request_size:
                    result.error = ValueError(
                        f"records request of {len(data)} bytes exceeds max_request_size "
                        f"{self._max_request_size}"
                    )
                    return False
                answer = self._client.export(data)
                if not answer.success:
                    result.error = answer.error
                    return False
            return True

    return TitanHttpRecordsExporter


@functools.cache
def records_grpc_exporter_class() -> type:
    """The SDK's OTLP/gRPC log exporter taking request bytes (`RecordsRequestEncoder`'s) through
    `export_request`.

    Example:
        >>> exporter = records_grpc_exporter_class()(endpoint="localhost:4317", insecure=True)
        >>> exporter.shutdown()
    """
    # grpc is heavy
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
        OTLPLogExporter,
    )
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

    class _BytesLogsServiceStub:
        """``LogsServiceStub`` whose ``Export`` takes an already serialized request."""

        def __init__(self, channel: Any) -> None:
            self.Export = channel.unary_unary(
                _EXPORT_METHOD,
                request_serializer=None,
                response_deserializer=ExportLogsServiceResponse.FromString,
            )

    class TitanGrpcRecordsExporter(OTLPLogExporter):
        """The SDK's gRPC log exporter, sending request bytes made elsewhere."""

        fast = True

        def _initialize_channel_and_stub(self) -> None:
            # Called by the SDK at start and again to reconnect after UNAVAILABLE.
            super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]  # the SDK's own, unannotated
            self._client = _BytesLogsServiceStub(self._channel)  # type: ignore[assignment]  # bytes in, as the SDK's stub

        def _translate_data(self, data: Any) -> Any:
            return data[1] if isinstance(data, tuple) else super()._translate_data(data)

        def _count_data(self, data: Any) -> int:
            return data[0] if isinstance(data, tuple) else len(data)

        def export_request(self, count: int, data: bytes) -> bool:
            """Send one encoded request of `count` records (retried by the SDK as any batch); True
            when the receiver took it."""
            result = super().export((count, data))  # type: ignore[arg-type]  # (count, bytes): _translate_data above takes it
            return getattr(result, "name", str(result)) == "SUCCESS"

    return TitanGrpcRecordsExporter

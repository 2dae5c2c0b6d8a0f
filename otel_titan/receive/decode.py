"""OTLP request bodies → the records' JSONL lines: the one module of the receiver that reads OTLP's
messages.

A log record is one of ours when it carries the ``otel_titan.file``
attribute (`schema.OtlpRecords`); its ``body`` string is the JSONL line. Any
other log record (the training log of ``OTEL_LOGS_EXPORTER=otlp``, another
program's logs through a shared collector) is counted and left alone, as are
spans and metrics: the records stream already holds every span's start and end.

Both encodings of OTLP/HTTP are read: protobuf (the SDK's default, and what
collectors forward) and JSON (``http/json``; its integers may be strings, as
the OTLP JSON mapping allows). ``opentelemetry.proto`` is imported when the
first protobuf body arrives, so a CLI that never receives does not load it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from otel_titan.schema import MAX_LINE_BYTES, OtlpRecords

__all__ = [
    "ReceivedRecord",
    "Decoded",
    "DecodeError",
    "RecordTooLong",
    "decode_logs",
    "count_spans",
]


class DecodeError(ValueError):
    """The body is not an OTLP request of the kind its path says."""


class RecordTooLong(ValueError):
    """A record's line is longer than readers take (`schema.MAX_LINE_BYTES`): written, it would be
    skipped by every reader."""


@dataclass
class ReceivedRecord:
    """One record as it came: its process's file name, its ``seq_id`` (0 when absent) and its JSONL
    line (no newline)."""

    file: str
    seq: int
    line: bytes


@dataclass
class Decoded:
    """What one request held: our records, and the log records that were not ours."""

    records: list[ReceivedRecord] = field(default_factory=list)
    foreign: int = 0


def decode_logs(body: bytes, *, json_body: bool = False) -> Decoded:
    """Our records in an ``ExportLogsServiceRequest`` (protobuf, or OTLP JSON when `json_body`);
    `RecordTooLong` past `schema.MAX_LINE_BYTES`.

    Example:
        >>> from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
        >>> request = ExportLogsServiceRequest()
        >>> log = request.resource_logs.add().scope_logs.add().log_records.add()
        >>> log.body.string_value = '{"log_type_name": "a_start"}'
        >>> attribute = log.attributes.add(); attribute.key = "otel_titan.file"; attribute.value.string_value = "x.jsonl"
        >>> decode_logs(request.SerializeToString()).records
        [ReceivedRecord(file='x.jsonl', seq=0, line=b'{"log_type_name": "a_start"}')]
    """
    decoded = _decode_json(body) if json_body else _decode_protobuf(body)
    for record in decoded.records:
        if len(record.line) > MAX_LINE_BYTES:
            raise RecordTooLong(
                f"the record {record.seq} of {record.file!r} is {len(record.line):,} bytes, more "
                f"than the {MAX_LINE_BYTES >> 20} MiB "
                "a reader takes in one line"
            )
    return decoded


def _decode_protobuf(body: bytes) -> Decoded:
    from google.protobuf.message import DecodeError as ProtobufError  # loaded on the first request
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    try:
        request = ExportLogsServiceRequest.FromString(body)
    except ProtobufError as error:
        raise DecodeError(f"not an OTLP logs request (protobuf): {error}") from None
    out = Decoded()
    append = out.records.append
    file_key, seq_key = OtlpRecords.FILE, OtlpRecords.SEQ
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            for log in scope_logs.log_records:
                name = None
                seq = 0
                for attribute in log.attributes:
                    key = attribute.key
                    if key == file_key:
                        name = attribute.value.string_value
                    elif key == seq_key:
                        seq = attribute.value.int_value
                if not name:
                    out.foreign += 1
                    continue
                append(
                    ReceivedRecord(
                        name, seq, log.body.string_value.encode("utf-8", "surrogatepass")
                    )
                )
    return out


def _any_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return None
    for key in ("stringValue", "intValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    return None


def _decode_json(body: bytes) -> Decoded:
    try:
        request = json.loads(body)
    except ValueError as error:
        raise DecodeError(f"not an OTLP logs request (JSON): {error}") from None
    if not isinstance(request, dict):
        raise DecodeError("not an OTLP logs request (JSON): the body is not an object")
    out = Decoded()
    for resource_logs in _list(request.get("resourceLogs")):
        for scope_logs in _list(
            resource_logs.get("scopeLogs") if isinstance(resource_logs, dict) else None
        ):
            for log in _list(
                scope_logs.get("logRecords") if isinstance(scope_logs, dict) else None
            ):
                if not isinstance(log, dict):
                    continue
                attributes = {
                    a.get("key"): _any_value(a.get("value"))
                    for a in _list(log.get("attributes"))
                    if isinstance(a, dict)
                }
                name = attributes.get(OtlpRecords.FILE)
                line = _any_value(log.get("body"))
                if not isinstance(name, str) or not name or not isinstance(line, str):
                    out.foreign += 1
                    continue
                try:
                    seq = int(attributes.get(OtlpRecords.SEQ) or 0)
                except (TypeError, ValueError):
                    seq = 0
                out.records.append(ReceivedRecord(name, seq, line.encode("utf-8", "surrogatepass")))
    return out


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def count_spans(body: bytes, *, json_body: bool = False) -> int:
    """How many spans an ``ExportTraceServiceRequest`` holds (the frame says so; the records stream
    has them already).

    Example:
        >>> count_spans(b"")
        0
    """
    if json_body:
        try:
            request = json.loads(body)
        except ValueError as error:
            raise DecodeError(f"not an OTLP traces request (JSON): {error}") from None
        return sum(
            len(_list(s.get("spans")))
            for r in _list(request.get("resourceSpans") if isinstance(request, dict) else None)
            if isinstance(r, dict)
            for s in _list(r.get("scopeSpans"))
            if isinstance(s, dict)
        )
    from google.protobuf.message import DecodeError as ProtobufError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    try:
        request = ExportTraceServiceRequest.FromString(body)
    except ProtobufError as error:
        raise DecodeError(f"not an OTLP traces request (protobuf): {error}") from None
    return sum(
        len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans
    )

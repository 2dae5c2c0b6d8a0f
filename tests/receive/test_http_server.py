"""The OTLP/HTTP endpoint of watch --otlp, on loopback, with real requests: the SDK's exporter, and
raw ones for each refusal."""

from __future__ import annotations

import gzip
import json
import os
import socket
import urllib.error
import urllib.request

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_titan.receive import OtlpHttpReceiver, ReceiverError, Spool, parse_address
from otel_titan.receive.decode import DecodeError, decode_logs

NAME = "training.global_rank_0.20260101-000000-abcdef.jsonl"


@pytest.fixture
def receiver(tmp_path):
    server = OtlpHttpReceiver("127.0.0.1", 0, Spool(str(tmp_path / "spool"))).start()
    yield server
    server.stop()


def logs_request(*records: tuple[str | None, int, str]) -> bytes:
    request = ExportLogsServiceRequest()
    scope = request.resource_logs.add().scope_logs.add()
    for name, seq, body in records:
        log = scope.log_records.add()
        log.body.string_value = body
        if name is not None:
            attribute = log.attributes.add()
            attribute.key, attribute.value.string_value = "otel_titan.file", name
            attribute = log.attributes.add()
            attribute.key, attribute.value.int_value = "otel_titan.seq", seq
    return request.SerializeToString()


def post(receiver: OtlpHttpReceiver, path: str, body: bytes, **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{receiver.port}{path}",
        data=body,
        method="POST",
        headers={"Content-Type": "application/x-protobuf", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def spooled(receiver: OtlpHttpReceiver) -> list[str]:
    path = os.path.join(receiver.spool.log_dir, NAME)
    return open(path).read().splitlines() if os.path.exists(path) else []


def test_the_sdks_log_exporter_is_answered_and_its_records_written(receiver):
    from opentelemetry._logs import LogRecord
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import ReadWriteLogRecord
    from opentelemetry.sdk._logs.export import LogRecordExportResult

    exporter = OTLPLogExporter(endpoint=f"http://127.0.0.1:{receiver.port}/v1/logs")
    logs = [
        ReadWriteLogRecord(
            LogRecord(
                body=json.dumps({"seq_id": n}),
                attributes={"otel_titan.file": NAME, "otel_titan.seq": n},
            )
        )
        for n in (1, 2)
    ]
    assert exporter.export(logs) == LogRecordExportResult.SUCCESS
    exporter.shutdown()
    assert spooled(receiver) == ['{"seq_id": 1}', '{"seq_id": 2}']


def test_gzip_and_deflate_bodies_as_collectors_send_them(receiver):
    import zlib

    assert (
        post(
            receiver,
            "/v1/logs",
            gzip.compress(logs_request((NAME, 1, '{"a": 1}'))),
            **{"Content-Encoding": "gzip"},
        )[0]
        == 200
    )
    assert (
        post(
            receiver,
            "/v1/logs",
            zlib.compress(logs_request((NAME, 2, '{"a": 2}'))),
            **{"Content-Encoding": "deflate"},
        )[0]
        == 200
    )
    assert spooled(receiver) == ['{"a": 1}', '{"a": 2}']


def test_otlp_json_bodies(receiver):
    body = {
        "resourceLogs": [
            {
                "scopeLogs": [
                    {
                        "logRecords": [
                            {
                                "body": {"stringValue": '{"a": 1}'},
                                "attributes": [
                                    {"key": "otel_titan.file", "value": {"stringValue": NAME}},
                                    {"key": "otel_titan.seq", "value": {"intValue": "1"}},
                                ],
                            },
                            {"body": {"stringValue": "a training log line"}, "attributes": []},
                        ]
                    }
                ]
            }
        ]
    }
    status, answer = post(
        receiver, "/v1/logs", json.dumps(body).encode(), **{"Content-Type": "application/json"}
    )
    assert (status, answer) == (200, b"{}")
    assert spooled(receiver) == ['{"a": 1}'] and receiver.foreign_logs == 1


def test_other_logs_spans_and_metrics_are_answered_and_counted_not_written(receiver):
    assert (
        post(
            receiver,
            "/v1/logs",
            logs_request((None, 0, "a training log line"), (NAME, 1, '{"a": 1}')),
        )[0]
        == 200
    )
    traces = ExportTraceServiceRequest()
    scope = traces.resource_spans.add().scope_spans.add()
    for name in ("data_fetch", "all_reduce"):
        scope.spans.add().name = name
    assert post(receiver, "/v1/traces", traces.SerializeToString()) == (200, b"")
    assert post(receiver, "/v1/metrics", b"")[0] == 200
    assert (receiver.foreign_logs, receiver.spans, receiver.received) == (1, 2, 1)
    assert spooled(receiver) == ['{"a": 1}']
    assert "hint" not in receiver.facts()


def test_spans_without_records_bring_a_hint_naming_the_variable(receiver):
    traces = ExportTraceServiceRequest()
    traces.resource_spans.add().scope_spans.add().spans.add().name = "data_fetch"
    assert post(receiver, "/v1/traces", traces.SerializeToString())[0] == 200
    assert "OTEL_TITAN_OTLP_RECORDS=true" in receiver.facts()["hint"]


def test_refusals_say_why(receiver):
    status, text = post(receiver, "/v1/nothing", b"x")
    assert status == 404 and b"/v1/logs" in text
    status, text = post(receiver, "/v1/logs", b"\xff\xff\xff not protobuf")
    assert status == 400 and b"not an OTLP logs request" in text
    status, text = post(receiver, "/v1/logs", b"not gzip", **{"Content-Encoding": "gzip"})
    assert status == 400 and b"gzip" in text
    status, text = post(receiver, "/v1/logs", b"x", **{"Content-Encoding": "br"})
    assert status == 415
    assert receiver.refused == 4 and receiver.received == 0


def test_a_body_too_large_is_refused_before_it_is_read(receiver):
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 999999999999\r\n\r\n"
        )
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer


def test_a_port_in_use_is_said_plainly(receiver, tmp_path):
    with pytest.raises(
        ReceiverError, match=rf"cannot listen on 127.0.0.1:{receiver.port}: the port is in use"
    ):
        OtlpHttpReceiver("127.0.0.1", receiver.port, Spool(str(tmp_path / "other"))).start()
    with pytest.raises(
        ReceiverError, match="cannot listen on no-such-host.invalid:0: unknown host"
    ):
        OtlpHttpReceiver("no-such-host.invalid", 0, Spool(str(tmp_path / "other"))).start()


def test_addresses():
    assert parse_address("127.0.0.1:4318") == ("127.0.0.1", 4318)
    # no host: loopback, never every interface
    assert parse_address(":4318") == ("127.0.0.1", 4318) and parse_address("4318") == (
        "127.0.0.1",
        4318,
    )
    assert parse_address("0.0.0.0:4318") == ("0.0.0.0", 4318)
    assert parse_address("http://collector:4318/") == ("collector", 4318)
    for wrong in ("host", "host:99999", "::1:4318", "host:"):
        with pytest.raises(ValueError, match="port|brackets"):
            parse_address(wrong)


def test_decode_refuses_what_is_not_a_logs_request():
    with pytest.raises(DecodeError):
        decode_logs(b"[1, 2]", json_body=True)
    with pytest.raises(DecodeError):
        decode_logs(b"{", json_body=True)
    assert decode_logs(b"").records == []  # an empty request is a valid one


def test_an_ipv6_loopback_endpoint(tmp_path):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        receiver = OtlpHttpReceiver("::1", 0, Spool(str(tmp_path / "spool"))).start()
    except ReceiverError as error:
        pytest.skip(f"IPv6 loopback unavailable: {error}")
    try:
        request = urllib.request.Request(
            f"http://[::1]:{receiver.port}/v1/logs",
            data=logs_request((NAME, 1, '{"a": 1}')),
            method="POST",
            headers={"Content-Type": "application/x-protobuf"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        assert (
            spooled(receiver) == ['{"a": 1}']
            and receiver.endpoint == f"http://[::1]:{receiver.port}"
        )
    finally:
        receiver.stop()

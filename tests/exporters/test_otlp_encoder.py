"""`OtlpSpanEncoder` produces what the SDK's ``encode_spans`` produces, field by field.

The same spans (a real run's TitanSpans: every record kind, errors, events,
step tags, every attribute type, a remote parent, links, an incomplete copy;
plus plain SDK spans) are encoded by both; both byte strings are decoded as
``ExportTraceServiceRequest`` and compared per span as protobuf messages
(Resource, scope, schema URLs, and the whole ``Span``), ignoring only what
OTLP leaves unordered: how spans are grouped into requests and the order of
attributes. Then both encodings go through the real collector the other tests
use (rotel-agent) over gRPC and HTTP to a receiver, and what arrives is
compared the same way.
"""

from __future__ import annotations

import time
from importlib.metadata import version as package_version
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as SdkGrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as SdkHttpExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext
from packaging.version import Version

from otel_titan.core.titan_span import TitanSpan
from otel_titan.exporters.otlp_encoder import OtlpSpanEncoder, encode_varint
from otel_titan.exporters.otlp_grpc import grpc_exporter_class
from otel_titan.exporters.otlp_http import http_exporter_class
from tests.helpers.collector import RotelCollector
from tests.helpers.otlp_receiver import OtlpReceiver
from tests.helpers.span_mix import titan_spans


def _sorted_attributes(repeated: Any) -> None:
    items = sorted(kv.SerializeToString() for kv in repeated)
    del repeated[:]
    for data in items:
        repeated.add().ParseFromString(data)


def by_span(
    requests: list[ExportTraceServiceRequest],
) -> dict[tuple[bytes, bytes], list[tuple[Any, ...]]]:
    """(trace id, span id) → [(resource, resource schema, scope, scope schema, span)] with
    attributes sorted."""
    out: dict[tuple[bytes, bytes], list[tuple[Any, ...]]] = {}
    for request in requests:
        for resource_spans in request.resource_spans:
            resource = type(resource_spans.resource)()
            resource.CopyFrom(resource_spans.resource)
            _sorted_attributes(resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    copy = type(span)()
                    copy.CopyFrom(span)
                    _sorted_attributes(copy.attributes)
                    for event in copy.events:
                        _sorted_attributes(event.attributes)
                    for link in copy.links:
                        _sorted_attributes(link.attributes)
                    key = (span.trace_id, span.span_id)
                    out.setdefault(key, []).append(
                        (
                            resource,
                            resource_spans.schema_url,
                            scope_spans.scope,
                            scope_spans.schema_url,
                            copy,
                        )
                    )
    return out


@pytest.fixture(scope="module")
def spans(tmp_path_factory):
    return titan_spans(str(tmp_path_factory.mktemp("mix")))


def test_the_mix_covers_what_the_encoder_must_handle(spans):
    titan = [s for s in spans if isinstance(s, TitanSpan)]
    kinds = {s.record_kind for s in titan}
    assert kinds == {"span", "instant", "scalar"}
    assert any(s.status.status_code.name == "ERROR" for s in titan)
    assert any(s.events for s in titan) and any(s.links for s in titan)
    assert any(s.parent is not None and s.parent.is_remote for s in titan)
    # the fast path, as a child
    assert any(s.parent is not None and not s.parent.is_remote and not s.__dict__ for s in titan)
    assert (
        any(s.incomplete for s in titan)
        and any(s.step_tags for s in titan)
        and any(s.task_name for s in titan)
    )
    assert any(s.extra for s in titan) and any(s.description for s in titan)
    assert len(titan) < len(spans)  # plain SDK spans too


def test_our_bytes_decode_to_exactly_the_sdks_messages(spans):
    encoder = OtlpSpanEncoder()
    ours = ExportTraceServiceRequest.FromString(encoder.encode(spans))
    sdk = encode_spans(spans)
    assert (
        encoder.fast_spans == sum(isinstance(s, TitanSpan) for s in spans)
        and encoder.sdk_spans == len(spans) - encoder.fast_spans
    )
    mine, theirs = by_span([ours]), by_span([sdk])
    assert mine.keys() == theirs.keys() and len(mine) == len(spans)
    for key in theirs:
        assert mine[key] == theirs[key], f"span {key[1].hex()} differs"
    # Encoding again from the warm caches gives the same bytes.
    assert encoder.encode(spans) == encoder.encode(spans)


def test_values_outside_the_fast_path_go_to_the_sdk_encoder(spans):
    span = next(s for s in spans if isinstance(s, TitanSpan) and s.record_kind == "instant")
    odd = span.incomplete_copy(span.end_time)
    odd.incomplete = False
    odd._context = SpanContext(span.context.trace_id, span.context.span_id ^ 1, is_remote=False)
    # a map; an integer beyond int64 (the SDK logs and drops it)
    odd.extra = {
        "nested": {"a": 1},
        "huge": 2**70,
    }
    encoder = OtlpSpanEncoder()
    ours = ExportTraceServiceRequest.FromString(encoder.encode([odd, span]))
    assert encoder.sdk_spans == 1 and encoder.fast_spans == 1
    assert by_span([ours]) == by_span([encode_spans([odd, span])])


def test_varint():
    assert [encode_varint(n) for n in (0, 127, 128, 2**64 - 1)] == [
        b"\x00",
        b"\x7f",
        b"\x80\x01",
        b"\xff" * 9 + b"\x01",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_through_the_real_collector_both_encodings_arrive_identical(spans, tmp_path, protocol):
    receiver = OtlpReceiver()
    collector = RotelCollector(receiver.endpoint, tmp_path / "rotel").start()
    try:
        if protocol == "grpc":
            ours: Any = grpc_exporter_class()(endpoint=collector.grpc_endpoint, insecure=True)
            sdk: Any = SdkGrpcExporter(endpoint=collector.grpc_endpoint, insecure=True)
        else:
            ours = http_exporter_class()(endpoint=collector.http_endpoint + "/v1/traces")
            sdk = SdkHttpExporter(endpoint=collector.http_endpoint + "/v1/traces")
        assert ours.export(spans) is SpanExportResult.SUCCESS
        # Over HTTP the encoder needs the SDK exporter's internals of 1.45 (older: the SDK's own
        # export runs, the same bytes, slower).
        encodes = protocol == "grpc" or Version(
            package_version("opentelemetry-exporter-otlp-proto-http")
        ) >= Version("1.45")
        assert (ours.encoder.fast_spans > 0) == encodes
        received_ours = receiver.wait_for(lambda got: len(got) >= len(spans))
        assert len(received_ours) == len(spans)
        assert sdk.export(spans) is SpanExportResult.SUCCESS
        receiver.wait_for(lambda got: len(got) >= 2 * len(spans))
        time.sleep(0.3)  # anything beyond would show in the counts below
        ours.shutdown()
        sdk.shutdown()
        with receiver._lock:
            requests = list(receiver.requests)
    finally:
        collector.stop()
        receiver.stop()
    received = by_span(requests)
    expected = by_span([encode_spans(spans)])
    assert received.keys() == expected.keys()
    for key, copies in received.items():
        assert len(copies) == 2, f"span {key[1].hex()} arrived {len(copies)} times"
        assert copies[0] == copies[1], (
            f"span {key[1].hex()}: our encoding and the SDK's arrived different"
        )
        assert copies[0][4] == expected[key][0][4], f"span {key[1].hex()} changed on the way"


def test_the_standard_variables_still_drive_the_exporters_headers_compression_endpoint(
    spans, monkeypatch
):
    """Only the encoding changed: OTEL_EXPORTER_OTLP_* (endpoint, headers, compression) reach the
    wire as the SDK sends them."""
    import gzip
    import http.server
    import threading

    from otel_titan.exporters.otlp import register_otlp_handler

    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team-a,authorization=Bearer t0ken")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    try:
        added: list[Any] = []
        queued = register_otlp_handler(add_span_exporter=added.append)
        assert type(queued.exporter).__name__ == "TitanGrpcSpanExporter"
        assert queued.exporter.export(spans) is SpanExportResult.SUCCESS
        queued.shutdown()
        assert (
            receiver.metadata[-1]["x-tenant"] == "team-a"
            and receiver.metadata[-1]["authorization"] == "Bearer t0ken"
        )
        assert by_span(receiver.requests) == by_span([encode_spans(spans)])
    finally:
        receiver.stop()

    got: dict[str, Any] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # the http.server hook
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.update(path=self.path, headers=dict(self.headers), body=body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}"
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    try:
        queued = register_otlp_handler(add_span_exporter=lambda exporter: None)
        assert type(queued.exporter).__name__ == "TitanHttpSpanExporter"
        assert queued.exporter.export(spans) is SpanExportResult.SUCCESS
        queued.shutdown()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert got["path"] == "/v1/traces"
    assert got["headers"]["x-tenant"] == "team-a" and got["headers"]["Content-Encoding"] == "gzip"
    assert by_span([ExportTraceServiceRequest.FromString(gzip.decompress(got["body"]))]) == by_span(
        [encode_spans(spans)]
    )


def test_a_span_neither_encoder_can_encode_is_left_out_alone_and_warned_about_once(caplog):
    # Issue 18 item 15: one span must never fail its batch. A plain SDK span goes to the SDK's
    # encoder, which raises on a name holding a lone surrogate: that span is left out, and only it.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider(resource=Resource({"service.name": "t"})).get_tracer("t")
    spans = []
    for name in ["first", "bad_\udcff", "last", "bad_\udcfe"]:
        span = tracer.start_span(name)
        span.end()
        spans.append(span)
    encoder = OtlpSpanEncoder()
    with caplog.at_level("WARNING", logger="otel_titan"):
        data = encoder.encode(spans)
    request = ExportTraceServiceRequest.FromString(data)
    names = [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert names == ["first", "last"]
    assert (encoder.dropped_spans, encoder.sdk_spans) == (2, 2)
    warnings = [r.getMessage() for r in caplog.records if "could not be encoded" in r.getMessage()]
    assert len(warnings) == 1 and "bad_\\udcff" in warnings[0]  # printable: escaped too


def test_a_resource_value_that_is_not_utf8_is_sent_escaped_not_dropped():
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
    from opentelemetry.sdk.resources import Resource

    from otel_titan.exporters.otlp_encoder import _resource_message

    resource = Resource(
        {"service.name": "t", "deployment.environment": "ci_\udcff", "titan.rank": 3}
    )
    decoded = PbResource.FromString(_resource_message(resource))
    values = {kv.key: kv.value for kv in decoded.attributes}
    assert (
        values["deployment.environment"].string_value == "ci_\\udcff"
        and values["titan.rank"].int_value == 3
    )

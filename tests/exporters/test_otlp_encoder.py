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
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as SdkGrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as SdkHttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext

from otel_titan.core.titan_span import TitanSpan
from otel_titan.exporters.otlp_encoder import OtlpSpanEncoder, encode_varint
from otel_titan.exporters.otlp_grpc import grpc_exporter_class
from otel_titan.exporters.otlp_http import http_exporter_class
from tests.helpers.collector import RotelCollector
from tests.helpers.otlp_receiver import OtlpReceiver
from tests.helpers.span_mix import titan_spans


def _sorted_attributes(repeated: Any) -> None:
    items = sorted((kv.SerializeToString() for kv in repeated))
    del repeated[:]
    for data in items:
        repeated.add().ParseFromString(data)


def by_span(requests: list[ExportTraceServiceRequest]) -> dict[tuple[bytes, bytes], list[tuple[Any, ...]]]:
    """(trace id, span id) → [(resource, resource schema, scope, scope schema, span)] with attributes sorted."""
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
                    out.setdefault(key, []).append((resource, resource_spans.schema_url, scope_spans.scope, scope_spans.schema_url, copy))
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
    assert any(s.parent is not None and not s.parent.is_remote and not s.__dict__ for s in titan)  # the fast path, as a child
    assert any(s.incomplete for s in titan) and any(s.step_tags for s in titan) and any(s.task_name for s in titan)
    assert any(s.extra for s in titan) and any(s.description for s in titan)
    assert len(titan) < len(spans)  # plain SDK spans too


def test_our_bytes_decode_to_exactly_the_sdks_messages(spans):
    encoder = OtlpSpanEncoder()
    ours = ExportTraceServiceRequest.FromString(encoder.encode(spans))
    sdk = encode_spans(spans)
    assert encoder.fast_spans == sum(isinstance(s, TitanSpan) for s in spans) and encoder.sdk_spans == len(spans) - encoder.fast_spans
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
    odd.extra = {"nested": {"a": 1}, "huge": 2**70}  # a map; an integer beyond int64 (the SDK logs and drops it)
    encoder = OtlpSpanEncoder()
    ours = ExportTraceServiceRequest.FromString(encoder.encode([odd, span]))
    assert encoder.sdk_spans == 1 and encoder.fast_spans == 1
    assert by_span([ours]) == by_span([encode_spans([odd, span])])


def test_varint():
    assert [encode_varint(n) for n in (0, 127, 128, 2**64 - 1)] == [b"\x00", b"\x7f", b"\x80\x01", b"\xff" * 9 + b"\x01"]


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
        assert ours.encoder.fast_spans > 0
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
        assert copies[0] == copies[1], f"span {key[1].hex()}: our encoding and the SDK's arrived different"
        assert copies[0][4] == expected[key][0][4], f"span {key[1].hex()} changed on the way"

"""A small OTLP/gRPC trace receiver on loopback, built from grpcio and opentelemetry-proto.

It plays the backend (Jaeger, Tempo) at the end of a real collector: the
tests send a run through `rotel-agent`, which forwards what it receives here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def attributes(key_values: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


@dataclass
class ReceivedSpan:
    """One span as the backend got it, with its Resource."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    status_code: int
    status_message: str
    resource: dict[str, Any]
    scope: str
    raw: Any = field(repr=False, default=None)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Collects every ExportTraceServiceRequest sent to ``127.0.0.1:<port>``."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.requests: list[Any] = []
        #: The gRPC metadata (headers) of each request, in order.
        self.metadata: list[dict[str, str]] = []
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request: Any, context: Any) -> Any:  # the gRPC method name
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            self.requests.append(request)
            self.metadata.append(
                {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
            )
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            requests = list(self.requests)
        out = []
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        out.append(
                            ReceivedSpan(
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex() or None,
                                start_ns=span.start_time_unix_nano,
                                end_ns=span.end_time_unix_nano,
                                attributes=attributes(span.attributes),
                                events=[
                                    (e.name, e.time_unix_nano, attributes(e.attributes))
                                    for e in span.events
                                ],
                                status_code=span.status.code,
                                status_message=span.status.message,
                                resource=resource,
                                scope=scope_spans.scope.name,
                                raw=span,
                            )
                        )
        return out

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """Poll until `predicate(spans)` holds; return the spans (the caller asserts on them)."""
        deadline = time.monotonic() + timeout
        spans = self.spans()
        while not predicate(spans) and time.monotonic() < deadline:
            time.sleep(0.1)
            spans = self.spans()
        return spans

    def stop(self) -> None:
        self._server.stop(grace=None)

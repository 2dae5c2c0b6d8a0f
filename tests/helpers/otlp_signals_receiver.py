"""A small OTLP/gRPC receiver of metrics and logs on loopback (grpcio + opentelemetry-proto).

The metrics and logs counterpart of `otlp_receiver.OtlpReceiver` (traces): it plays
the backend (Mimir, Loki) at the end of a real collector, so the tests see
what a backend would get after the collector forwarded it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

from tests.helpers.otlp_receiver import attributes


@dataclass
class ReceivedPoint:
    """One metric data point as the backend got it, with its Resource."""

    metric: str
    kind: str  # gauge, sum, histogram, exponential_histogram
    attributes: dict[str, Any]
    resource: dict[str, Any]
    value: float | None
    count: int | None
    exemplars: list[Any]
    raw: Any


@dataclass
class ReceivedLog:
    body: Any
    severity: str
    trace_id: str
    span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, owner: OtlpSignalsReceiver) -> None:
        self.owner = owner

    def Export(self, request: Any, context: Any) -> Any:  # the gRPC method name
        with self.owner._lock:
            self.owner.metric_requests.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class _Logs(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, owner: OtlpSignalsReceiver) -> None:
        self.owner = owner

    def Export(self, request: Any, context: Any) -> Any:
        if self.owner.log_delay_s:
            time.sleep(self.owner.log_delay_s)  # a slow collector
        with self.owner._lock:
            self.owner.log_requests.append(request)
        return logs_service_pb2.ExportLogsServiceResponse()


class OtlpSignalsReceiver:
    """Collects every metrics and logs export sent to ``127.0.0.1:<port>``; `log_delay_s`: each logs
    export takes that long."""

    def __init__(self, log_delay_s: float = 0.0) -> None:
        self.log_delay_s = log_delay_s
        self.metric_requests: list[Any] = []
        self.log_requests: list[Any] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(self), self._server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(_Logs(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def points(self) -> list[ReceivedPoint]:
        with self._lock:
            requests = list(self.metric_requests)
        out = []
        for request in requests:
            for resource_metrics in request.resource_metrics:
                resource = attributes(resource_metrics.resource.attributes)
                for scope in resource_metrics.scope_metrics:
                    for metric in scope.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            value = None
                            if kind in ("gauge", "sum"):
                                value = (
                                    point.as_double
                                    if point.WhichOneof("value") == "as_double"
                                    else point.as_int
                                )
                            elif kind in ("histogram", "exponential_histogram"):
                                value = point.sum
                            out.append(
                                ReceivedPoint(
                                    metric=metric.name,
                                    kind=kind,
                                    attributes=attributes(point.attributes),
                                    resource=resource,
                                    value=value,
                                    count=getattr(point, "count", None)
                                    if kind.endswith("histogram")
                                    else None,
                                    exemplars=list(getattr(point, "exemplars", [])),
                                    raw=point,
                                )
                            )
        return out

    def logs(self) -> list[ReceivedLog]:
        with self._lock:
            requests = list(self.log_requests)
        out = []
        for request in requests:
            for resource_logs in request.resource_logs:
                resource = attributes(resource_logs.resource.attributes)
                for scope in resource_logs.scope_logs:
                    for record in scope.log_records:
                        body_kind = record.body.WhichOneof("value")
                        out.append(
                            ReceivedLog(
                                body=getattr(record.body, body_kind) if body_kind else None,
                                severity=record.severity_text,
                                trace_id=record.trace_id.hex(),
                                span_id=record.span_id.hex(),
                                attributes=attributes(record.attributes),
                                resource=resource,
                            )
                        )
        return out

    def wait_for(
        self, predicate: Callable[[OtlpSignalsReceiver], bool], timeout: float = 60.0
    ) -> bool:
        """Poll until `predicate(self)` holds; False on timeout (the caller asserts on what
        arrived)."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def stop(self) -> None:
        self._server.stop(grace=None)

"""A minimal OTLP/gRPC trace and metrics receiver that acknowledges and counts, for the benchmarks.

    python -m benchmarks.otlp_sink PORT_FILE

Writes its port to PORT_FILE, serves until killed. It runs in its own process
so its CPU is not charged to the process being measured.
"""

from __future__ import annotations

import sys
import time
from concurrent import futures

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests = 0

    def Export(self, request, context):  # the gRPC method name
        self.requests += 1
        return trace_service_pb2.ExportTraceServiceResponse()


class MetricsSink(metrics_service_pb2_grpc.MetricsServiceServicer):
    def Export(self, request, context):  # the gRPC method name
        return metrics_service_pb2.ExportMetricsServiceResponse()


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Sink(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsSink(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(sys.argv[1], "w") as handle:
        handle.write(str(port))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()

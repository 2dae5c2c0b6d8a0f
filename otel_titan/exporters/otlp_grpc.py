"""The SDK's OTLP/gRPC span exporter, with otel-titan's encoder in place of ``encode_spans``.

Everything but the encoding is the standard exporter's: endpoint, TLS,
headers, compression, timeout and retries from ``OTEL_EXPORTER_OTLP_*`` (or
the constructor's arguments), channel re-creation on UNAVAILABLE, the
exporter's own metrics. Only two hooks change: `_translate_data` returns the
request's bytes from `OtlpSpanEncoder`, and the stub sends those bytes as they
are (a gRPC method without a request serializer) instead of serializing a
message. Imported only when the gRPC protocol is chosen (grpc is heavy).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_titan.exporters.otlp_encoder import OtlpSpanEncoder

__all__ = ["grpc_exporter_class"]

_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


@functools.cache
def grpc_exporter_class() -> type:
    """``TitanGrpcSpanExporter``: the SDK's gRPC ``OTLPSpanExporter`` encoding with
    `OtlpSpanEncoder`.

    Built on first use, so that importing otel-titan never loads grpc. It
    takes the same arguments and reads the same variables as the SDK's exporter.

    Example:
        >>> exporter = grpc_exporter_class()(endpoint="localhost:4317", insecure=True)
        >>> exporter.shutdown()
    """
    # grpc is heavy
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter,
    )
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    class _BytesTraceServiceStub:
        """``TraceServiceStub`` whose ``Export`` takes an already serialized request."""

        def __init__(self, channel: Any) -> None:
            # the gRPC method name
            self.Export = channel.unary_unary(
                _EXPORT_METHOD,
                request_serializer=None,
                response_deserializer=ExportTraceServiceResponse.FromString,
            )

    class TitanGrpcSpanExporter(OTLPSpanExporter):
        """The SDK's OTLP/gRPC span exporter with `OtlpSpanEncoder` as its encoding step."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.encoder = OtlpSpanEncoder()
            self._last: tuple[Any, bytes] | None = None
            super().__init__(*args, **kwargs)

        def _initialize_channel_and_stub(self) -> None:
            # Called by the SDK at start and again to reconnect after UNAVAILABLE.
            super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]  # the SDK's own, unannotated
            self._client = _BytesTraceServiceStub(self._channel)  # type: ignore[assignment]  # bytes in, as the SDK's stub

        def _translate_data(self, data: Sequence[ReadableSpan]) -> bytes:  # type: ignore[override]  # bytes out: the encoding step the SDK calls, replaced
            # The SDK calls this once per attempt; a retried batch is encoded once.
            last = self._last
            if last is not None and last[0] is data:
                return last[1]
            encoded = self.encoder.encode(data)
            self._last = (data, encoded)
            return encoded

        def export(self, spans: Sequence[ReadableSpan]) -> Any:
            try:
                return super().export(spans)
            finally:
                self._last = None

    return TitanGrpcSpanExporter

"""The SDK's OTLP/HTTP (protobuf) span exporter, with otel-titan's encoder in place of
``encode_spans``.

Endpoint, headers, TLS, compression, timeout, retries and the request size
limit are the standard exporter's, from ``OTEL_EXPORTER_OTLP_*`` or the
constructor's arguments: its HTTP client gets the bytes from `OtlpSpanEncoder`
exactly where it would get ``encode_spans(spans).SerializePartialToString()``.
The SDK has no separate encoding hook for HTTP, so `export` repeats its
(short) body with that one call changed; if the installed SDK's internals
differ from the ones this was written against (checked when the class is
built), the SDK's own `export` runs instead, unchanged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_titan.exporters.otlp_encoder import OtlpSpanEncoder

__all__ = ["http_exporter_class"]

_logger = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")


@functools.cache
def http_exporter_class() -> type:
    """``TitanHttpSpanExporter``: the SDK's HTTP ``OTLPSpanExporter`` encoding with
    `OtlpSpanEncoder`.

    Built on first use (the HTTP exporter loads requests). It takes the same
    arguments and reads the same variables as the SDK's exporter.

    Example:
        >>> exporter = http_exporter_class()(endpoint="http://localhost:4318/v1/traces")
        >>> exporter.shutdown()
    """
    from opentelemetry.exporter.otlp.proto.http import trace_exporter as sdk_http

    too_large = getattr(sdk_http, "_is_request_too_large", None)
    too_large_error = getattr(sdk_http, "RequestPayloadTooLargeError", None)
    status_code_attr = getattr(sdk_http, "HTTP_RESPONSE_STATUS_CODE", None)

    class TitanHttpSpanExporter(sdk_http.OTLPSpanExporter):
        """The SDK's OTLP/HTTP span exporter with `OtlpSpanEncoder` as its encoding step."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.encoder = OtlpSpanEncoder()
            self._fast = None not in (too_large, too_large_error, status_code_attr) and all(
                hasattr(self, name)
                for name in ("_shutdown", "_metrics", "_client", "_max_request_size")
            )

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            """The SDK's `export`, with `OtlpSpanEncoder` producing the request body."""
            if not self._fast:
                return super().export(spans)
            if self._shutdown:
                _logger.warning("Exporter already shutdown, ignoring batch")
                return SpanExportResult.FAILURE
            with self._metrics.export_operation(len(spans)) as result:
                try:
                    serialized_data = self.encoder.encode(spans)
                except Exception as error:  # noqa: BLE001 - as the SDK: a batch that cannot be encoded fails, training goes on
                    _logger.error("Failed to encode span batch: %s", error)
                    result.error = error
                    return SpanExportResult.FAILURE
                if too_large(serialized_data, self._max_request_size):  # type: ignore[misc]  # an SDK helper looked up with getattr: present in the versions that send this
                    _logger.warning(
                        "Dropping span batch: serialized size %d bytes exceeds max_request_size "
                        "%d bytes.",
                        len(serialized_data),
                        self._max_request_size,
                    )
                    result.error = too_large_error(  # type: ignore[misc]  # an SDK class looked up with getattr: present in the versions that send this
                        f"Serialized span request size {len(serialized_data)} bytes exceeds "
                        f"max_request_size {self._max_request_size} bytes."
                    )
                    return SpanExportResult.FAILURE
                export_result = self._client.export(serialized_data)
                if not export_result.success:
                    result.error = export_result.error
                    result.error_attrs = (
                        {status_code_attr: export_result.status_code}  # type: ignore[dict-item]  # the SDK's attribute name (a str where it has one)
                        if export_result.status_code is not None
                        else None
                    )
                    return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

    return TitanHttpSpanExporter

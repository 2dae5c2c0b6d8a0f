"""The OTLP/gRPC endpoint of `otel-titan watch --otlp-grpc HOST:PORT`: ``LogsService/Export`` into a
`Spool`.

For ranks (or a collector) that speak OTLP over gRPC only
(``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``, the collectors' :4317). The same
decoding and spool as the HTTP endpoint (`http_server`): the request's bytes
go to `decode.decode_logs` as they arrived (no message object is built for
them here), our records to the spool, and the answer, an empty
``ExportLogsServiceResponse``, once they are written. ``TraceService`` and
``MetricsService`` are answered too (counted), so a rank exporting every
signal to one endpoint gets no errors. grpcio is imported when the endpoint
starts (it comes with ``opentelemetry-exporter-otlp-proto-grpc``); the HTTP
endpoint needs nothing but the standard library.
"""

from __future__ import annotations

import errno
from concurrent import futures
from typing import Any

from otel_titan.receive.decode import DecodeError, RecordTooLong
from otel_titan.receive.http_server import OtlpHttpReceiver, ReceiverError, _authorized
from otel_titan.receive.spool import Spool, SpoolWriteError

__all__ = ["OtlpGrpcReceiver"]

_SERVICES = {
    "logs": "opentelemetry.proto.collector.logs.v1.LogsService",
    "traces": "opentelemetry.proto.collector.trace.v1.TraceService",
    "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService",
}


class OtlpGrpcReceiver(OtlpHttpReceiver):
    """An OTLP/gRPC receiver writing our records to `spool`; the same counters, `facts`, `start` and
    `stop` as the HTTP one.

    Example:
        >>> import tempfile
        >>> receiver = OtlpGrpcReceiver("127.0.0.1", 0, Spool(tempfile.mkdtemp())).start()
        >>> receiver.endpoint.startswith("http://127.0.0.1:"), receiver.protocol
        (True, 'grpc')
        >>> receiver.stop()
    """

    protocol = "grpc"

    def __init__(
        self,
        host: str,
        port: int,
        spool: Spool,
        *,
        tls_files: tuple[str, str | None] | None = None,
        **kwargs: Any,
    ) -> None:
        """`tls_files`: (certificate, key) PEM files for TLS (grpcio takes the files' bytes, not an
        `ssl` context); else as `OtlpHttpReceiver`."""
        super().__init__(host, port, spool, **kwargs)
        self.tls_files = tls_files
        self._grpc: Any = None

    @property
    def endpoint(self) -> str:
        """As `OtlpHttpReceiver.endpoint`: ``https://`` when TLS."""
        plain = super().endpoint
        return plain.replace("http://", "https://", 1) if self.tls_files else plain

    def start(self) -> OtlpGrpcReceiver:
        """Listen and serve (a pool of 16 threads: requests are short, the spool takes one at a
        time)."""
        try:
            import grpc  # heavy, and only this endpoint needs it
        except ImportError:
            raise ReceiverError(
                errno.ENOPROTOOPT,
                "OTLP/gRPC needs grpcio (pip install grpcio), or use --otlp (OTLP/HTTP)",
            ) from None

        def handler(kind: str) -> Any:
            def export(request: bytes, context: Any) -> bytes:
                if self.token is not None and not _authorized(
                    dict(context.invocation_metadata()).get("authorization"), self.token
                ):
                    self.count(unauthorized=1)
                    context.abort(
                        grpc.StatusCode.UNAUTHENTICATED,
                        "a bearer token is required (authorization: Bearer ...; the ranks' "
                        "OTEL_EXPORTER_OTLP_HEADERS)",
                    )
                try:
                    self.take(kind, request)
                except (DecodeError, RecordTooLong) as error:
                    self.count(refused=1)
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
                except SpoolWriteError as error:
                    self.count(write_failed=1)
                    # retried by OTLP exporters, as HTTP's 503
                    context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
                return b""  # the empty Export*ServiceResponse: full success

            return grpc.method_handlers_generic_handler(
                _SERVICES[kind], {"Export": grpc.unary_unary_rpc_method_handler(export)}
            )

        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=16, thread_name_prefix="otel-titan-receive-grpc"
            ),
            options=[
                ("grpc.max_receive_message_length", self.limits.max_body),
                ("grpc.so_reuseport", 0),
            ],
        )
        server.add_generic_rpc_handlers([handler(kind) for kind in _SERVICES])
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            port = (
                server.add_secure_port(address, self._credentials(grpc))
                if self.tls_files
                else server.add_insecure_port(address)
            )
        except RuntimeError:
            port = 0
        if not port and self.port:
            raise ReceiverError(
                errno.EADDRINUSE,
                f"cannot listen on {self.host}:{self.port}: the port is in use, or the address is "
                "not one of this machine's",
            )
        if not port:
            raise ReceiverError(
                errno.EADDRNOTAVAIL,
                f"cannot listen on {self.host}:{self.port}: the address is not one of this "
                "machine's",
            )
        self.port = port
        server.start()
        self._grpc = server
        self._start_tick()
        return self

    def _credentials(self, grpc: Any) -> Any:
        cert_file, key_file = self.tls_files  # type: ignore[misc]  # called only when TLS files were given
        with open(cert_file, "rb") as cert, open(key_file or cert_file, "rb") as key:
            return grpc.ssl_server_credentials([(key.read(), cert.read())])

    def stop(self) -> None:
        """Stop listening (requests in flight get 1 s); what was held past a gap is written."""
        if self._grpc is not None:
            self._grpc.stop(1.0).wait(5)
        super().stop()

"""``OTEL_METRICS_EXPORTER`` → the OpenTelemetry metric readers of this process.

The standard variables, read as an OpenTelemetry user expects:

* ``OTEL_METRICS_EXPORTER``: a comma-separated list of ``otlp``, ``prometheus``,
  ``console`` or ``none``. Unset means ``none`` here, as for traces
  (`otel_env`): a job that pushes to ``localhost:4318`` without being asked
  would only log connection errors.
* ``otlp``: the SDK's OTLP metric exporter over ``http/protobuf`` (default) or
  ``grpc`` (``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL``, then
  ``OTEL_EXPORTER_OTLP_PROTOCOL``), behind a `PeriodicExportingMetricReader`
  (``OTEL_METRIC_EXPORT_INTERVAL``, 60 s by default; ``OTEL_METRIC_EXPORT_TIMEOUT``).
  Endpoint, headers, certificates, compression, temporality
  (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``) and the histogram
  aggregation (``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram``
  for exponential histograms) are read by that exporter itself, untouched.
  The path at scale: one push per rank per interval, no scrape list to keep.
* ``prometheus``: a pull endpoint (``opentelemetry-exporter-prometheus``) on
  ``OTEL_EXPORTER_PROMETHEUS_HOST`` (``localhost``) and port
  ``OTEL_EXPORTER_PROMETHEUS_PORT`` (9464) **plus the local rank**, so the ranks
  of one host do not collide. For small jobs: Prometheus must know every
  target. Its registry is private to the logger (a second logger in the same
  process does not clash with the first).
* ``console``: the SDK's console exporter, periodically, for a quick look.

A bad value raises `ValueError` naming the variable (init fails before training
starts, as for every other option).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, MetricExportResult, MetricReader, PeriodicExportingMetricReader

from otel_titan.distribution import install_hint

__all__ = ["metrics_exporters", "metrics_protocol", "prometheus_address", "build_readers", "Readers", "ForkSafeMetricExporter", "METRICS_EXPORTER_ENV"]

_log = logging.getLogger("otel_titan")

METRICS_EXPORTER_ENV = "OTEL_METRICS_EXPORTER"
_NAMES = ("otlp", "prometheus", "console")
_PROTOCOLS = ("http/protobuf", "grpc")


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def metrics_exporters(environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporter names in ``OTEL_METRICS_EXPORTER`` (``none`` removed, duplicates once).

    Example:
        >>> metrics_exporters({"OTEL_METRICS_EXPORTER": "otlp, prometheus,otlp"})
        ['otlp', 'prometheus']
        >>> metrics_exporters({})
        []
        >>> metrics_exporters({"OTEL_METRICS_EXPORTER": "statsd"})
        Traceback (most recent call last):
        ...
        ValueError: OTEL_METRICS_EXPORTER='statsd': unsupported exporter 'statsd' (supported: otlp, prometheus, console, none)
    """
    raw = _env(environ).get(METRICS_EXPORTER_ENV, "")
    out: list[str] = []
    for name in (part.strip().lower() for part in raw.split(",")):
        if not name or name == "none":
            continue
        if name not in _NAMES:
            raise ValueError(f"{METRICS_EXPORTER_ENV}={raw!r}: unsupported exporter {name!r} (supported: otlp, prometheus, console, none)")
        if name not in out:
            out.append(name)
    return out


def metrics_protocol(environ: Mapping[str, str] | None = None) -> str:
    """The OTLP transport for metrics: ``http/protobuf`` (default) or ``grpc``.

    Example:
        >>> metrics_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
        'grpc'
        >>> metrics_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"})
        'http/protobuf'
    """
    env = _env(environ)
    for name in ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(name, "").strip().lower()
        if value:
            if value not in _PROTOCOLS:
                raise ValueError(f"{name}={value!r} is not supported for metrics (use one of: {', '.join(_PROTOCOLS)})")
            return value
    return "http/protobuf"


def prometheus_address(local_rank: int | None, environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(host, port) of this rank's scrape endpoint: the configured port plus the local rank.

    Example:
        >>> prometheus_address(3, {"OTEL_EXPORTER_PROMETHEUS_PORT": "9000"})
        ('localhost', 9003)
    """
    env = _env(environ)
    raw = env.get("OTEL_EXPORTER_PROMETHEUS_PORT", "").strip() or "9464"
    try:
        base = int(raw)
    except ValueError:
        raise ValueError(f"OTEL_EXPORTER_PROMETHEUS_PORT={raw!r} is not a port number") from None
    if not 1 <= base <= 65535:
        raise ValueError(f"OTEL_EXPORTER_PROMETHEUS_PORT={raw!r} is not a port number (1-65535)")
    port = base + (local_rank or 0)
    if port > 65535:
        raise ValueError(f"OTEL_EXPORTER_PROMETHEUS_PORT={raw!r} plus local rank {local_rank} is past 65535")
    return env.get("OTEL_EXPORTER_PROMETHEUS_HOST", "").strip() or "localhost", port


@dataclass
class Readers:
    """The readers to give the `MeterProvider`, and what must be stopped with them (the scrape server)."""

    readers: list[MetricReader] = field(default_factory=list)
    #: ``(host, port)`` of the Prometheus endpoint when one was started.
    prometheus: tuple[str, int] | None = None
    _server: Any = None

    def close(self) -> None:
        """Stop the scrape endpoint (the readers are shut down by their provider)."""
        server, self._server = self._server, None
        if server is not None:
            try:
                server.shutdown()
                server.server_close()
            except Exception:  # noqa: BLE001 - closing at exit: nothing to recover
                pass


class ForkSafeMetricExporter(MetricExporter):
    """Delegate to `inner` in the process that made it; export nothing from a forked child.

    The SDK's periodic reader restarts its thread in a forked child (a
    DataLoader worker, say), which would then push the parent's inherited
    figures under the parent's ``service.instance.id``: duplicate series that
    contradict the parent's. The child has no logger of its own running, so
    there is nothing true to send.
    """

    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(preferred_temporality=inner._preferred_temporality, preferred_aggregation=inner._preferred_aggregation)
        self.inner = inner
        self._pid = os.getpid()

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        if os.getpid() != self._pid:
            return MetricExportResult.SUCCESS
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return os.getpid() != self._pid or self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if os.getpid() == self._pid:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _otlp_exporter(environ: Mapping[str, str]) -> Any:
    if metrics_protocol(environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


def build_readers(names: list[str], local_rank: int | None, environ: Mapping[str, str] | None = None) -> Readers:
    """One reader per name. A Prometheus port already taken is logged and left out (never fatal).

    Raises ``ValueError`` for a bad variable and ``ImportError`` when the
    Prometheus exporter is not installed (the ``metrics`` extra; the message says how to install it).
    """
    env = _env(environ)
    out = Readers()
    for name in names:
        if name == "otlp":
            out.readers.append(PeriodicExportingMetricReader(ForkSafeMetricExporter(_otlp_exporter(env))))
        elif name == "console":
            out.readers.append(PeriodicExportingMetricReader(ForkSafeMetricExporter(ConsoleMetricExporter())))
        elif name == "prometheus":
            host, port = prometheus_address(local_rank, env)
            try:
                import prometheus_client
                from opentelemetry.exporter.prometheus import PrometheusMetricReader
            except ImportError as error:
                raise ImportError(f"OTEL_METRICS_EXPORTER=prometheus needs opentelemetry-exporter-prometheus ({install_hint('metrics')}): {error}") from error
            registry = prometheus_client.CollectorRegistry(auto_describe=True)
            try:
                server, _thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
            except OSError as error:
                _log.warning("otel-titan: the Prometheus endpoint %s:%d cannot listen (%s); this rank exports no Prometheus metrics", host, port, error)
                continue
            out._server, out.prometheus = server, (host, port)
            out.readers.append(PrometheusMetricReader(registry=registry))
    return out

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
  Endpoint, headers, certificates, compression and temporality
  (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``) are read by that
  exporter itself, untouched. Histograms go as base-2 exponential histograms
  unless ``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`` says
  otherwise (`otlp_histogram_preference`).
  The path at scale: one push per rank per interval, no scrape list to keep.
* ``prometheus``: a pull endpoint (``opentelemetry-exporter-prometheus``) on
  ``OTEL_EXPORTER_PROMETHEUS_HOST`` (``localhost``) and port
  ``OTEL_EXPORTER_PROMETHEUS_PORT`` (9464) **plus the local rank**, so the ranks
  of one host do not collide. A port already taken (a second job on the host,
  a process that outlived its rank) is said once, and the next one of this
  rank's own sequence (plus ``LOCAL_WORLD_SIZE``, so ranks never take each
  other's) is used, up to 32 tries; the JSONL opening record's
  ``metrics_endpoint`` says which. A forked child closes its copy of the
  listening socket (`Readers.close_after_fork`): a DataLoader worker that
  outlives its rank must not keep the port. For small jobs: Prometheus must
  know every target. Its registry is private to the logger (a second logger
  in the same process does not clash with the first).
* ``console``: the SDK's console exporter, periodically, for a quick look.

An unknown value of a standard variable is warned about once and ignored, as
the specification asks (`otel_env.ignored_value`): init never fails over one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    PeriodicExportingMetricReader,
)

from otel_titan.distribution import install_hint
from otel_titan.exporters.otel_env import exporter_names, ignored_value, signal_protocol

__all__ = [
    "metrics_exporters",
    "metrics_protocol",
    "prometheus_address",
    "build_readers",
    "Readers",
    "ForkSafeMetricExporter",
    "METRICS_EXPORTER_ENV",
    "otlp_histogram_preference",
]

_log = logging.getLogger("otel_titan")

METRICS_EXPORTER_ENV = "OTEL_METRICS_EXPORTER"
_NAMES = ("otlp", "prometheus", "console")


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def metrics_exporters(environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporter names in ``OTEL_METRICS_EXPORTER`` (``none`` removed, duplicates once; unknown
    ones warned about and ignored).

    Example:
        >>> metrics_exporters({"OTEL_METRICS_EXPORTER": "otlp, prometheus,otlp"})
        ['otlp', 'prometheus']
        >>> metrics_exporters({})
        []
        >>> metrics_exporters({"OTEL_METRICS_EXPORTER": "statsd,otlp"})
        ['otlp']
    """
    return exporter_names(METRICS_EXPORTER_ENV, _NAMES, environ)


def metrics_protocol(environ: Mapping[str, str] | None = None) -> str:
    """The OTLP transport for metrics: ``http/protobuf`` (default) or ``grpc``.

    Example:
        >>> metrics_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
        'grpc'
        >>> metrics_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"})
        'http/protobuf'
    """
    return signal_protocol("METRICS", environ)


def prometheus_address(
    local_rank: int | None, environ: Mapping[str, str] | None = None
) -> tuple[str, int]:
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
        base = 0
    if not 1 <= base <= 65535 - (local_rank or 0):
        ignored_value(
            "OTEL_EXPORTER_PROMETHEUS_PORT",
            raw,
            f"not a port number (1-65535, plus the local rank {local_rank or 0}): 9464 is used",
        )
        base = 9464
    return env.get("OTEL_EXPORTER_PROMETHEUS_HOST", "").strip() or "localhost", base + (
        local_rank or 0
    )


@dataclass
class Readers:
    """The readers to give the `MeterProvider`, and what must be stopped with them (the scrape
    server)."""

    readers: list[MetricReader] = field(default_factory=list)
    #: ``(host, port)`` of the Prometheus endpoint when one was started.
    prometheus: tuple[str, int] | None = None
    _server: Any = None

    def close_after_fork(self) -> None:
        """In a forked child: close the inherited listening socket (the serving thread is the
        parent's, not here)."""
        server, self._server = self._server, None
        if server is not None:
            try:
                server.socket.close()
            except Exception:  # noqa: BLE001 - nothing to recover in a child
                pass

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
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self.inner = inner
        self._pid = os.getpid()

    def export(
        self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if os.getpid() != self._pid:
            return MetricExportResult.SUCCESS
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return os.getpid() != self._pid or self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if os.getpid() == self._pid:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


HISTOGRAM_AGGREGATION_ENV = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"


def otlp_histogram_preference(environ: Mapping[str, str] | None = None) -> dict[type, Any] | None:
    """The OTLP reader's histogram aggregation: base-2 exponential unless the standard variable says
    otherwise.

    Exponential histograms (160 buckets whose scale follows the data) resolve a
    +20 % straggler at any duration, where fixed buckets need to be fine
    exactly where the data falls. The specification's default is explicit
    buckets; a backend that cannot take exponential histograms is told so with
    ``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=explicit_bucket_histogram``
    (then the SDK's exporter reads the variable itself, and `None` is returned).

    Example:
        >>> [type(a).__name__ for a in otlp_histogram_preference({}).values()]
        ['ExponentialBucketHistogramAggregation']
        >>> otlp_histogram_preference({"OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "explicit_bucket_histogram"}) is None
        True
    """
    if _env(environ).get(HISTOGRAM_AGGREGATION_ENV, "").strip():
        return None
    from opentelemetry.sdk.metrics import Histogram
    from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation

    return {Histogram: ExponentialBucketHistogramAggregation()}


def _local_world_size(environ: Mapping[str, str]) -> int:
    """torchrun's ``LOCAL_WORLD_SIZE`` (ranks on this host), else 1: the stride between one rank's
    fallback ports."""
    try:
        return max(1, int(environ.get("LOCAL_WORLD_SIZE", "") or 1))
    except ValueError:
        return 1


def _otlp_exporter(environ: Mapping[str, str]) -> Any:
    if metrics_protocol(environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter  # type: ignore[assignment]  # either protocol's
    return OTLPMetricExporter(preferred_aggregation=otlp_histogram_preference(environ))


PORT_TRIES = 32


def _prometheus_reader(reader_class: Any, prometheus_client: Any, registry: Any) -> Any:
    """A PrometheusMetricReader whose collector is in the logger's own `registry` (served by
    `_listen`'s server).

    Newer exporters take ``registry=``; older ones (down to the declared minimum, 0.61b0) register
    its collector in prometheus_client's global REGISTRY, which is moved into ours here, so every
    supported version serves the same series.
    """
    try:
        return reader_class(registry=registry)
    except TypeError:
        reader = reader_class()
        collector = getattr(reader, "_collector", None)
        if collector is not None:
            prometheus_client.REGISTRY.unregister(collector)
            registry.register(collector)
        return reader


def _listen(
    prometheus_client: Any, host: str, port: int, step: int, registry: Any
) -> tuple[Any, int]:
    """Start the scrape server on `port`, else the next free one of ``port + k * step``; raises the
    first OSError when none is."""
    first: OSError | None = None
    for attempt in range(PORT_TRIES):
        candidate = port + attempt * step
        if candidate > 65535:
            break
        try:
            server, _thread = prometheus_client.start_http_server(
                candidate, addr=host, registry=registry
            )
        except OSError as error:
            first = first or error
            continue
        if attempt:
            _log.warning(
                "otel-titan: the Prometheus port %s:%d cannot listen (%s: another job on this "
                "host, or a process that outlived its rank?); "
                "serving on %d instead (the JSONL opening record's metrics_endpoint says so): add "
                "it to Prometheus's targets",
                host,
                port,
                first,
                candidate,
            )
        return server, candidate
    assert first is not None
    raise first


def build_readers(
    names: list[str], local_rank: int | None, environ: Mapping[str, str] | None = None
) -> Readers:
    """One reader per name. A Prometheus port already taken moves to the next free one (`_listen`);
    none free is logged and left out (never fatal).

    Raises ``ValueError`` for a bad variable and ``ImportError`` when the Prometheus exporter is not
    installed (the ``metrics`` extra; the message says how to install it).
    """
    env = _env(environ)
    out = Readers()
    for name in names:
        if name == "otlp":
            out.readers.append(
                PeriodicExportingMetricReader(ForkSafeMetricExporter(_otlp_exporter(env)))
            )
        elif name == "console":
            out.readers.append(
                PeriodicExportingMetricReader(ForkSafeMetricExporter(ConsoleMetricExporter()))
            )
        elif name == "prometheus":
            host, port = prometheus_address(local_rank, env)
            try:
                import prometheus_client
                from opentelemetry.exporter.prometheus import PrometheusMetricReader
            except ImportError as error:
                raise ImportError(
                    "OTEL_METRICS_EXPORTER=prometheus needs opentelemetry-exporter-prometheus "
                    f"({install_hint('metrics')}): {error}"
                ) from error
            registry = prometheus_client.CollectorRegistry(auto_describe=True)
            step = _local_world_size(env)
            try:
                server, port = _listen(prometheus_client, host, port, step, registry)
            except OSError as error:
                _log.warning(
                    "otel-titan: the Prometheus endpoint %s:%d cannot listen (%s), nor the next "
                    "%d ports of this rank; this rank exports no Prometheus metrics",
                    host,
                    port,
                    error,
                    PORT_TRIES - 1,
                )
                continue
            out._server, out.prometheus = server, (host, port)
            out.readers.append(
                _prometheus_reader(PrometheusMetricReader, prometheus_client, registry)
            )
    return out

"""Scalars and phase times as OpenTelemetry metrics, recorded on otel-titan's background thread.

Selected with the standard variables (`metric_readers`)::

    OTEL_METRICS_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 torchrun ...
    train.py

`MetricsSpanExporter` is one more exporter of the processor: it receives the
finished spans, scalars and instants on the processor thread, like OTLP, so
the training thread still only appends to its queue. What it records into the
OpenTelemetry metrics SDK (names as Prometheus shows them in docs/metrics.md):

* every ``log_trace_scalar`` name as a **gauge** of the same name (the last
  value in each export interval; ``train/loss`` becomes ``train_loss`` in
  Prometheus). A NaN or infinite value is exported as it is (the SDK's
  ``Gauge.set`` would discard it) and counted in ``titan.scalar.nonfinite``
  (attribute ``titan.scalar.name``);
* the logger's own per-step figures under the semantic conventions' names
  and units (`SEMCONV_FIGURES`): ``process.memory.usage`` (By),
  ``process.cpu.time`` (s, a counter, ``cpu.mode`` user or system),
  ``process.thread.count``, and ``titan.…`` names where the conventions have none;
* every span's duration in seconds in a **histogram** with attribute
  ``titan.span.name``: ``titan.span.duration`` with buckets
  (`DURATION_BUCKETS_S`: at most 19 % wide from 8 ms to 131 s; over OTLP
  base-2 exponential, metric_readers.py) for the span names of the per-rank
  allowlist, else ``titan.span.duration.summary`` without buckets (its sum
  and count: the mean per rank, host or job, at 3 series per name instead of 66);
* ``titan.step.duration`` (histogram, s, always bucketed: the step time is
  the series a straggler dashboard needs per rank): from the first span
  start of one step to the first of the next, as this thread sees them;
* ``titan.step`` (gauge: the latest step) and ``titan.steps.completed``
  (counter); the logger's own health as ``titan.logger.records`` (counter,
  attribute ``outcome``: written, dropped, skipped, failed) and
  ``titan.metrics.overflow`` (names past the cap);
* on local rank 0 only, the host's figures (host_metrics.py: CPU, memory,
  network, disk, pressure, cgroup throttling, GPUs through NVML), unless
  ``OTEL_TITAN_HOST_METRICS=0``; the same pressure and throttling figures
  written as step scalars (``host/…``) are then not also gauges of their own.

Cardinality, by design: the step, a step tag or a span id is never an
attribute (a new series per step would be a new series per minute for days);
the rank, host and run are the Resource (one set per process), so the series
per process are bounded by the names alone. The allowlist
(``OTEL_TITAN_METRICS_PER_RANK``, comma-separated `fnmatch` patterns; default
``step,train_step,training_step``) decides which phases get buckets: at 1,024
ranks × 30 phases × 66 series, bucketed histograms for every phase would be
2 million series. At most ``OTEL_TITAN_METRICS_MAX_NAMES`` (1,000) distinct
scalar names of the user's and as many span names are recorded, and one
prefix (`name_prefix`: the per-parameter grad norms) takes at most half of
them, so the first names of every family survive; the logger's own figures
(``memory/…``, ``process/…``, ``host/…``) are always kept. Past that, scalars
are dropped and span times go to the name ``_overflow``, counted in
``titan.metrics.overflow`` by ``kind`` and ``titan.metric.prefix`` (at most
100 prefixes named, then ``_other``), warned about once for the cap and once
per prefix (the SDK's own limit, 2,000 attribute sets per instrument, is
never reached; past it the SDK would fold the rest into one
``otel.metric.overflow=true`` series).

Exemplars: each bucketed duration is recorded in the context of its span, so the
SDK's trace-based exemplar filter (``OTEL_METRICS_EXEMPLAR_FILTER``) attaches
the span's trace and span id to its bucket (OTLP carries them; the
Prometheus text format does not).
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_titan._version import __version__
from otel_titan.core import host_figures, process_figures
from otel_titan.core.exporter import (
    DeliveryCounted,
    HandlerSkipped,
    PipelineStats,
    TitanSpanExporter,
    delivery_losses,
)
from otel_titan.core.warn_once import WarnOnce
from otel_titan.environment_variables import (
    OTEL_TITAN_HOST_METRICS,
    OTEL_TITAN_METRICS_MAX_NAMES,
    OTEL_TITAN_METRICS_PER_RANK,
    flag,
)
from otel_titan.exporters.host_metrics import HostMetrics
from otel_titan.exporters.metric_readers import Readers, build_readers, metrics_exporters
from otel_titan.exporters.otel_env import sdk_disabled
from otel_titan.exporters.otlp import quiet_exporter_logs
from otel_titan.schema import Field, RecordKind

try:  # the SDK's measurement, to export a NaN gauge value as it is (`MetricsSpanExporter._set_nonfinite`)
    from opentelemetry.sdk.metrics._internal.measurement import Measurement as _Measurement
except ImportError:  # pragma: no cover - another SDK layout: non-finite values are only counted
    _Measurement = None  # type: ignore[assignment,misc]  # another SDK layout: None marks it absent

__all__ = [
    "MetricsSpanExporter",
    "register_metrics_handler",
    "metrics_exporter_handler_specs",
    "instrument_name",
    "summary_views",
    "DURATION_BUCKETS_S",
    "SEMCONV_FIGURES",
    "METRICS_HANDLER",
]

_log = logging.getLogger("otel_titan")

METRICS_HANDLER = "otel_titan.exporters.metrics.register_metrics_handler"
DEFAULT_PER_RANK = ("step", "train_step", "training_step")
DEFAULT_MAX_NAMES = 1000


def _duration_buckets_s() -> tuple[float, ...]:
    # Four buckets per doubling (each 2^(1/4), 18.9 % wide) from 8 ms to 131 s, where training
    # phases and steps live: a +20 % straggler moves its p50 and p99 by about a bucket, which
    # histogram_quantile resolves. 1-2-5 buckets per decade (2 to 2.5x wide) could not: 60 ms
    # and 87 ms fell into one bucket. Coarse below and above, for the rare phase out there.
    fine = [round(2 ** (k / 4) / 1000, 6 if k < 40 else 3) for k in range(12, 69)]
    return (0.001, 0.002, 0.004, *fine, 300.0, 600.0, 1800.0)


#: Explicit bucket boundaries (seconds, the semantic conventions' unit for durations): 63
#: boundaries, 64 buckets; ≤ 19 % wide from 8 ms to 131 s (Prometheus and explicit-bucket OTLP). The
#: OTLP reader prefers exponential histograms (metric_readers.py), which need none.
DURATION_BUCKETS_S = _duration_buckets_s()
#: The logger's own per-step process figures, exported under the semantic conventions' names and
#: units (docs/metrics.md): name → (instrument, unit, attributes). ``process.cpu.time`` is a counter
#: (cumulative).
SEMCONV_FIGURES: dict[str, tuple[str, str, dict[str, str]]] = {
    "memory/rss_bytes": ("process.memory.usage", "By", {}),
    "memory/rss_peak_bytes": ("titan.process.memory.peak", "By", {}),
    "process/threads": ("process.thread.count", "{thread}", {}),
    "process/cpu_user_s": ("process.cpu.time", "s", {"cpu.mode": "user"}),
    "process/cpu_system_s": ("process.cpu.time", "s", {"cpu.mode": "system"}),
    "memory/cuda_allocated_bytes": ("titan.gpu.memory.allocated", "By", {}),
    "memory/cuda_reserved_bytes": ("titan.gpu.memory.reserved", "By", {}),
    "memory/cuda_peak_allocated_bytes": ("titan.gpu.memory.peak_allocated", "By", {}),
    "memory/cuda_peak_reserved_bytes": ("titan.gpu.memory.peak_reserved", "By", {}),
    "memory/cuda_step_peak_allocated_bytes": ("titan.gpu.memory.step_peak_allocated", "By", {}),
}
OVERFLOW_NAME = "_overflow"
#: At most this many prefixes are named in ``titan.metrics.overflow``; the rest count under
#: ``_other``.
MAX_OVERFLOW_PREFIXES = 100
#: The logger's own per-step figures: never dropped by the name cap, never counted against it.
OWN_FIGURES = process_figures.FIGURE_NAMES | host_figures.FIGURE_NAMES
_INVALID = re.compile(r"[^A-Za-z0-9_./-]")
#: What a name becomes in Prometheus (runs of anything but letters, digits and ``:`` as one ``_``),
#: lowercased: OpenTelemetry instrument names are case-insensitive, so ``Loss`` and ``loss`` are one
#: instrument to the SDK.
_EXPOSED = re.compile(r"[^a-z0-9:]+")
_SPAN, _SCALAR = RecordKind.SPAN, RecordKind.SCALAR


def metrics_exporter_handler_specs(environ: Mapping[str, str] | None = None) -> list[str]:
    """The handler factory ``OTEL_METRICS_EXPORTER`` asks for (none when unset, ``none`` or the SDK
    is disabled).

    Example:
        >>> metrics_exporter_handler_specs({"OTEL_METRICS_EXPORTER": "prometheus"})
        ['otel_titan.exporters.metrics.register_metrics_handler']
        >>> metrics_exporter_handler_specs({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
        []
    """
    if sdk_disabled(environ) or not metrics_exporters(environ):
        return []
    return [METRICS_HANDLER]


def summary_views() -> list[View]:
    """The summary histogram keeps its sum and count even where the exporter prefers exponential
    histograms.

    A View's aggregation beats the reader's preference
    (``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION``), which
    then applies to the bucketed histograms only, as intended.

    Example:
        >>> [v._instrument_name for v in summary_views()]
        ['titan.span.duration.summary']
    """
    return [
        View(
            instrument_name="titan.span.duration.summary",
            aggregation=ExplicitBucketHistogramAggregation(boundaries=()),
        )
    ]


def instrument_name(name: str) -> str:
    """A valid OpenTelemetry instrument name for a scalar name (at most 255 characters, starting
    with a letter).

    Example:
        >>> instrument_name("memory/rss_bytes"), instrument_name("2nd loss"), instrument_name("grad norm")
        ('memory/rss_bytes', 'titan_2nd_loss', 'grad_norm')
    """
    cleaned = _INVALID.sub("_", name) or "unnamed"
    if not cleaned[0].isalpha():
        cleaned = "titan_" + cleaned
    return cleaned[:255]


def name_prefix(name: str) -> str:
    """The family a scalar name belongs to, for the name cap: before its last ``/``, else its first
    ``.``.

    A family (the per-parameter grad norms, say) may take at most half of
    ``OTEL_TITAN_METRICS_MAX_NAMES``, so 1,200 of them logged before ``loss``
    cannot push ``loss`` out; what is dropped is counted and named by family.

    Example:
        >>> name_prefix("grad_norm/layers.0.attention.wq.weight"), name_prefix("train/loss"), name_prefix("grad.layers.3"), name_prefix("loss")
        ('grad_norm', 'train', 'grad', 'loss')
    """
    if "/" in name:
        return name.rsplit("/", 1)[0]
    if "." in name:
        return name.split(".", 1)[0]
    return name


def exposed_key(name: str) -> str:
    """The name two scalar names collide on: the SDK's (case-insensitive) and Prometheus's (``/``
    and ``.`` as ``_``).

    Example:
        >>> exposed_key("train/loss") == exposed_key("train.loss") == exposed_key("Train_Loss")
        True
    """
    return _EXPOSED.sub("_", name.lower())


def _distinct_name(name: str) -> str:
    """An instrument name for `name` that no other name has: the name plus 6 hex digits of its sha1
    (the same on every rank)."""
    return f"{instrument_name(name)[:240]}_{hashlib.sha1(name.encode('utf-8', 'surrogatepass')).hexdigest()[:6]}"


def _patterns(environ: Mapping[str, str]) -> tuple[str, ...]:
    raw = environ.get(OTEL_TITAN_METRICS_PER_RANK)
    if raw is None:
        return DEFAULT_PER_RANK
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _max_names(environ: Mapping[str, str]) -> int:
    raw = environ.get(OTEL_TITAN_METRICS_MAX_NAMES, "").strip()
    if not raw:
        return DEFAULT_MAX_NAMES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"{OTEL_TITAN_METRICS_MAX_NAMES}={raw!r} must be an int >= 1 (distinct scalar names, "
            "and span names, recorded as metrics)"
        )
    return value


class MetricsSpanExporter(TitanSpanExporter):
    """Turn finished spans and scalars into OpenTelemetry metrics (processor thread only).

    Args:
        provider: the `MeterProvider` (its readers decide where metrics go).
        per_rank: `fnmatch` patterns of span names whose durations get buckets.
        max_names: distinct scalar names, and span names, recorded at most.
        stats: the capture queue's counters (dropped, skipped), for the health counter.
        readers: what `build_readers` started (closed at shutdown).

    Example:
        >>> from opentelemetry.sdk.metrics import MeterProvider
        >>> from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        >>> reader = InMemoryMetricReader()
        >>> exporter = MetricsSpanExporter(MeterProvider(metric_readers=[reader]))
        >>> exporter.shutdown()
    """

    def __init__(
        self,
        provider: MeterProvider,
        *,
        per_rank: Sequence[str] = DEFAULT_PER_RANK,
        max_names: int = DEFAULT_MAX_NAMES,
        stats: PipelineStats | None = None,
        readers: Readers | None = None,
        shutdown_timeout_s: float = 3.0,
        host: Any = None,
    ) -> None:
        self.provider = provider
        self._readers = readers
        #: The host's instruments (host_metrics.py) on local rank 0, else None.
        self.host = host
        self._host_names: frozenset[str] = getattr(host, "names", frozenset())
        self._per_rank = tuple(per_rank)
        self._max_names = max_names
        self._stats = stats
        self._shutdown_timeout_s = shutdown_timeout_s
        self._pipeline: Sequence[Any] = ()
        self._processor: Any = None
        meter = provider.get_meter("otel_titan", __version__)
        self._meter = meter
        self._bucketed = meter.create_histogram(
            "titan.span.duration",
            unit="s",
            description="Span duration (per-rank allowlist: OTEL_TITAN_METRICS_PER_RANK)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._summary = meter.create_histogram(
            "titan.span.duration.summary",
            unit="s",
            description="Span duration, sum and count only (names outside the per-rank allowlist)",
            explicit_bucket_boundaries_advisory=(),
        )
        self._step_duration = meter.create_histogram(
            "titan.step.duration",
            unit="s",
            description="From the first span start of a step to the first of the next",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._step_gauge = meter.create_gauge(
            "titan.step", unit="{step}", description="The latest training step seen"
        )
        self._steps_completed = meter.create_counter(
            "titan.steps.completed",
            unit="{step}",
            description="Steps that ended (a later step began)",
        )
        self._overflow = meter.create_counter(
            "titan.metrics.overflow",
            unit="{value}",
            description=f"Values not recorded under their own name: more than {max_names} distinct names, or half of them under one prefix",
        )
        self._nonfinite = meter.create_counter(
            "titan.scalar.nonfinite",
            unit="{value}",
            description="log_trace_scalar values that were NaN or infinite (exported as they are; this counts them between scrapes)",
        )
        meter.create_observable_counter(
            "titan.logger.records",
            callbacks=[self._observe_health],
            unit="{record}",
            description="The logger's own records: written, dropped, skipped, failed",
        )
        #: The semantic-convention instruments of the logger's own figures (`SEMCONV_FIGURES`), made
        #: on first use.
        self._figures: dict[str, Any] = {}
        #: ``process.cpu.time`` by ``cpu.mode``: the latest cumulative figures, observed at each
        #: export.
        self._cpu_time: dict[str, float] = {}
        self._gauges: dict[str, Any] = {}
        #: `exposed_key` → the name that has it: the logger's own instruments, then the scalars in
        #: order of arrival.
        self._exposed: dict[str, str] = {}
        for own in (
            "titan.span.duration",
            "titan.span.duration.summary",
            "titan.step.duration",
            "titan.step",
            "titan.steps.completed",
            "titan.metrics.overflow",
            "titan.scalar.nonfinite",
            "titan.logger.records",
            *(entry[0] for entry in SEMCONV_FIGURES.values()),
        ):
            self._exposed[exposed_key(own)] = self._exposed[exposed_key(own) + "_total"] = (
                f"the logger's own {own}"
            )
        #: Scalar names exported under a distinct name because theirs collided (name → instrument
        #: name).
        self.renamed: dict[str, str] = {}
        #: Scalar names recorded per prefix (`name_prefix`), for the per-prefix share of the cap.
        self._per_prefix: dict[str, int] = {}
        #: Values dropped per prefix (scalars) or span name prefix (spans), as counted in
        #: ``titan.metrics.overflow``.
        self.overflow_by_prefix: dict[str, int] = {}
        self._user_names = 0
        #: Scalar values that were NaN or ±Inf (exported as they are).
        self.nonfinite = 0
        self._span_attrs: dict[str, tuple[Any, dict[str, str]]] = {}
        self._warned = WarnOnce()
        self._step: int | None = None
        self._step_start: int | None = None
        self._shut = False
        #: Values that could not be recorded under their own name (past `max_names`).
        self.overflowed = 0

    # -- wiring ------------------------------------------------------------------------------
    def observe_pipeline(self, exporters: Sequence[Any], processor: Any) -> None:
        """Know the other exporters and the processor, whose counters the health counter reports."""
        self._pipeline = tuple(e for e in exporters if e is not self)
        self._processor = processor

    def _observe_health(self, _options: CallbackOptions) -> Iterable[Observation]:
        # On the reader's thread, at export: plain int reads, no lock needed.
        written = failed = dropped = 0
        for exporter in self._pipeline:
            if isinstance(exporter, DeliveryCounted):
                continue  # counted below, every signal alike (traces, logs, records)
            written += int(getattr(exporter, "written_records", 0) or 0)
            failed += int(getattr(exporter, "failed_records", 0) or 0) + int(
                getattr(exporter, "failed_spans", 0) or 0
            )
            dropped += int(getattr(exporter, "dropped_spans", 0) or 0)
        for entry in delivery_losses(self._pipeline).values():
            dropped += entry["dropped"]
            failed += entry["failed"]
        if self._processor is not None:
            failed += int(getattr(self._processor, "failed_events", 0) or 0)
        skipped = 0
        if self._stats is not None:
            dropped += int(self._stats.dropped_records)
            skipped = int(self._stats.skipped_values)
        return [
            Observation(written, {"outcome": "written"}),
            Observation(dropped, {"outcome": "dropped"}),
            Observation(skipped, {"outcome": "skipped"}),
            Observation(failed, {"outcome": "failed"}),
        ]

    # -- the processor thread -------------------------------------------------------------------
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Record each span's duration, each scalar's value and the step progress."""
        if self._shut:
            return SpanExportResult.FAILURE
        for span in spans:
            if getattr(span, "incomplete", False):
                continue  # a copy of a span still open: its duration is not known yet
            kind = getattr(span, "record_kind", None)
            step = getattr(span, "step", None)
            if step is not None and step != self._step and kind != _SCALAR:
                # Spans and instants move the step; scalars follow it (the per-step
                # process figures of step N arrive after step N+1 began).
                self._new_step(step, span.start_time)
            if kind == _SCALAR:
                self._scalar(span.metric_name, span.metric_value)  # type: ignore[attr-defined]  # a logger's scalar is a TitanSpan
            elif kind == _SPAN or kind is None:
                if span.end_time is not None and span.start_time is not None:
                    self._duration(span)
        return SpanExportResult.SUCCESS

    def _new_step(self, step: int, start_ns: int | None) -> None:
        previous, started = self._step, self._step_start
        self._step, self._step_start = step, start_ns
        self._step_gauge.set(step)
        if previous is None:
            return
        self._steps_completed.add(1)
        if started is not None and start_ns is not None and start_ns > started:
            self._step_duration.record((start_ns - started) / 1e9)

    def _scalar(self, name: str | None, value: Any) -> None:
        if (
            name is None
            or isinstance(value, bool)
            or not isinstance(value, (int, float))
            or name in self._host_names
        ):
            return  # a host figure: already the host's own gauge (``host.…``), read at each export
        if name in SEMCONV_FIGURES:
            self._figure(name, value)
            return
        gauge = self._gauges.get(name)
        if gauge is None:
            gauge = self._new_gauge(name)
            if gauge is None:
                return
        if isinstance(value, float) and not math.isfinite(value):
            self._set_nonfinite(gauge, name, value)
        else:
            gauge.set(value)

    def _figure(self, name: str, value: int | float) -> None:
        """One of the logger's own figures, under its semantic-convention name and unit."""
        instrument_name_, unit, attributes = SEMCONV_FIGURES[name]
        if instrument_name_ == "process.cpu.time":
            if not self._cpu_time:
                self._meter.create_observable_counter(
                    instrument_name_,
                    callbacks=[self._observe_cpu_time],
                    unit=unit,
                    description="CPU time of the process, all threads, since it started",
                )
            self._cpu_time[attributes["cpu.mode"]] = float(value)
            return
        gauge = self._figures.get(instrument_name_)
        if gauge is None:
            gauge = self._figures[instrument_name_] = self._meter.create_gauge(
                instrument_name_,
                unit=unit,
                description=f"otel-titan's per-step {name!r}, read when the step ended",
            )
        gauge.set(value, attributes or None)

    def _observe_cpu_time(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(seconds, {"cpu.mode": mode})
            for mode, seconds in list(self._cpu_time.items())
        ]

    def _new_gauge(self, name: str) -> Any:
        """The gauge for a new scalar name, or None when the cap drops it (counted, warned)."""
        if name not in OWN_FIGURES:  # the logger's own figures are a few, known names: always kept
            prefix = name_prefix(name)
            if self._user_names >= self._max_names or self._per_prefix.get(prefix, 0) >= max(
                1, self._max_names // 2
            ):
                self._overflowed("scalar", name, prefix)
                return None
            self._user_names += 1
            self._per_prefix[prefix] = self._per_prefix.get(prefix, 0) + 1
        exported = instrument_name(name)
        key = exposed_key(exported)
        holder = self._exposed.get(key)
        # two families of one name: Prometheus would keep the first and say nothing
        if holder is not None:
            exported = self.renamed[name] = _distinct_name(name)
            _log.warning(
                "otel-titan: scalar %r and %s are one metric name to OpenTelemetry and Prometheus "
                "(%r); %r is exported as %r (its description keeps the name)",
                name,
                holder if holder.startswith("the logger's own") else repr(holder),
                key,
                name,
                exported,
            )
            key = exposed_key(exported)
        self._exposed[key] = name
        gauge = self._gauges[name] = self._meter.create_gauge(
            exported, description=f"log_trace_scalar {name!r}"
        )
        return gauge

    def _set_nonfinite(self, gauge: Any, name: str, value: float) -> None:
        """Export a NaN or ±Inf as it is: a ``loss != loss`` alert must see it.

        The SDK's ``Gauge.set`` discards non-finite values (and warns once per
        value), though OTLP and Prometheus both carry them; the measurement goes
        to the SDK's consumer directly, as ``set`` would hand it on. Counted in
        ``titan.scalar.nonfinite`` too, which a NaN replaced by a finite value
        before the next scrape or export cannot hide.
        """
        self.nonfinite += 1
        self._nonfinite.add(1, {"titan.scalar.name": name})
        if self._warned.first(("nonfinite", name)):
            _log.warning(
                "otel-titan: scalar %r is %s; exported as it is and counted in "
                "titan.scalar.nonfinite (later ones are not warned about)",
                name,
                value,
            )
        consumer = getattr(gauge, "_measurement_consumer", None)
        if consumer is None or _Measurement is None:
            return  # an SDK without the internals this relies on: the counter still says it
        try:
            consumer.consume_measurement(
                _Measurement(value, time.time_ns(), gauge, context_api.get_current(), None)
            )
        except Exception:  # noqa: BLE001 - an SDK that changed: the counter still says it
            if self._warned.first("nonfinite-consume"):
                _log.warning(
                    "otel-titan: this OpenTelemetry SDK does not take a non-finite gauge value; "
                    "only titan.scalar.nonfinite counts them",
                    exc_info=True,
                )

    def _duration(self, span: ReadableSpan) -> None:
        name = span.name
        entry = self._span_attrs.get(name)
        if entry is None:
            if len(self._span_attrs) >= self._max_names:
                self._overflowed("span", name, name_prefix(name))
                entry = self._span_attrs.get(OVERFLOW_NAME)
                if entry is None:
                    entry = self._span_attrs[OVERFLOW_NAME] = (
                        self._summary,
                        {"titan.span.name": OVERFLOW_NAME},
                    )
            else:
                bucketed = any(fnmatch.fnmatchcase(name, pattern) for pattern in self._per_rank)
                entry = self._span_attrs[name] = (
                    self._bucketed if bucketed else self._summary,
                    {"titan.span.name": name},
                )
        instrument, attributes = entry
        duration_s = (span.end_time - span.start_time) / 1e9  # type: ignore[operator]  # an ended span has both times
        if instrument is self._bucketed:
            # In the span's context: the trace-based exemplar filter links the bucket to this trace.
            instrument.record(
                duration_s,
                attributes,
                context=trace_api.set_span_in_context(
                    trace_api.NonRecordingSpan(span.get_span_context())  # type: ignore[arg-type]  # an ended span has its context
                ),
            )
        else:  # no buckets to link: skip the context (a third of the cost of a record)
            instrument.record(duration_s, attributes)

    def _overflowed(self, kind: str, name: str, prefix: str) -> None:
        self.overflowed += 1
        if (
            prefix not in self.overflow_by_prefix
            and len(self.overflow_by_prefix) >= MAX_OVERFLOW_PREFIXES
        ):
            prefix = "_other"  # bounded: a name with a step number in it is a new prefix every step
        self.overflow_by_prefix[prefix] = self.overflow_by_prefix.get(prefix, 0) + 1
        self._overflow.add(1, {"kind": kind, "titan.metric.prefix": prefix})
        # One warning for the cap itself, and one per prefix that used up its share.
        full = kind == "span" or self._user_names >= self._max_names
        if not self._warned.first(("overflow", kind, None if full else prefix)):
            return
        if kind == "span":
            why, what = (
                f"more than {self._max_names} distinct span names",
                f"recorded as {OVERFLOW_NAME!r}",
            )
        elif full:
            why, what = (
                f"more than {self._max_names} distinct scalar names",
                "not exported as metrics",
            )
        else:
            why, what = (
                f"the prefix {prefix!r} has its share of the names "
                f"({max(1, self._max_names // 2)}, half of {self._max_names})",
                "not exported as metrics",
            )
        _log.warning(
            "otel-titan: %s; %r and later new %s are %s (counted in titan.metrics.overflow by "
            "kind and titan.metric.prefix; "
            "the first names and the logger's own figures are kept). Raise %s if they are wanted",
            why,
            name,
            "names" if full else f"names under {prefix!r}",
            what,
            OTEL_TITAN_METRICS_MAX_NAMES,
        )

    # -- flush and shutdown -----------------------------------------------------------------------
    #: SIGTERM: drained after the logs and traces start (core/exporter.py `drain_exporters`).
    drain_last = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing to push now: readers export every ``OTEL_METRIC_EXPORT_INTERVAL`` and at
        shutdown.

        A synchronous export here would hold the processor thread (and the
        JSONL file behind it) for as long as a dead collector takes to time out.
        """
        return True

    def drain(self, timeout: float) -> bool:
        """SIGTERM: push what was recorded, within `timeout` seconds (the signal watcher's
        thread)."""
        return self._bounded(
            lambda: self.provider.force_flush(timeout_millis=int(timeout * 1000)), timeout
        )

    def shutdown(self) -> None:
        """Export once more and stop the readers, giving a backend at most `shutdown_timeout_s`."""
        if self._shut:
            return
        self._shut = True
        timeout = self._shutdown_timeout_s
        self._bounded(lambda: self.provider.shutdown(timeout_millis=timeout * 1000), timeout)
        if self._readers is not None:
            self._readers.close()
        if self.host is not None:
            self.host.close()

    def close_after_fork(self) -> None:
        """In a forked child: the parent's readers, threads and port are not ours; record nothing
        more, let go of the port."""
        self._shut = True
        if self._readers is not None:
            self._readers.close_after_fork()

    def opened_record_fields(self) -> dict[str, str]:
        """For the JSONL opening record: where this rank serves ``/metrics`` (a taken port moves
        it)."""
        address = self._readers.prometheus if self._readers is not None else None
        if address is None:
            return {}
        host, port = address
        return {Field.METRICS_ENDPOINT: f"http://{host}:{port}/metrics"}

    @staticmethod
    def _bounded(call: Any, timeout: float) -> bool:
        """Run `call` on a helper thread and wait at most `timeout` (+0.5 s): a hung backend never
        holds us."""
        result: list[Any] = []

        def run() -> None:
            try:
                result.append(call())
            except Exception:  # noqa: BLE001 - a failing export at exit is reported by the SDK's own log
                result.append(False)

        thread = threading.Thread(target=run, name="otel-titan-metrics-stop", daemon=True)
        thread.start()
        thread.join(timeout + 0.5)
        return bool(result and result[0] is not False)


def register_metrics_handler(
    add_span_exporter: Any,
    resource: Resource,
    local_rank: int | None = None,
    stats: PipelineStats | None = None,
    **_: Any,
) -> None:
    """Handler factory: OpenTelemetry metrics as ``OTEL_METRICS_EXPORTER`` asks (module docstring).

    Raises `HandlerSkipped` when the variable is unset or ``none``, or
    ``OTEL_SDK_DISABLED=true``; ``ValueError`` for a bad value of one of the variables.
    """
    if sdk_disabled():
        raise HandlerSkipped("OTEL_SDK_DISABLED=true")
    names = metrics_exporters()
    if not names:
        raise HandlerSkipped("OTEL_METRICS_EXPORTER is unset or none")
    environ = os.environ
    per_rank, max_names = _patterns(environ), _max_names(environ)
    quiet_exporter_logs()  # a dead collector: each export error once a minute, with the count, as for traces
    readers = build_readers(names, local_rank)
    if not readers.readers:
        readers.close()
        raise HandlerSkipped(
            f"no metric reader could start for OTEL_METRICS_EXPORTER={','.join(names)} (see the "
            "warning above)"
        )
    provider = MeterProvider(
        resource=resource, metric_readers=readers.readers, views=summary_views()
    )
    host = None
    if local_rank in (0, None) and flag(OTEL_TITAN_HOST_METRICS, True, environ):
        host = HostMetrics(provider)  # psutil and NVML are imported by it only now
    add_span_exporter(
        MetricsSpanExporter(
            provider,
            per_rank=per_rank,
            max_names=max_names,
            stats=stats,
            readers=readers,
            host=host,
        )
    )

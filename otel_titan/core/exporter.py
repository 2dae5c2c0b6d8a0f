"""The exporter interface: what the pipeline calls on an exporter, every hook declared here.

Any SDK `SpanExporter` (console, OTLP, in-memory, your own) can be registered by
a handler factory: it receives finished spans, instants and scalars (the last
two as zero-length spans) through `export`, in batches, on otel-titan's
background thread, and ``force_flush`` / ``shutdown`` as usual.

Beyond that the pipeline knows these optional hooks, and calls nothing else
(docs/handlers.md):

========================  ===========================================================
==================== hook                      called
declared by ========================  ===========================================================
==================== ``export_timeline``       every start and end, in capture order (instead of
`export`)  `StartAwareSpanExporter` ``heartbeat``             nothing emitted for
``heartbeat_interval_s`` with spans open  `HeartbeatAware` ``black_box``             a stall, a dump
signal or trigger, SIGTERM: the hang record  `BlackBoxAware` ``drain(timeout)``        SIGTERM,
after the flush: deliver what is queued (network)   `Drainable` ``delivery_losses()``     the
closing record, the health counters: what was not sent   `DeliveryCounted` ``discard()``
init failed after the exporter was made: undo, write nothing  `Discardable` ``close_after_fork()``
in a forked child: let go of the parent's resources silently  `ForkAware` ========================
===========================================================  ====================

`TitanSpanExporter` is a `SpanExporter` declaring all of them with harmless
defaults; subclass it (or `StartAwareSpanExporter`, which also sees starts)
and override what you need. A plain SDK exporter may also just define a
method of the same name: the runtime-checkable protocols below recognise it,
once, when the logger is assembled.

An exporter that needs to see spans *when they start*, as the JSONL
writer does so that a hung rank's open span is on disk, subclasses
`StartAwareSpanExporter` and implements `export_timeline`: it receives every
start and end in the order they happened, as ``(ended, span)`` pairs. A span
appears twice in the timeline (started, then ended) and is the same object both
times; while it is open its ``end_time`` is None.

Factories also use two exceptions from here: `HandlerSkipped` (attach nothing,
on purpose) and `HandlerFactoryError` (what init raises for a failed factory).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = [
    "TitanSpanExporter",
    "StartAwareSpanExporter",
    "HeartbeatAware",
    "BlackBoxAware",
    "Drainable",
    "Discardable",
    "DeliveryCounted",
    "delivery_losses",
    "ForkAware",
    "Timeline",
    "TimelineItem",
    "PipelineStats",
    "SpanExporter",
    "SpanExportResult",
    "HandlerSkipped",
    "HandlerFactoryError",
    "discard_exporter",
    "drain_exporter",
    "drain_exporters",
    "close_exporter_after_fork",
]

#: ``(ended, span)``: ``ended`` is False when the span just started.
TimelineItem = tuple[bool, ReadableSpan]


class Timeline(Sequence[TimelineItem]):
    """Starts and ends in capture order: a sequence of ``(ended, span)`` pairs.

    Stored as two parallel lists, so a batch of thousands of items allocates
    no pair until an exporter iterates (and `zip` reuses its pair when it can):
    fewer objects for the garbage collector on the writer thread's hot path.

    Example:
        >>> t = Timeline()
        >>> t.append(False, "span")
        >>> list(t), len(t), t[0]
        ([(False, 'span')], 1, (False, 'span'))
    """

    __slots__ = ("ended", "spans")

    def __init__(self) -> None:
        self.ended: list[bool] = []
        self.spans: list[ReadableSpan] = []

    def append(self, ended: bool, span: ReadableSpan) -> None:
        """Add one item."""
        self.ended.append(ended)
        self.spans.append(span)

    def __iter__(self) -> Iterator[TimelineItem]:
        return zip(self.ended, self.spans)

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(zip(self.ended[index], self.spans[index]))
        return (self.ended[index], self.spans[index])


class HandlerFactoryError(RuntimeError):
    """A handler factory could not be imported, or raised when called."""


class HandlerSkipped(Exception):
    """Raised by a factory that deliberately attaches nothing (e.g. ``OTEL_SDK_DISABLED=true``).

    Unlike any other exception, it does not fail `init_structured_logger`: the
    factory is skipped and the reason logged at INFO level.
    """


@runtime_checkable
class PipelineStats(Protocol):
    """Counters of the capture queue, readable from any thread (the ``stats`` a factory receives).

    Counters are named ``<what happened>_<what was counted>`` across the
    library: ``dropped_records``, ``dropped_events``, ``skipped_values``
    here; ``dropped_spans`` and ``failed_spans`` of a queued exporter;
    ``written_records`` and ``failed_records`` of the JSONL writer;
    ``failed_events`` of the processor.
    """

    @property
    def dropped_records(self) -> int:
        """Records lost because the queue was full (process-wide, since init)."""
        ...

    @property
    def skipped_values(self) -> int:
        """Scalar values `log_trace_scalar` could not log (None, tensors), since init."""
        ...


@runtime_checkable
class HeartbeatAware(Protocol):
    """Told when the process is quiet with spans open (start-aware exporters only)."""

    def heartbeat(self, time_ns: int, open_spans: Sequence[ReadableSpan]) -> None:
        """Nothing was emitted for ``heartbeat_interval_s`` and `open_spans` are still open
        (processor thread)."""
        ...


@runtime_checkable
class BlackBoxAware(Protocol):
    """Told when the process writes its hang black box (core/blackbox.py)."""

    def black_box(self, time_ns: int, record: dict[str, Any]) -> None:
        """`record`: the ``stall`` record's fields (reason, open spans, thread stacks, flight
        recorder), processor thread."""
        ...


@runtime_checkable
class Drainable(Protocol):
    """Has work of its own in flight (a queue, a network): waited for on SIGTERM."""

    def drain(self, timeout: float) -> bool:
        """Deliver what is queued within `timeout` seconds; False if time ran out.

        Called on SIGTERM after the processor flushed, from the signal watcher
        (never the processor thread), with what is left of ``exit_timeout_s``:
        the process is about to die, so this is the last chance to deliver.
        """
        ...


@runtime_checkable
class DeliveryCounted(Protocol):
    """Sends what it is given somewhere else (a collector) and may lose some: says how much."""

    def delivery_losses(self) -> tuple[str, int, int]:
        """``(what, dropped, failed)``: a short name (``otlp_logs``), items dropped (its queue was
        full, or still queued when time ran out at shutdown) and items its exporter reported as
        failed, since init."""
        ...


def delivery_losses(exporters: Sequence[SpanExporter]) -> dict[str, dict[str, int]]:
    """``{what: {"dropped": n, "failed": m}}`` for every exporter that counts its deliveries (the
    closing record, the health counters).

    Example:
        >>> class Logs(TitanSpanExporter):
        ...     def delivery_losses(self):
        ...         return ("otlp_logs", 2440, 0)
        >>> delivery_losses([Logs()])
        {'otlp_logs': {'dropped': 2440, 'failed': 0}}
    """
    out: dict[str, dict[str, int]] = {}
    for exporter in exporters:
        if isinstance(exporter, DeliveryCounted):
            try:
                what, dropped, failed = exporter.delivery_losses()
            except Exception:  # noqa: BLE001 - a report must never cost the closing record
                continue
            entry = out.setdefault(str(what), {"dropped": 0, "failed": 0})
            entry["dropped"] += int(dropped)
            entry["failed"] += int(failed)
    return out


@runtime_checkable
class Discardable(Protocol):
    """Can undo its own construction: called instead of `shutdown` when init fails after it was
    made."""

    def discard(self) -> None:
        """Release what was created (remove an empty file) without writing anything more."""
        ...


@runtime_checkable
class ForkAware(Protocol):
    """Holds resources a forked child must not use (files, sockets, threads)."""

    def close_after_fork(self) -> None:
        """In a forked child: forget the parent's resources without writing to or flushing them."""
        ...


class TitanSpanExporter(SpanExporter):
    """A `SpanExporter` declaring every optional hook of the pipeline, each a harmless default.

    Example:
        >>> class Network(TitanSpanExporter):
        ...     def export(self, spans):
        ...         return SpanExportResult.SUCCESS
        ...     def drain(self, timeout):
        ...         return True   # wait for the sends in flight
        >>> isinstance(Network(), Drainable)
        True
    """

    def drain(self, timeout: float) -> bool:
        """SIGTERM: deliver what is queued within `timeout` seconds.

        The default has nothing of its own in flight: the processor's flush
        just before already called `force_flush`, on its own thread.
        """
        return True

    def discard(self) -> None:
        """Init failed after this exporter was made (default: `shutdown`)."""
        self.shutdown()

    def close_after_fork(self) -> None:
        """In a forked child: let go of the parent's resources silently (default: nothing)."""

    def shutdown(self) -> None:
        """Release resources; called once, on the processor thread, after the last export."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Push buffered data to its destination."""
        return True


def drain_exporter(exporter: SpanExporter, timeout: float) -> bool:
    """Call `exporter`'s declared `drain` hook; an exporter without one has nothing in flight."""
    if isinstance(exporter, Drainable):
        return bool(exporter.drain(timeout))
    return True


def drain_exporters(exporters: Sequence[SpanExporter], deadline: float) -> bool:
    """SIGTERM: drain every `Drainable` exporter side by side, each until `deadline`
    (``time.monotonic()``).

    One after the other, an unresponsive endpoint took the whole budget: metrics
    waiting on a hung collector left 0 of 40 queued log lines sent. Side by
    side each gets all that is left; those declaring ``drain_last = True`` (the
    metrics, whose figures a later scrape or the next run can still give) start
    after the logs and traces, which are what explains a death. Returns True
    when every one finished in time.
    """
    drainable = [e for e in exporters if isinstance(e, Drainable)]
    # stable: the logs and traces first
    drainable.sort(key=lambda e: bool(getattr(e, "drain_last", False)))
    results: dict[int, bool] = {}

    def run(index: int, exporter: Any) -> None:
        try:
            results[index] = bool(exporter.drain(max(0.0, deadline - time.monotonic())))
        except Exception:  # noqa: BLE001 - the process is about to die: one exporter must not cost the others
            results[index] = False

    threads = [
        threading.Thread(target=run, args=(i, e), name=f"otel-titan-drain-{i}", daemon=True)
        for i, e in enumerate(drainable)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return len(results) == len(drainable) and all(results.values())


def discard_exporter(exporter: SpanExporter) -> None:
    """Undo `exporter` after a failed init: its `discard` hook, else its `shutdown`."""
    if isinstance(exporter, Discardable):
        exporter.discard()
    else:
        exporter.shutdown()


def close_exporter_after_fork(exporter: SpanExporter) -> None:
    """In a forked child: `exporter`'s `close_after_fork` hook, if it declares one."""
    if isinstance(exporter, ForkAware):
        exporter.close_after_fork()


class StartAwareSpanExporter(TitanSpanExporter):
    """A `SpanExporter` that also sees span starts, in emission order.

    Example:
        >>> class Printer(StartAwareSpanExporter):
        ...     def export_timeline(self, timeline):
        ...         for ended, span in timeline:
        ...             print("end" if ended else "start", span.name)
        ...         return SpanExportResult.SUCCESS
    """

    def export_timeline(self, timeline: Sequence[TimelineItem]) -> SpanExportResult:
        """Receive starts and ends, in the order they were captured."""
        raise NotImplementedError

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Plain `SpanExporter` entry point: finished spans only."""
        return self.export_timeline([(True, span) for span in spans])

    def heartbeat(self, time_ns: int, open_spans: Sequence[ReadableSpan]) -> None:
        """Nothing was emitted for a while and `open_spans` are still open (optional)."""

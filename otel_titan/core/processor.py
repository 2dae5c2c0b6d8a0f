"""The background processor: queue → spans → exporters, on one daemon thread.

It has `BatchSpanProcessor` semantics (bounded queue, drops counted rather than
waited for, batches exported on a schedule, `force_flush`, `shutdown`) with
two differences that a training logger needs:

* the calling thread only appended a tuple; the spans are *built* here
  (`span_builder`), so no SDK span object ever exists on the training thread;
* start-aware exporters get starts and ends interleaved in capture order, so a
  ``_start`` record is written as soon as the span starts, not when it ends.

The thread wakes every `schedule_delay` (50 ms by default) or on a flush, so a
record reaches the OS about that long after it was emitted. When nothing was
emitted for `heartbeat_s` (10 s) while spans are open, start-aware exporters
are told (`heartbeat`): the JSONL file then records that the process is alive
and still inside those spans, which a later SIGKILL would otherwise hide. One exporter
raising never stops the others: the first failure of each exporter is logged
with its traceback, later ones are counted.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

from opentelemetry.sdk.trace.export import SpanExporter

from otel_titan.core.exporter import HeartbeatAware, StartAwareSpanExporter, Timeline
from otel_titan.core.events import END, END_ERROR, END_HANDLE, END_MONO, FLUSH, FLUSH_DONE, FLUSH_OPEN_SPANS, INSTANT, SCALAR, START, STOP
from otel_titan.core.event_queue import EventQueue
from otel_titan.core.span_builder import SpanBuilder
from otel_titan.core.titan_span import TitanSpan
from otel_titan.core.warn_once import WarnOnce

__all__ = ["BatchProcessor"]

_log = logging.getLogger("otel_titan")


class BatchProcessor:
    """Drain `queue` on a background thread and hand the spans to `exporters`.

    `STUCK_AFTER_S`: an export call running longer than this means the thread is
    blocked (I/O), not busy, and callers stop yielding the GIL to it.

    Example:
        >>> # built by init_structured_logger; shown for the shape of the API
        >>> # processor = BatchProcessor(queue, builder, [JsonlSpanExporter(...)])
        >>> # processor.start(); ...; processor.flush(timeout=5); processor.shutdown(timeout=5)
    """

    STUCK_AFTER_S = 0.2

    def __init__(
        self,
        queue: EventQueue,
        builder: SpanBuilder,
        exporters: Sequence[SpanExporter],
        schedule_delay: float = 0.05,
        max_batch: int = 8192,
        heartbeat_s: float = 10.0,
    ) -> None:
        self._queue = queue
        self._builder = builder
        self._timeline_exporters = [e for e in exporters if isinstance(e, StartAwareSpanExporter)]
        # Declared hooks, resolved once (core/exporter.py): heartbeats go to start-aware exporters only.
        self._heartbeat_exporters: list[Any] = [e for e in self._timeline_exporters if isinstance(e, HeartbeatAware)]
        self._plain_exporters = [e for e in exporters if not isinstance(e, StartAwareSpanExporter)]
        self._exporters = list(exporters)
        self._schedule_delay = schedule_delay
        self._max_batch = max_batch
        self._heartbeat_s = heartbeat_s
        self._wake = threading.Event()
        self._stopped = threading.Event()  # set once the exporters are shut down (see `stop`)
        self._thread: threading.Thread | None = None
        self._failures = WarnOnce()  # per exporter: the first failure is logged, later ones counted
        self._exporting_since = 0.0
        self._cpu_clock: int | None = None
        self._last_cpu = 0.0
        self._blocked_sampled_at = 0.0
        self._blocked_now = False
        #: Captured events that could not be built into spans (skipped; the first is logged).
        self.failed_events = 0

    # -- control, from any thread ----------------------------------------------------------
    def start(self) -> None:
        """Start the daemon thread (once)."""
        self._thread = threading.Thread(target=self._run, name="otel-titan-processor", daemon=True)
        self._thread.start()

    def wake(self) -> bool:
        """Drain now rather than at the next tick (the queue is filling up).

        Returns False when the thread has been inside one export call for more
        than `STUCK_AFTER_S` (a frozen filesystem, a hung exporter): yielding
        the GIL to it would not help, so the caller should not bother.
        """
        since = self._exporting_since
        if since and time.monotonic() - since > self.STUCK_AFTER_S and self._blocked():
            return False
        self._wake.set()
        return True

    def _blocked(self) -> bool:
        """Whether the thread is waiting (I/O, a lock), not computing: its CPU clock stands still.

        A long export is not enough to tell: under heavy GIL contention a busy
        export takes long too, and then yielding to it is exactly right.
        Sampled at most every 50 ms, so the crowded path stays cheap.
        """
        now = time.monotonic()
        if now - self._blocked_sampled_at < 0.05:
            return self._blocked_now
        clock = self._cpu_clock
        if clock is None:
            blocked = True  # no per-thread CPU clock on this platform: trust the export's duration
        else:
            try:
                cpu = time.clock_gettime(clock)
            except OSError:
                cpu = self._last_cpu + 1.0
            blocked = cpu - self._last_cpu < 0.001
            self._last_cpu = cpu
        self._blocked_sampled_at = now
        self._blocked_now = blocked
        return blocked

    def flush(self, timeout: float | None = 5.0, *, open_spans: bool = False) -> bool:
        """Export everything captured before this call; False if `timeout` passed first.

        With `open_spans`, exporters that only see finished spans (OTLP) also
        get a copy of every span still open, marked ``titan.incomplete`` (used
        when the process is about to die of SIGTERM).
        """
        thread = self._thread
        if thread is None or not thread.is_alive():
            return False
        if thread is threading.current_thread():
            return False
        done = threading.Event()
        self._queue.put_control((FLUSH, done, open_spans))
        self._wake.set()
        return done.wait(timeout)

    def shutdown(self, timeout: float | None = 5.0) -> bool:
        """Export what is queued, shut the exporters down, stop the thread.

        Returns False when the thread did not finish within `timeout` (an
        exporter stuck on a frozen filesystem, say); the daemon thread is then
        abandoned and the process can still exit.
        """
        thread = self._thread
        if thread is None:
            return True
        self._queue.put_control((STOP,))
        self._wake.set()
        if thread is threading.current_thread():
            return False
        thread.join(timeout)
        return not thread.is_alive()

    def stop(self, timeout: float | None) -> bool:
        """Like `shutdown`, but waits on an event rather than joining the thread.

        For the SIGTERM watcher, when the signal lands while the main thread is
        shutting down: the main thread's signal handler may be running inside
        its own ``join`` of this thread, holding the lock a second ``join``
        would wait for until its timeout.
        """
        if self._thread is None:
            return True
        self._queue.put_control((STOP,))
        self._wake.set()
        if self._thread is threading.current_thread():
            return False
        return self._stopped.wait(timeout)

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:  # this thread's CPU clock, read by `_blocked` from the callers' threads
            self._cpu_clock = time.pthread_getcpuclockid(threading.get_ident())
        except (AttributeError, OSError):
            self._cpu_clock = None
        items = self._queue.items
        popleft = items.popleft
        max_batch = self._max_batch
        wake = self._wake
        stop = False
        last_activity = time.monotonic()
        try:
            while not stop:
                wake.wait(self._schedule_delay)
                wake.clear()
                if items:
                    last_activity = time.monotonic()
                while items and not stop:
                    batch: list[Any] = []
                    append = batch.append
                    try:
                        for _ in range(max_batch):
                            append(popleft())
                    except IndexError:
                        pass
                    stop = self._process(batch)
                if self._heartbeat_s and not stop and time.monotonic() - last_activity >= self._heartbeat_s:
                    last_activity = time.monotonic()
                    self._heartbeat()
            self._shutdown_exporters()
        finally:
            self._stopped.set()

    def _process(self, batch: list[Any]) -> bool:
        """Build spans for `batch` and export them; True when a STOP was reached."""
        builder = self._builder
        builder.clock.refresh()
        timeline = Timeline()
        started, ended_flags = timeline.spans.append, timeline.ended.append
        # Finished spans are collected only for exporters that take them (OTLP...).
        want_finished = bool(self._plain_exporters)
        finished: list[TitanSpan] = []
        stop = False
        for event in batch:
            kind = event[0]
            try:
                if kind == START:  # the event is the span's handle
                    started(builder.started(event))
                    ended_flags(False)
                elif kind == END:
                    span = builder.ended(event[END_HANDLE], event[END_MONO], event[END_ERROR])
                    started(span)
                    ended_flags(True)
                    if want_finished:
                        finished.append(span)
                elif kind == INSTANT:
                    span = builder.instant(*event[1:])  # INSTANT_FIELDS order (events.py)
                    started(span)
                    ended_flags(True)
                    if want_finished:
                        finished.append(span)
                elif kind == SCALAR:
                    for span in builder.scalars(*event[1:]):  # SCALAR_FIELDS order (events.py)
                        started(span)
                        ended_flags(True)
                        if want_finished:
                            finished.append(span)
                elif kind == FLUSH:
                    if event[FLUSH_OPEN_SPANS]:
                        finished.extend(self._incomplete_copies())
                    self._export(timeline, finished)
                    timeline = Timeline()
                    finished = []
                    started, ended_flags = timeline.spans.append, timeline.ended.append
                    self._force_flush()
                    event[FLUSH_DONE].set()
                elif kind == STOP:
                    finished.extend(self._incomplete_copies())
                    stop = True
            except Exception:  # noqa: BLE001 - one bad event must not stop the thread
                self.failed_events += 1
                if self._failures.first("build"):
                    _log.exception("otel-titan: could not build a span from a captured event; it was skipped")
        self._export(timeline, finished)
        return stop

    def _heartbeat(self) -> None:
        # Quiet for a while with spans open: a hung phase, or a very long one.
        # Tell start-aware exporters (the JSONL file writes a `heartbeat` record),
        # so that after a SIGKILL the file still says how long the phase was open.
        open_spans = self._builder.open_spans()
        if not open_spans:
            return
        now = time.time_ns()
        for exporter in self._heartbeat_exporters:
            try:
                exporter.heartbeat(now, open_spans)
            except Exception:  # noqa: BLE001
                self._report_failure(exporter, "heartbeat")

    def _incomplete_copies(self) -> list[TitanSpan]:
        # Spans a hung or killed phase left open: without these, exporters that
        # only see finished spans would show nothing of the phase that matters.
        if not self._plain_exporters:
            return []
        now = time.time_ns()
        return [span.incomplete_copy(now) for span in self._builder.open_spans()]

    def _export(self, timeline: Timeline, finished: list[TitanSpan]) -> None:
        self._exporting_since = time.monotonic()
        try:
            self._export_now(timeline, finished)
        finally:
            self._exporting_since = 0.0

    def _export_now(self, timeline: Timeline, finished: list[TitanSpan]) -> None:
        if timeline:
            for exporter in self._timeline_exporters:
                try:
                    exporter.export_timeline(timeline)
                except Exception:  # noqa: BLE001 - isolate exporters from each other
                    self._report_failure(exporter, "export_timeline")
        if finished:
            for exporter in self._plain_exporters:
                try:
                    exporter.export(finished)
                except Exception:  # noqa: BLE001
                    self._report_failure(exporter, "export")

    def _force_flush(self) -> None:
        for exporter in self._exporters:
            try:
                exporter.force_flush(5000)
            except Exception:  # noqa: BLE001
                self._report_failure(exporter, "force_flush")

    def _shutdown_exporters(self) -> None:
        for exporter in self._exporters:
            try:
                exporter.shutdown()
            except Exception:  # noqa: BLE001
                self._report_failure(exporter, "shutdown")

    def _report_failure(self, exporter: SpanExporter, method: str) -> None:
        if self._failures.first(id(exporter)):
            _log.exception(
                "otel-titan: exporter %s raised in %s; other exporters are unaffected, and its later failures are counted, not logged",
                type(exporter).__qualname__,
                method,
            )

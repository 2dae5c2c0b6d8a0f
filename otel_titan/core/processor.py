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
and still inside those spans, which a later SIGKILL would otherwise hide (exporters
of finished spans, OTLP, get copies of the open spans marked incomplete and
pending, so a hung span shows in Jaeger or Tempo while the job hangs).

The same thread drives the stall watchdog (`core.stall_watchdog`), at no
cost to the training thread: it tells it each batch's last span end and
ticks it once per loop; the watchdog writes the hang black box once per stall
to exporters declaring `black_box`. A dump signal, a trigger or SIGTERM asks
for one through a ``BLACK_BOX`` control event (`black_box`). One exporter
raising never stops the others: the first failure of each exporter is logged
with its traceback, later ones are counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from otel_titan.core import blackbox
from otel_titan.core.capture import notice_torch
from otel_titan.core.event_queue import EventQueue
from otel_titan.core.events import (
    BLACK_BOX,
    END,
    END_ERROR,
    END_HANDLE,
    END_MONO,
    FLUSH,
    FLUSH_DONE,
    FLUSH_OPEN_SPANS,
    H_MONO,
    H_NAME,
    H_STATE,
    H_TID,
    INSTANT,
    SCALAR,
    START,
    STOP,
)
from otel_titan.core.exporter import BlackBoxAware, HeartbeatAware, StartAwareSpanExporter, Timeline
from otel_titan.core.span_builder import SpanBuilder
from otel_titan.core.stall_watchdog import StallWatchdog
from otel_titan.core.titan_span import TitanSpan
from otel_titan.core.warn_once import WarnOnce

__all__ = ["BatchProcessor"]

_log = logging.getLogger("otel_titan")


class BatchProcessor:
    """Drain `queue` on a background thread and hand the spans to `exporters`.

    `STUCK_AFTER_S`: an export call running longer than this means the thread is
    blocked (I/O), not busy, and callers stop yielding the GIL to it.

    Example (not run: `init_structured_logger` builds the one processor of a process from its
    queue, span builder and exporters; tests/core/test_processor.py runs it):
        >>> processor = BatchProcessor(queue, builder, [exporter])  # doctest: +SKIP
        >>> processor.start()  # doctest: +SKIP
        >>> processor.flush(timeout=5), processor.shutdown(timeout=5)  # doctest: +SKIP
        (True, True)
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
        stall_after_s: float | None = None,
        stacks_file: Any = None,
        stall_floor_s: float = blackbox.DEFAULT_MIN_STALL_S,
        trigger_path: str | None = None,
        step_sampler: Any = None,
    ) -> None:
        self._queue = queue
        self._builder = builder
        self._timeline_exporters = [e for e in exporters if isinstance(e, StartAwareSpanExporter)]
        # Declared hooks, resolved once (core/exporter.py): heartbeats go to start-aware exporters
        # only.
        self._heartbeat_exporters: list[Any] = [
            e for e in self._timeline_exporters if isinstance(e, HeartbeatAware)
        ]
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
        # The stall watchdog: None = automatic threshold, 0 = off (a dump or trigger still writes).
        self._watchdog = StallWatchdog(
            builder,
            [e for e in exporters if isinstance(e, BlackBoxAware)],
            on_written=self._after_black_box,
            on_failure=self._report_failure,
            stall_after_s=stall_after_s,
            stacks_file=stacks_file,
            stall_floor_s=stall_floor_s,
            trigger_path=trigger_path,
        )
        # Per-step scalars written from this thread at step boundaries (step_sampler.py), or None.
        self._step_sampler = step_sampler

    # -- control, from any thread ----------------------------------------------------------
    def start(self) -> None:
        """Start the daemon thread (once)."""
        self._watchdog.start()
        self._thread = threading.Thread(target=self._run, name="otel-titan-processor", daemon=True)
        self._thread.start()

    @property
    def stall_after_s(self) -> float | None:
        """The configured stall threshold (None: automatic; 0: stalls not watched)."""
        return self._watchdog.stall_after_s

    @property
    def black_boxes(self) -> int:
        """Black-box records written (stalls, signals, triggers)."""
        return self._watchdog.written

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

    def black_box(self, reason: str, timeout: float | None = 2.0) -> bool:
        """Write the hang black box now (a dump signal, a trigger file, SIGTERM); False if `timeout`
        passed first.

        Safe from any thread; the processor thread collects it (the open spans are its own).
        """
        thread = self._thread
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            return False
        done = threading.Event()
        self._queue.put_control((BLACK_BOX, reason, done))
        self._wake.set()
        return done.wait(timeout)

    def stall_threshold(self) -> float:
        """Seconds without a span end that make a stall now (configured, or max(120 s, 10 × the
        slowest gap seen))."""
        return self._watchdog.threshold()

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
        watchdog = self._watchdog
        stop = False
        last_activity = time.monotonic()
        torch_noticed = False
        try:
            while not stop:
                wake.wait(self._schedule_delay)
                wake.clear()
                # torch imported after init: its torch.compile must find the check too
                if not torch_noticed:
                    torch_noticed = notice_torch()
                if items:
                    last_activity = time.monotonic()
                progress = watchdog.progress_ns
                while items and not stop:
                    batch: list[Any] = []
                    append = batch.append
                    try:
                        for _ in range(max_batch):
                            append(popleft())
                    except IndexError:
                        pass
                    stop = self._process(batch)
                if (
                    self._heartbeat_s
                    and not stop
                    and time.monotonic() - last_activity >= self._heartbeat_s
                ):
                    last_activity = time.monotonic()
                    self._heartbeat()
                if watchdog.busy and not stop:
                    watchdog.tick(progress)
            watchdog.stop()
            self._shutdown_exporters()
        finally:
            self._stopped.set()

    def _after_black_box(self, reason: str, open_spans: Sequence[Any]) -> None:
        """A black box was written with spans open: exporters of finished spans (OTLP) get their
        copies, marked pending, so the hung spans show in Jaeger or Tempo too."""
        if self._plain_exporters:
            self._export(Timeline(), self._incomplete_copies(pending=reason))

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
        progress = 0
        longest = 0
        # -1: no thread has it
        watchdog = self._watchdog
        lane, lane_tid = watchdog.lane, (watchdog.lane_tid if watchdog.watching else -1)
        for event in batch:
            kind = event[0]
            try:
                if kind == START:  # the event is the span's handle
                    started(builder.started(event))
                    ended_flags(False)
                    if event[H_TID] == lane_tid:
                        lane.started(event[H_NAME], event[H_STATE].step)
                elif kind == END:
                    span = builder.ended(event[END_HANDLE], event[END_MONO], event[END_ERROR])
                    started(span)
                    ended_flags(True)
                    progress = event[END_MONO]
                    if span.thread_id == lane_tid:
                        lane.ended(span.name, span.step, progress)
                    # the slowest span: the stall threshold's scale
                    if progress - event[END_HANDLE][H_MONO] > longest:
                        longest = progress - event[END_HANDLE][H_MONO]
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
                elif kind == BLACK_BOX:
                    # the starts before it: its open spans are current
                    self._export(timeline, finished)
                    timeline = Timeline()
                    finished = []
                    started, ended_flags = timeline.spans.append, timeline.ended.append
                    try:
                        watchdog.write(event[1])
                    finally:
                        event[2].set()
            except Exception:  # noqa: BLE001 - one bad event must not stop the thread
                self.failed_events += 1
                if self._failures.first("build"):
                    _log.exception(
                        "otel-titan: could not build a span from a captured event; it was skipped"
                    )
        watchdog.saw_progress(progress, longest)
        self._export(timeline, finished, final=stop)
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
            except Exception:  # noqa: BLE001 - a broken exporter is reported, never raised into training
                self._report_failure(exporter, "heartbeat")
        if self._plain_exporters:
            # A hung span visible in Jaeger or Tempo while the job hangs (Logfire's "pending
            # spans").
            self._export(Timeline(), self._incomplete_copies(pending="heartbeat"))

    def _incomplete_copies(self, pending: str | None = None) -> list[TitanSpan]:
        # Spans a hung or killed phase left open: without these, exporters that
        # only see finished spans would show nothing of the phase that matters.
        # `pending`: still open, sent while the process lives (titan.extra.pending).
        if not self._plain_exporters:
            return []
        now = time.time_ns()
        copies = [span.incomplete_copy(now) for span in self._builder.open_spans()]
        if pending is not None:
            for copy in copies:
                copy.extra = {**(copy.extra or {}), "pending": True, "pending_reason": pending}
        return copies

    def _export(self, timeline: Timeline, finished: list[TitanSpan], final: bool = False) -> None:
        if self._step_sampler is not None and (timeline or final):
            self._add_step_figures(timeline, finished, final)
        self._exporting_since = time.monotonic()
        try:
            self._export_now(timeline, finished)
        finally:
            self._exporting_since = 0.0

    def _add_step_figures(self, timeline: Timeline, finished: list[TitanSpan], final: bool) -> None:
        """A step ended in `model.timeline` (or the last one, `final`): append its figures' scalars
        (step_sampler.py)."""
        try:
            spans = self._step_sampler.after_batch(timeline.spans, final=final)
        except Exception:  # noqa: BLE001 - figures are a bonus: never lose the batch for them
            self._report_failure(self._step_sampler, "after_batch")
            return
        for span in spans:
            timeline.append(True, span)
            if self._plain_exporters:
                finished.append(span)

    def _export_now(self, timeline: Timeline, finished: list[TitanSpan]) -> None:
        if timeline:
            for exporter in self._timeline_exporters:
                try:
                    exporter.export_timeline(timeline)
                except Exception:  # noqa: BLE001 - isolate exporters from each other
                    self._report_failure(exporter, "export_timeline")
        if finished:
            for plain in self._plain_exporters:
                try:
                    plain.export(finished)
                except Exception:  # noqa: BLE001 - a broken exporter is reported, never raised into training
                    self._report_failure(plain, "export")

    def _force_flush(self) -> None:
        for exporter in self._exporters:
            try:
                exporter.force_flush(5000)
            except Exception:  # noqa: BLE001 - a broken exporter is reported, never raised into training
                self._report_failure(exporter, "force_flush")

    def _shutdown_exporters(self) -> None:
        """Shut every exporter down at once, each on its own thread, and wait for all.

        Why not one after the other: each network exporter bounds its own
        shutdown (OTLP traces, metrics and logs 3 s each against a dead
        collector), so in turn they add up to more than the caller's
        `shutdown` timeout (5 s): the exit waits that long, and is then told
        that records "may be lost" when the JSONL file closed cleanly. Side by
        side the wait is the longest one, not the sum.
        """

        def stop(exporter: SpanExporter) -> None:
            try:
                exporter.shutdown()
            except Exception:  # noqa: BLE001 - a broken exporter is reported, never raised into training
                self._report_failure(exporter, "shutdown")

        if len(self._exporters) <= 1:
            for exporter in self._exporters:
                stop(exporter)
            return
        threads = [
            threading.Thread(
                target=stop, args=(exporter,), name=f"otel-titan-shutdown-{i}", daemon=True
            )
            for i, exporter in enumerate(self._exporters)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _report_failure(self, exporter: SpanExporter, method: str) -> None:
        if self._failures.first(id(exporter)):
            _log.exception(
                "otel-titan: exporter %s raised in %s; other exporters are unaffected, and its "
                "later failures are counted, not logged",
                type(exporter).__qualname__,
                method,
            )

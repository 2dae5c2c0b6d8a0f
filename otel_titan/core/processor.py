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

The same thread is the stall watchdog, at no cost to the training thread: it
already sees every span's end. When no span ended for ``stall_after_s`` while
spans are open, or while none is open but the training loop is inside a step
(between two of its spans: `blackbox.TrainingLane`, fed with that thread's
starts and ends), it writes the hang black box once per stall (blackbox.py) to
exporters declaring `black_box`; a dump signal, a trigger or SIGTERM asks for
one through a ``BLACK_BOX`` control event (`black_box`). One exporter
raising never stops the others: the first failure of each exporter is logged
with its traceback, later ones are counted.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from otel_titan.core import blackbox, step_context
from otel_titan.core.capture import notice_torch, thread_names
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
from otel_titan.core.titan_span import TitanSpan
from otel_titan.core.warn_once import WarnOnce

__all__ = ["BatchProcessor"]

_log = logging.getLogger("otel_titan")


# the watchdog's view of the current stall (BatchProcessor._stall)
_CALM, _IDLE, _WATCHED, _WRITTEN = range(4)


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
        # The stall watchdog (blackbox.py): None = automatic threshold, 0 = off.
        self._black_box_exporters: list[Any] = [
            e for e in exporters if isinstance(e, BlackBoxAware)
        ]
        self.stall_after_s = stall_after_s
        self._stall_floor_s = stall_floor_s
        self._watching = stall_after_s != 0
        self._progress_ns = (
            0  # perf_counter_ns of the latest span end seen (0 = none yet: the start)
        )
        self._slowest_gap_s = 0.0
        self._gaps_seen = False  # a gap between two span ends was measured (the first step's length is unknown before)
        self._started_ns = 0
        # The current stall (no span end for the threshold): _CALM, _IDLE (nothing open, no step
        # under way: looked at again each tick), _WATCHED (a stall, its record deferred until it
        # lasts past the budget's bar) or _WRITTEN (once per stall: the next span end starts a new
        # watch).
        self._stall = _CALM
        self._stall_from_ns = (
            0  # when the current watch began: the last span end, or when an idle process got busy
        )
        self._armed_progress_ns = -1
        self._budget = blackbox.BlackBoxBudget()
        # The training loop's thread (native id, refreshed each tick) and what it did last: a
        # process with no span open is stuck between two spans of a step, or idle
        # (blackbox.TrainingLane).
        self._lane = blackbox.TrainingLane()
        self._lane_tid = threading.main_thread().native_id
        self._faulthandler = (
            blackbox.FaulthandlerArm(stacks_file)
            if stacks_file is not None and self._watching
            else None
        )
        # ``OTEL_TITAN_DUMP_TRIGGER``: a file whose modification (touch) asks for the black box.
        self._trigger_path = trigger_path
        self._trigger_seen: int | None = self._trigger_mtime()
        self._trigger_checked = 0.0
        #: Black-box records written (stalls, signals, triggers).
        self.black_boxes = 0
        # Per-step scalars written from this thread at step boundaries (step_sampler.py), or None.
        self._step_sampler = step_sampler

    # -- control, from any thread ----------------------------------------------------------
    def start(self) -> None:
        """Start the daemon thread (once)."""
        self._progress_ns = self._started_ns = self._stall_from_ns = time.perf_counter_ns()
        arm = self._faulthandler
        if arm is not None:
            # Armed now, on the caller's thread: a C call that takes the interpreter lock right
            # after init would keep this thread from ever arming it.
            threshold = self.stall_threshold()
            arm.rearm(threshold + max(2.0, 0.25 * threshold))
            if arm.armed:
                self._armed_progress_ns = self._progress_ns
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
        return blackbox.stall_threshold(
            self.stall_after_s or None, self._slowest_gap_s, self._gaps_seen, self._stall_floor_s
        )

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
                progress = self._progress_ns
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
                if (self._watching or self._trigger_path) and not stop:
                    self._watch(progress)
            if self._faulthandler is not None:
                self._faulthandler.cancel()
            self._shutdown_exporters()
        finally:
            self._stopped.set()

    def _trigger_mtime(self) -> int | None:
        if not self._trigger_path:
            return None
        try:
            return os.stat(self._trigger_path).st_mtime_ns
        except OSError:
            return None

    def _check_trigger(self) -> None:
        """Every 2 s at most (a stat, on a shared filesystem for 1,000 ranks): touched since? Write
        the black box."""
        now = time.monotonic()
        if now - self._trigger_checked < 2.0:
            return
        self._trigger_checked = now
        mtime = self._trigger_mtime()
        if mtime is not None and mtime != self._trigger_seen:
            self._trigger_seen = mtime
            self._write_black_box("trigger")

    def _watch(self, progress_before: int) -> None:
        """The stall watchdog, once per loop: a few comparisons unless a stall begins."""
        if self._trigger_path:
            self._check_trigger()
        if not self._watching:
            return
        self._lane_tid = step_context.training_loop_thread().native_id
        progress = self._progress_ns
        if progress != progress_before:
            gap = (progress - progress_before) / 1e9
            if progress_before != self._started_ns:
                self._gaps_seen = True
                if gap > self._slowest_gap_s:
                    self._slowest_gap_s = gap
            if self._stall in (_WATCHED, _WRITTEN):
                # The run recovered: healthy pauses spend no reserve. The stall began where its
                # watch did (the last span end, or when an idle process got busy), never before the
                # start: measured from 0, a first stall before any span ended "lasted" the machine's
                # uptime and put the reserve out of reach.
                began = max(progress_before, self._stall_from_ns, self._started_ns)
                self._budget.stall_ended((progress - began) / 1e9)
            self._stall = _CALM
            self._stall_from_ns = progress
        threshold = self.stall_threshold()
        arm = self._faulthandler
        if arm is not None and progress != self._armed_progress_ns:
            # Only on progress: a stall leaves it armed, and it fires if Python cannot.
            arm.rearm(threshold + max(2.0, 0.25 * threshold))
            if arm.armed:
                self._armed_progress_ns = progress
        if self._stall == _WRITTEN:
            return
        now = time.perf_counter_ns()
        stalled_s = (now - max(progress, self._stall_from_ns)) / 1e9
        if stalled_s < threshold:
            return
        if self._stall == _CALM and arm is not None:
            arm.cancel()  # Python can run: no frame walk without the lock
            self._armed_progress_ns = progress  # re-armed at the next span end, not before
        if self._stall != _WATCHED:
            if not self._builder.open_spans() and not self._lane.between_spans(self._step()):
                self._stall = (
                    _IDLE  # nothing open, no step under way: not stuck (looked at again next tick)
                )
                return
            # busy again (a span opened, a step began): a new watch, from now
            if self._stall == _IDLE:
                self._stall, self._stall_from_ns = _CALM, now
                self._armed_progress_ns = -1  # and faulthandler armed again at the next tick
                return
            self._stall = _WATCHED
        if stalled_s < self._budget.stall_bar_s(threshold):
            return  # the shared budget is spent: written once longer than every pause the run recovered from
        self._stall = _WRITTEN
        self._write_black_box("stall", stalled_s, threshold)

    @staticmethod
    def _step() -> Any:
        """The training loop's current step (the default every thread without its own sees)."""
        return step_context.default_state[0].step

    def _write_black_box(
        self, reason: str, stalled_s: float | None = None, threshold: float | None = None
    ) -> None:
        """Collect the black box (blackbox.py) and hand it to the exporters that take it."""
        now = time.time_ns()
        open_spans = self._builder.open_spans()
        if stalled_s is None:
            stalled_s = (time.perf_counter_ns() - self._progress_ns) / 1e9
        step = self._step()
        last_span = self._lane.last_span(time.perf_counter_ns())
        if open_spans:
            where = "in_span"
            place = "open: " + ", ".join(span.name for span in open_spans[-4:])
        else:
            # A stall is never written for an idle process; a dump signal, a trigger or SIGTERM may
            # find one.
            where = "between_spans" if self._lane.between_spans(step) else "idle"
            place = (
                f"no span open, {'at' if where == 'between_spans' else 'idle after'} step {step}"
                + (
                    f", {last_span['ended_s_ago']:.1f} s after {last_span['name']} ended"
                    if last_span
                    else ""
                )
            )
        record: dict[str, Any] = {
            "reason": reason,
            "stalled_s": round(stalled_s, 3),
            "stall_after_s": round(
                threshold if threshold is not None else self.stall_threshold(), 3
            ),
            "message": f"{reason}: no span ended for {stalled_s:.1f} s; {place}",
            "log_level": "WARNING",
            "where": where,
            "step": step,
            "last_span": last_span,
            "stalls_ended": self._budget.stalls_ended,
            "longest_ended_s": round(self._budget.longest_ended_s, 3),
            "open_spans": blackbox.open_span_rows(open_spans, now, thread_names.get),
            "threads": blackbox.thread_stacks(),
            "flight_recorder": blackbox.flight_recorder(),
        }
        if reason == "stall":
            fitted = self._budget.fit_stall(record, stalled_s)
        elif reason == "SIGTERM":
            fitted = self._budget.fit_final(record)
        else:
            fitted = self._budget.fit(record)
        if fitted is None:
            return
        self.black_boxes += 1
        for exporter in self._black_box_exporters:
            try:
                exporter.black_box(now, fitted)
            except Exception:  # noqa: BLE001 - a broken exporter is reported, never raised into training
                self._report_failure(exporter, "black_box")
        if self._plain_exporters and open_spans:
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
        lane, lane_tid = (
            self._lane,
            self._lane_tid if self._watching else -1,
        )
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
                        self._write_black_box(event[1])
                    finally:
                        event[2].set()
            except Exception:  # noqa: BLE001 - one bad event must not stop the thread
                self.failed_events += 1
                if self._failures.first("build"):
                    _log.exception(
                        "otel-titan: could not build a span from a captured event; it was skipped"
                    )
        if progress > self._progress_ns:
            self._progress_ns = progress
        if longest:
            self._gaps_seen = True
            if longest / 1e9 > self._slowest_gap_s:
                self._slowest_gap_s = longest / 1e9
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

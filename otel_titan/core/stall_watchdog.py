"""The stall watchdog: when no span has ended for too long, write the hang black box, once per stall.

It runs on the processor thread (`core.processor.BatchProcessor` calls `tick`
once per loop and `saw_progress` after each batch), at no cost to the training
thread: that thread already sees every span's end. When no span ended for the
threshold (``stall_after_s``, or max(120 s, 10 × the slowest gap seen)) while
spans are open, or while none is open but the training loop is inside a step
(between two of its spans: `blackbox.TrainingLane`, which the processor feeds
with that thread's starts and ends), it writes the black box (`blackbox`) to
the exporters declaring the `black_box` hook (`core.exporter.BlackBoxAware`).
A dump signal, a trigger file's touch (``OTEL_TITAN_DUMP_TRIGGER``) or SIGTERM
asks for one through `write`. Where Python itself cannot run (a C call holding
the interpreter lock), the armed `faulthandler` writes the stacks instead.

Why a class of its own: the processor's job is queue → spans → exporters; the
watchdog's is a small state machine over the progress it reports. Apart, each
is read and tested on its own (tests/core/test_stall_watchdog.py), and the
processor keeps only the two calls above.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from otel_titan.core import blackbox, step_context
from otel_titan.core.capture import thread_names
from otel_titan.core.span_builder import SpanBuilder

__all__ = ["StallWatchdog"]

# The watchdog's view of the current stall: _CALM, _IDLE (nothing open, no step under way: looked at
# again each tick), _WATCHED (a stall, its record deferred until it lasts past the budget's bar) or
# _WRITTEN (once per stall: the next span end starts a new watch).
_CALM, _IDLE, _WATCHED, _WRITTEN = range(4)


class StallWatchdog:
    """Watches the progress (span ends) the processor reports; writes the black box of a stall.

    `builder`: the processor's span builder (its open spans are the black
    box's). `exporters`: those declaring `black_box`. `on_written(reason,
    open_spans)`: called after a black box was handed to them (the processor
    sends exporters of finished spans copies of the open ones). `on_failure(exporter,
    method)`: an exporter raised. `stall_after_s`: None for the automatic
    threshold, 0 to watch nothing (a dump signal or trigger still writes).
    `stacks_file`: where `faulthandler` writes when Python cannot run (None:
    not armed). `trigger_path`: the file whose touch asks for a black box.

    Example (not run: the processor builds and drives it; tests/core/test_stall_watchdog.py):
        >>> watchdog = StallWatchdog(builder, [jsonl_exporter], stall_after_s=30)  # doctest: +SKIP
        >>> watchdog.start(); watchdog.tick(watchdog.progress_ns)  # doctest: +SKIP
    """

    def __init__(
        self,
        builder: SpanBuilder,
        exporters: Sequence[Any],
        *,
        on_written: Callable[[str, Sequence[Any]], None] = lambda reason, spans: None,
        on_failure: Callable[[Any, str], None] = lambda exporter, method: None,
        stall_after_s: float | None = None,
        stacks_file: Any = None,
        stall_floor_s: float = blackbox.DEFAULT_MIN_STALL_S,
        trigger_path: str | None = None,
    ) -> None:
        self._builder = builder
        self._exporters = list(exporters)
        self._on_written = on_written
        self._on_failure = on_failure
        self.stall_after_s = stall_after_s
        self._floor_s = stall_floor_s
        #: Whether stalls are watched (False with ``stall_after_s=0``).
        self.watching = stall_after_s != 0
        #: perf_counter_ns of the latest span end seen (the start until one ends).
        self.progress_ns = 0
        self._slowest_gap_s = 0.0
        # a gap between two span ends was measured (the first step's length is unknown before)
        self._gaps_seen = False
        self._started_ns = 0
        self._stall = _CALM
        # when the current watch began: the last span end, or when an idle process got busy
        self._stall_from_ns = 0
        self._armed_progress_ns = -1
        self._budget = blackbox.BlackBoxBudget()
        #: The training loop's thread (native id, refreshed each tick) and what it did last: a
        #: process with no span open is stuck between two spans of a step, or idle.
        self.lane = blackbox.TrainingLane()
        self.lane_tid = threading.main_thread().native_id
        self._faulthandler = (
            blackbox.FaulthandlerArm(stacks_file)
            if stacks_file is not None and self.watching
            else None
        )
        self._trigger_path = trigger_path
        self._trigger_seen: int | None = self._trigger_mtime()
        self._trigger_checked = 0.0
        #: Black-box records written (stalls, signals, triggers).
        self.written = 0

    @property
    def busy(self) -> bool:
        """Whether `tick` has anything to do (stalls watched, or a trigger file to look at)."""
        return self.watching or bool(self._trigger_path)

    def start(self) -> None:
        """Begin watching now; arms faulthandler on the caller's thread (a C call that takes the
        interpreter lock right after init would keep the processor thread from ever arming it)."""
        self.progress_ns = self._started_ns = self._stall_from_ns = time.perf_counter_ns()
        arm = self._faulthandler
        if arm is not None:
            threshold = self.threshold()
            arm.rearm(threshold + max(2.0, 0.25 * threshold))
            if arm.armed:
                self._armed_progress_ns = self.progress_ns

    def stop(self) -> None:
        """Disarm faulthandler (the processor is stopping)."""
        if self._faulthandler is not None:
            self._faulthandler.cancel()

    def threshold(self) -> float:
        """Seconds without a span end that make a stall now (configured, or max(120 s, 10 × the
        slowest gap seen))."""
        return blackbox.stall_threshold(
            self.stall_after_s or None, self._slowest_gap_s, self._gaps_seen, self._floor_s
        )

    def saw_progress(self, progress_ns: int, longest_ns: int) -> None:
        """A batch was built: its last span end (`progress_ns`, 0 for none) and its longest span
        (`longest_ns`: the threshold's scale)."""
        if progress_ns > self.progress_ns:
            self.progress_ns = progress_ns
        if longest_ns:
            self._gaps_seen = True
            if longest_ns / 1e9 > self._slowest_gap_s:
                self._slowest_gap_s = longest_ns / 1e9

    def tick(self, progress_before: int) -> None:
        """Once per processor loop (`progress_before`: `progress_ns` before its batches): a few
        comparisons unless a stall begins."""
        if self._trigger_path:
            self._check_trigger()
        if not self.watching:
            return
        self.lane_tid = step_context.training_loop_thread().native_id
        progress = self.progress_ns
        if progress != progress_before:
            self._progressed(progress_before, progress)
        threshold = self.threshold()
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
        if self._stall != _WATCHED and not self._watch_from(now):
            return
        if stalled_s < self._budget.stall_bar_s(threshold):
            return  # the shared budget is spent: written once longer than every pause the run recovered from
        self._stall = _WRITTEN
        self.write("stall", stalled_s, threshold)

    def _progressed(self, before: int, progress: int) -> None:
        """A span ended since the last tick: the gap measured, a stall's end told to the budget."""
        gap = (progress - before) / 1e9
        if before != self._started_ns:
            self._gaps_seen = True
            if gap > self._slowest_gap_s:
                self._slowest_gap_s = gap
        if self._stall in (_WATCHED, _WRITTEN):
            # The run recovered: healthy pauses spend no reserve. The stall began where its watch
            # did (the last span end, or when an idle process got busy), never before the start:
            # measured from 0, a first stall before any span ended "lasted" the machine's uptime
            # and put the reserve out of reach.
            began = max(before, self._stall_from_ns, self._started_ns)
            self._budget.stall_ended((progress - began) / 1e9)
        self._stall = _CALM
        self._stall_from_ns = progress

    def _watch_from(self, now: int) -> bool:
        """Past the threshold and not yet watched: True when this is a stall (spans open, or a step
        under way between spans); an idle process is looked at again next tick, and one busy again
        after idling starts a new watch from `now`."""
        if not self._builder.open_spans() and not self.lane.between_spans(_step()):
            self._stall = _IDLE
            return False
        if self._stall == _IDLE:
            self._stall, self._stall_from_ns = _CALM, now
            self._armed_progress_ns = -1  # and faulthandler armed again at the next tick
            return False
        self._stall = _WATCHED
        return True

    def write(
        self, reason: str, stalled_s: float | None = None, threshold: float | None = None
    ) -> None:
        """Collect the black box (`blackbox`) and hand it to the exporters that take it, within the
        budget (a stall's record, SIGTERM's own, the others')."""
        now = time.time_ns()
        open_spans = self._builder.open_spans()
        if stalled_s is None:
            stalled_s = (time.perf_counter_ns() - self.progress_ns) / 1e9
        record = self._record(reason, now, open_spans, stalled_s, threshold)
        if reason == "stall":
            fitted = self._budget.fit_stall(record, stalled_s)
        elif reason == "SIGTERM":
            fitted = self._budget.fit_final(record)
        else:
            fitted = self._budget.fit(record)
        if fitted is None:
            return
        self.written += 1
        for exporter in self._exporters:
            try:
                exporter.black_box(now, fitted)
            except Exception:  # noqa: BLE001 - a broken exporter is reported, never raised into training
                self._on_failure(exporter, "black_box")
        if open_spans:
            self._on_written(reason, open_spans)

    def _record(
        self,
        reason: str,
        now: int,
        open_spans: Sequence[Any],
        stalled_s: float,
        threshold: float | None,
    ) -> dict[str, Any]:
        """The black box's record (docs/schema.md, "The black box"), before the budget trims it."""
        step = _step()
        last_span = self.lane.last_span(time.perf_counter_ns())
        if open_spans:
            where = "in_span"
            place = "open: " + ", ".join(span.name for span in open_spans[-4:])
        else:
            # A stall is never written for an idle process; a dump signal, a trigger or SIGTERM may
            # find one.
            where = "between_spans" if self.lane.between_spans(step) else "idle"
            place = (
                f"no span open, {'at' if where == 'between_spans' else 'idle after'} step {step}"
                + (
                    f", {last_span['ended_s_ago']:.1f} s after {last_span['name']} ended"
                    if last_span
                    else ""
                )
            )
        return {
            "reason": reason,
            "stalled_s": round(stalled_s, 3),
            "stall_after_s": round(threshold if threshold is not None else self.threshold(), 3),
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
            self.write("trigger")


def _step() -> Any:
    """The training loop's current step (the default every thread without its own sees)."""
    return step_context.default_state[0].step

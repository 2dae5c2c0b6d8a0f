"""One clock for every timestamp: the monotonic clock, mapped to wall-clock time by one offset.

The calling thread reads only `time.perf_counter_ns()` (one clock call per
event instead of two). The processor turns those readings into wall-clock
nanoseconds with a single offset for the whole process, so that:

* a child span never appears to end after its parent, or to start before it,
  as it can when each timestamp samples the wall clock and the monotonic clock
  separately (their difference jitters by tens of nanoseconds, more when the
  thread is preempted between the two reads);
* durations are exactly monotonic-clock durations.

The offset is re-measured every second on the processor thread and replaced
only when it moved by more than a millisecond: a real step of the wall clock
(NTP stepping, an administrator), not jitter. Gradual NTP slewing needs
nothing, since Linux slews CLOCK_MONOTONIC with CLOCK_REALTIME.
"""

from __future__ import annotations

import time

__all__ = ["WallClock"]


class WallClock:
    """Map `time.perf_counter_ns()` readings to wall-clock nanoseconds since the epoch.

    Example:
        >>> clock = WallClock()
        >>> abs(clock.to_wall(time.perf_counter_ns()) - time.time_ns()) < 50_000_000
        True
    """

    STEP_NS = 1_000_000
    CHECK_EVERY_S = 1.0

    def __init__(self) -> None:
        self.offset = self._measure()
        self.steps = 0
        self._next_check = time.monotonic() + self.CHECK_EVERY_S

    @staticmethod
    def _measure() -> int:
        # Bracket the wall-clock read between two monotonic reads and keep the
        # tightest of a few tries: its midpoint is the best estimate.
        best_width, best_offset = None, 0
        for _ in range(5):
            before = time.perf_counter_ns()
            wall = time.time_ns()
            after = time.perf_counter_ns()
            if best_width is None or after - before < best_width:
                best_width, best_offset = after - before, wall - (before + after) // 2
        return best_offset

    def refresh(self) -> None:
        """Follow a step of the wall clock (called by the processor, at most once a second)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.CHECK_EVERY_S
        measured = self._measure()
        if abs(measured - self.offset) > self.STEP_NS:
            self.offset = measured
            self.steps += 1

    def to_wall(self, mono_ns: int) -> int:
        """The wall-clock time, in ns since the epoch, of a `perf_counter_ns()` reading."""
        return mono_ns + self.offset

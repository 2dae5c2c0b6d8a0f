"""WallClock: one offset maps the monotonic readings of the hot path to wall time, and follows a
stepped clock."""

from __future__ import annotations

import time

from otel_titan.core.clock import WallClock


def test_maps_monotonic_readings_to_wall_time():
    clock = WallClock()
    for _ in range(3):
        assert abs(clock.to_wall(time.perf_counter_ns()) - time.time_ns()) < 50_000_000


def test_refresh_follows_a_stepped_wall_clock():
    clock = WallClock()
    clock.offset -= 10 * WallClock.STEP_NS  # as if the wall clock had stepped 10 ms since
    clock._next_check = 0.0
    clock.refresh()
    assert (
        clock.steps == 1
        and abs(clock.to_wall(time.perf_counter_ns()) - time.time_ns()) < 50_000_000
    )


def test_refresh_ignores_jitter_and_runs_at_most_once_a_second():
    clock = WallClock()
    offset = clock.offset
    clock._next_check = 0.0
    clock.refresh()  # the measurement differs by far less than STEP_NS: kept
    assert clock.offset == offset and clock.steps == 0
    clock.offset -= 10 * WallClock.STEP_NS
    clock.refresh()  # within the second: not measured again
    assert clock.steps == 0

"""`core.stall_watchdog.StallWatchdog`, driven by hand as the processor thread drives it (no thread):
once per stall, never for an idle process, reset by progress, the trigger file, exporters isolated.

The whole path (a real logger, its processor thread, faulthandler, SIGTERM) is tests/core/test_blackbox.py's.
"""

from __future__ import annotations

import os
import time

from otel_titan import structured_logger as sl
from otel_titan.core.events import START
from otel_titan.core.stall_watchdog import StallWatchdog
from tests.core._spans import Captured

STALL_S = 0.05


class _Boxes:
    """An exporter declaring the `black_box` hook: keeps what it is handed."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def black_box(self, time_ns, record):
        self.records.append(record)


class _Raising:
    def black_box(self, time_ns, record):
        raise OSError("disk on fire")


def _open_span(captured: Captured, name: str) -> None:
    """`name` started and never ended, as the processor's builder sees it."""
    with sl.log_trace_span(name):
        events = captured.events()
    for event in events:
        if event[0] == START:
            captured.builder.started(event)


def _past_the_threshold() -> None:
    time.sleep(STALL_S * 1.5)


def test_a_stall_with_a_span_open_writes_one_black_box_until_a_span_ends():
    boxes, written = _Boxes(), []
    with Captured() as captured:
        watchdog = StallWatchdog(
            captured.builder,
            [boxes],
            stall_after_s=STALL_S,
            on_written=lambda reason, spans: written.append((reason, [s.name for s in spans])),
        )
        watchdog.start()
        _open_span(captured, "all_reduce")
        _past_the_threshold()
        for _ in range(3):  # ticks of one stall
            watchdog.tick(watchdog.progress_ns)
    assert [r["reason"] for r in boxes.records] == ["stall"] and watchdog.written == 1
    record = boxes.records[0]
    assert record["where"] == "in_span" and record["stall_after_s"] == STALL_S
    assert [row["name"] for row in record["open_spans"]] == ["all_reduce"]
    assert record["stalled_s"] >= STALL_S and "open: all_reduce" in record["message"]
    assert written == [("stall", ["all_reduce"])]  # the processor's pending copies for OTLP
    # A span ended: the next stall is a new one (the recovered one spent none of the budget's room).
    before = watchdog.progress_ns
    watchdog.saw_progress(time.perf_counter_ns(), longest_ns=1_000)
    watchdog.tick(before)
    _past_the_threshold()
    watchdog.tick(watchdog.progress_ns)
    assert [r["reason"] for r in boxes.records] == ["stall", "stall"]


def test_an_idle_process_writes_nothing_however_long_it_is_quiet():
    boxes = _Boxes()
    with Captured() as captured:
        watchdog = StallWatchdog(captured.builder, [boxes], stall_after_s=STALL_S)
        watchdog.start()
        _past_the_threshold()
        for _ in range(3):
            watchdog.tick(watchdog.progress_ns)
        assert boxes.records == []
        # Busy again after idling: a new watch from now, not a stall that "lasted" the idle time.
        _open_span(captured, "fwd")
        watchdog.tick(watchdog.progress_ns)
        assert boxes.records == []
        _past_the_threshold()
        watchdog.tick(watchdog.progress_ns)
    assert [r["reason"] for r in boxes.records] == ["stall"]


def test_with_stalls_off_only_an_asked_for_black_box_is_written():
    boxes = _Boxes()
    with Captured() as captured:
        watchdog = StallWatchdog(captured.builder, [boxes], stall_after_s=0)
        assert not watchdog.watching and not watchdog.busy
        watchdog.start()
        _open_span(captured, "fwd")
        _past_the_threshold()
        watchdog.tick(watchdog.progress_ns)
        assert boxes.records == []
        watchdog.write("SIGTERM")
    assert [(r["reason"], r["where"]) for r in boxes.records] == [("SIGTERM", "in_span")]


def test_touching_the_trigger_file_writes_one_black_box_and_a_raising_exporter_is_isolated(
    tmp_path,
):
    trigger = tmp_path / "dump-now"
    trigger.write_text("")
    boxes, failures = _Boxes(), []
    with Captured() as captured:
        watchdog = StallWatchdog(
            captured.builder,
            [_Raising(), boxes],
            stall_after_s=0,
            trigger_path=str(trigger),
            on_failure=lambda exporter, method: failures.append((type(exporter).__name__, method)),
        )
        assert watchdog.busy  # a trigger to look at, though stalls are off
        watchdog.start()
        watchdog.tick(watchdog.progress_ns)
        assert boxes.records == []  # the file was there before: no touch yet
        stat = trigger.stat()
        os.utime(trigger, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        watchdog._trigger_checked = 0.0  # the next look now, not 2 s later (what the bound is for)
        watchdog.tick(watchdog.progress_ns)
    assert [(r["reason"], r["where"]) for r in boxes.records] == [("trigger", "idle")]
    assert failures == [("_Raising", "black_box")]


def test_the_threshold_follows_the_slowest_span_when_none_is_configured():
    with Captured() as captured:
        watchdog = StallWatchdog(captured.builder, [], stall_floor_s=1.0)
        assert watchdog.threshold() == 5.0  # no gap measured yet: five times the floor
        watchdog.saw_progress(time.perf_counter_ns(), longest_ns=300_000_000)  # a 0.3 s span
        assert watchdog.threshold() == 3.0  # ten times it, above the floor

"""What the Hang section keeps per process during the summary's pass (analysis/hang_facts.py)."""

from __future__ import annotations

from otel_titan.analysis.model.hang_facts import HangTracker


def _tracker() -> HangTracker:
    tracker = HangTracker()
    tracker.begin("training rank 0", partial=False, world_size=2)
    return tracker


def test_a_stall_followed_by_progress_is_history_and_the_next_watch_starts_clean():
    tracker = _tracker()
    tracker.step_begun(2)
    tracker.stall(
        {
            "reason": "stall",
            "time_us": 5,
            "stalled_s": 3.0,
            "open_spans": [{"name": "eval", "step": 2}],
        }
    )
    assert tracker.box is not None and tracker.stalled
    tracker.progress_at({"log_type_name": "loss"}, None)  # a scalar after it: the process resumed
    tracker.end()
    fact = tracker.facts["training rank 0"]
    assert fact["box"] is None and not fact["stalled"]
    assert [(h["span"], h["step"], h["stalled_s"]) for h in fact["history"]] == [("eval", 2, 3.0)]


def test_a_sigterm_box_after_a_stall_keeps_it_stuck_and_an_on_demand_dump_is_no_stall():
    tracker = _tracker()
    tracker.stall({"reason": "stall", "open_spans": []})
    tracker.stall({"reason": "SIGTERM", "open_spans": []})
    tracker.end()
    assert (
        tracker.facts["training rank 0"]["stalled"]
        and tracker.facts["training rank 0"]["box"]["reason"] == "SIGTERM"
    )
    tracker.begin("training rank 1", partial=False)
    tracker.stall({"reason": "trigger", "open_spans": []})
    tracker.progress()
    tracker.end()
    assert (
        tracker.facts["training rank 1"]["history"] == []
        and not tracker.facts["training rank 1"]["stalled"]
    )


def test_a_heartbeat_since_the_last_record_means_quiet_and_a_tail_s_first_step_is_partial():
    tracker = HangTracker()
    tracker.begin("training rank 0", partial=True)
    tracker.step_begun(7)
    tracker.entered_span("fwd", 7)
    tracker.heartbeat()
    tracker.end()
    fact = tracker.facts["training rank 0"]
    assert fact["quiet"] and fact["entered"] == ["fwd"] and fact["entered_complete"] is False


def test_a_malformed_black_box_is_ignored_not_fatal():
    tracker = _tracker()
    tracker.stall({"reason": "stall", "open_spans": "not a list", "threads": 5})
    assert tracker.box is None and tracker.stalled


class _Span:
    def __init__(self, start_us: int) -> None:
        self.start_us = start_us


def test_a_record_a_heartbeat_interval_after_the_last_progress_says_alive_and_stopped_one_sooner_does_not():
    """Issue 26 items 5 and 10 without a watchdog: Ctrl-C's unwinding, a signal's box or a crawling
    rank's instant, written 10 s after the last progress with spans open, is what a heartbeat says;
    a healthy job stopped mid-step writes its last records within a step."""
    for last_us, quiet in ((20_000_000, True), (10_500_000, True), (10_400_000, False)):
        tracker = _tracker()
        tracker.opened({"log_type_name": "structured_logger_opened", "heartbeat_interval_s": 10.0})
        tracker.step_begun(3, 100_000)
        tracker.span_begun(_Span(500_000))  # its last progress: fwd began
        tracker.alive_after(last_us, spans_open=True, signal_us=None)
        tracker.end()
        assert tracker.facts["training rank 0"]["quiet"] is quiet, last_us


def test_between_spans_only_a_signal_long_after_the_progress_says_alive():
    """No heartbeat is written between spans: a record there says nothing, a SIGTERM received 40 s
    after the progress does."""
    tracker = _tracker()
    tracker.step_begun(3, 100_000)
    tracker.alive_after(40_100_000, spans_open=False, signal_us=None)
    assert not tracker.quiet
    tracker.alive_after(40_100_000, spans_open=False, signal_us=40_100_000)
    assert tracker.quiet


def test_the_heartbeat_interval_is_the_opening_record_s_capped_and_a_tail_with_no_progress_says_nothing():
    tracker = _tracker()
    # forged: a stuck process must not hide behind an hour
    tracker.opened({"heartbeat_interval_s": 3600.0})
    assert tracker.heartbeat_s == 300.0
    # heartbeats off: a record 10 s after the progress still says it was alive
    tracker.opened({"heartbeat_interval_s": 0})
    assert tracker.heartbeat_s == 10.0
    # a tail that began inside the open span: no progress read
    tracker.alive_after(10**12, spans_open=True, signal_us=10**12)
    assert not tracker.quiet

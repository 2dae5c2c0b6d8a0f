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
    tracker.stall({"reason": "stall", "time_us": 5, "stalled_s": 3.0, "open_spans": [{"name": "eval", "step": 2}]})
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
    assert tracker.facts["training rank 0"]["stalled"] and tracker.facts["training rank 0"]["box"]["reason"] == "SIGTERM"
    tracker.begin("training rank 1", partial=False)
    tracker.stall({"reason": "trigger", "open_spans": []})
    tracker.progress()
    tracker.end()
    assert tracker.facts["training rank 1"]["history"] == [] and not tracker.facts["training rank 1"]["stalled"]


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

"""EventQueue: bounded, never blocks, every drop counted in events and in records."""

from __future__ import annotations

import threading

import pytest

from otel_titan import structured_logger as sl
from otel_titan.core.event_queue import EventQueue
from otel_titan.core.exporter import PipelineStats
from tests.core._spans import Captured


def test_full_queue_drops_and_counts_records():
    queue = EventQueue(capacity=2)
    assert queue.put(("a",)) and queue.put(("b",), records=2)
    assert not queue.put(("c",), records=3)
    queue.put_control(("flush",))  # control events are never dropped
    assert [e[0] for e in queue.items] == ["a", "b", "flush"]
    assert (queue.dropped_events, queue.dropped_records) == (1, 3)
    assert isinstance(queue, PipelineStats)


def test_counts_are_exact_across_threads():
    queue = EventQueue(capacity=1)
    queue.put(("full",))

    def drop():
        for _ in range(10_000):
            queue.put(("x",), records=2)

    threads = [threading.Thread(target=drop) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (queue.dropped_events, queue.dropped_records) == (40_000, 80_000)


def test_the_hot_path_drops_a_span_end_as_one_record_and_an_error_as_two():
    with Captured(capacity=1) as captured:
        with sl.log_trace_span("kept"):  # its start fills the queue
            pass
        try:
            with sl.log_trace_span("failing"):
                raise ValueError
        except ValueError:
            pass
    # kept's end (1 record), failing's start (1), failing's _error + _end (2)
    assert (captured.queue.dropped_events, captured.queue.dropped_records) == (3, 4)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        EventQueue(0)

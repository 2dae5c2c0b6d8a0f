"""The bounded hand-off between the calling threads and the background processor.

A `collections.deque` is the whole data structure: `append` and `popleft` are
atomic under the GIL, so producers and the single consumer never take a lock.
The capacity is checked before appending (`len` then `append`), which can
overshoot by at most one item per concurrently producing thread: a soft bound
that keeps memory within capacity plus the number of threads, and keeps the
calling thread's cost to two C calls.

When the queue is full the event is dropped, never waited for, and the number
of *records* it would have produced is added to `dropped_records` under a lock
that only the (rare) drop path takes. Scalar values that could not be logged
(None, a tensor) are counted in `skipped_values` the same way.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

__all__ = ["EventQueue", "DEFAULT_QUEUE_SIZE"]

#: Default capacity, in captured events (a span is two events). At ~200 bytes an
#: event this bounds the queue near 13 MB, and it absorbs 50 ms of 8 threads
#: emitting flat out, which is how long the processor sleeps between drains.
DEFAULT_QUEUE_SIZE = 65536


class EventQueue:
    """A bounded, never-blocking FIFO of captured events with drop accounting.

    Example:
        >>> q = EventQueue(capacity=1)
        >>> q.put(("event",), records=1), q.put(("event",), records=2)
        (True, False)
        >>> q.dropped_records
        2
    """

    __slots__ = (
        "items",
        "capacity",
        "dropped_records",
        "dropped_events",
        "skipped_values",
        "_drop_lock",
    )

    def __init__(self, capacity: int = DEFAULT_QUEUE_SIZE) -> None:
        if capacity < 1:
            raise ValueError(f"queue capacity must be at least 1, got {capacity}")
        self.items: deque[tuple[Any, ...]] = deque()
        self.capacity = capacity
        self.dropped_records = 0
        self.dropped_events = 0
        self.skipped_values = 0
        self._drop_lock = threading.Lock()

    def put(self, event: tuple[Any, ...], records: int = 1) -> bool:
        """Append `event` unless the queue is full; count a drop otherwise.

        The hot path in `capture` inlines this (and, past half the capacity,
        also yields to the writer); this method states the rule on its own.
        """
        if len(self.items) < self.capacity:
            self.items.append(event)
            return True
        self.drop(records)
        return False

    def put_control(self, event: tuple[Any, ...]) -> None:
        """Append a control event (flush, stop) that must never be dropped."""
        self.items.append(event)

    def drop(self, records: int) -> None:
        """Count one dropped event worth `records` records."""
        with self._drop_lock:
            self.dropped_events += 1
            self.dropped_records += records

    def skip(self, values: int) -> None:
        """Count `values` scalar values that `log_trace_scalar` skipped (not numbers)."""
        with self._drop_lock:
            self.skipped_values += values

    def __len__(self) -> int:
        return len(self.items)

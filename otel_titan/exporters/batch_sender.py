"""The loop of an exporter's own sender thread: wake on a timer or when asked, send what is queued
in batches.

Why one copy: the OTLP log records (`otel_logs`) and the records stream of
``watch --otlp`` (`otlp_records`) each send from a thread of their own, off the
background thread, with the same rules: wait `delay_s` or until woken, send
batches of at most `batch_size` until the queue is empty, say so (`idle`), and
end once stopping is asked and the queue was drained.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["run_batches"]


def run_batches(
    queue: deque[Any],
    wake: threading.Event,
    idle: threading.Event,
    delay_s: float,
    batch_size: int,
    send: Callable[[list[Any]], None],
    stopping: Callable[[], bool],
) -> None:
    """Run the sender loop until `stopping()` is true after a drain: `send` each batch popped from
    the left of `queue`.

    Example:
        >>> sent = []
        >>> wake, idle = threading.Event(), threading.Event()
        >>> run_batches(deque(range(5)), wake, idle, 0.0, 2, sent.append, lambda: True)
        >>> sent, idle.is_set()
        ([[0, 1], [2, 3], [4]], True)
    """
    while True:
        wake.wait(delay_s)
        wake.clear()
        while queue:
            idle.clear()
            batch = []
            try:
                for _ in range(batch_size):
                    batch.append(queue.popleft())
            except IndexError:
                pass
            send(batch)
        idle.set()
        if stopping():
            return

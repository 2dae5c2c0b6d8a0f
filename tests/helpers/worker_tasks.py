"""Tasks for `otel_titan.analysis.workers.interpreters` tests, imported by name in a worker
interpreter (standard library only: it starts fast)."""

from __future__ import annotations

import time
from collections.abc import Callable


def sleep(seconds: float, on_bytes: Callable[[int], None]) -> float:
    """A task that takes `seconds` (a worker that is still running when the pool is shut down)."""
    time.sleep(seconds)
    return seconds

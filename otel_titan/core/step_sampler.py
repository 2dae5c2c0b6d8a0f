"""Per-step scalars the logger writes itself, on the background thread, at each step boundary.

The processor hands `StepSampler.after_batch` every batch's spans. When the
step of the newest record differs from the step seen before, that step has
ended (the training loop called ``set_step`` for the next one): the sampler
reads its figures (`process_figures`) and returns them as scalar records *of
the step that ended*, built by the same `SpanBuilder` as the user's own
``log_trace_scalar`` calls. So they reach every exporter, the JSONL file, the
metrics and the trace's counters alike, and the training thread does nothing
at all: no call, no timer, no extra event in its queue.

When it is read: the resident memory and CPU times at the boundary itself,
by the training loop's ``set_step`` (`BoundaryReadings`, a few microseconds),
and the scalar records carry that moment; the rest (peaks, threads, CUDA, the
host's) up to one processor interval (50 ms by default) after the boundary,
whenever the processor next wakes; at shutdown for the last step. A step
faster than that interval shares its reading with the next one (the figures
of the later step are written; none is invented).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from otel_titan.core.step_context import StepState
from otel_titan.core.warn_once import WarnOnce

__all__ = ["StepSampler"]

_log = logging.getLogger("otel_titan")


class StepSampler:
    """Turn step boundaries seen in the span stream into scalar records of `read()`'s figures.

    Args:
        builder: the processor's `SpanBuilder` (ids, Resource, clock).
        read: returns ``{name: number}`` (e.g. `ProcessFigures.read`).

    Example (not run: `init_structured_logger` builds one per processor when ``process_figures``
    is on, from the processor's span builder; tests/core/test_process_figures.py runs it):
        >>> sampler = StepSampler(builder, ProcessFigures(local_rank).read)  # doctest: +SKIP
    """

    def __init__(
        self, builder: Any, read: Callable[[], dict[str, int | float]], boundary: Any = None
    ) -> None:
        self._builder = builder
        self._read = read
        #: `BoundaryReadings`: what the training loop's ``set_step`` read when each step ended, or
        #: None.
        self._boundary = boundary
        self._state: StepState | None = None
        self._failures = WarnOnce()
        #: Step boundaries sampled.
        self.samples = 0

    def after_batch(self, spans: Sequence[Any], final: bool = False) -> list[Any]:
        """Scalar spans for the step that ended in `spans` (or, `final`, for the last step)."""
        newest: StepState | None = None
        for span in reversed(spans):
            step = getattr(span, "step", None)
            if step is not None:
                newest = StepState(
                    step, getattr(span, "relative_step", None), getattr(span, "step_tags", ()) or ()
                )
                break
        out: list[Any] = []
        previous = self._state
        if newest is not None:
            self._state = newest  # the same step keeps its latest tags
            if previous is not None and newest.step != previous.step:
                out.extend(self._sample(previous))
        if final and self._state is not None:
            out.extend(self._sample(self._state))
            self._state = None
        return out

    def _sample(self, state: StepState) -> list[Any]:
        try:
            figures = self._read()
            at = time.perf_counter_ns()
            taken = (
                self._boundary.take(state.step)
                if self._boundary is not None and state.step is not None
                else None
            )
            # read when the step ended, not now: the next step's allocations are not this one's
            if taken is not None:
                figures = {**figures, **taken[0]}
                at = taken[1]
                peak, rss = figures.get("memory/rss_peak_bytes"), figures.get("memory/rss_bytes")
                # the kernel's counters differ by a few pages
                if peak is not None and rss is not None and rss > peak:
                    figures["memory/rss_peak_bytes"] = rss
            if not figures:
                return []
            code = self._sample.__code__
            spans: list[Any] = self._builder.scalars(
                figures, at, code, code.co_firstlineno, None, state, threading.get_ident(), None
            )
            for span in spans:
                span.by_logger = True
        except Exception:  # noqa: BLE001 - a figure we cannot read must never stop the processor
            if self._failures.first():
                _log.exception(
                    "otel-titan: could not read the per-step process figures; later failures are "
                    "not logged"
                )
            return []
        self.samples += 1
        return spans

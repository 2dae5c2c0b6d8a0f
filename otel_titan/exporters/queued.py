"""A bounded queue and a thread of its own for a slow or remote exporter (OTLP, console).

otel-titan's processor calls every exporter in turn on one thread. A network
exporter that waits for a collector which is down, slow or refusing must not
hold that thread, or the JSONL file would fall behind and the capture queue
would start dropping. `QueuedSpanExporter` takes the spans, appends them to
its own bounded deque and returns at once; its thread exports them in
batches. When its queue is full it drops (counted in `dropped_spans`), never
waits. Its `shutdown` gives the backend a bounded time, then gives up.

Why not the SDK's `BatchSpanProcessor`: it logs a warning for every span it
drops (a flood when a collector is down for minutes) and exposes no drop
count; this class counts and stays quiet.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_titan.core.exporter import TitanSpanExporter

__all__ = ["QueuedSpanExporter"]

_log = logging.getLogger("otel_titan")


class QueuedSpanExporter(TitanSpanExporter):
    """Export through `exporter` from a background thread with a bounded queue.

    Args:
        exporter: the real exporter (e.g. the SDK's ``OTLPSpanExporter``).
        name: for the thread name and messages (``"otlp"``).
        max_queue_size: spans kept waiting; beyond it new spans are dropped and counted.
        max_export_batch_size: spans per ``exporter.export`` call.
        schedule_delay_s: how long the thread waits for a batch to fill.
        shutdown_timeout_s: how long `shutdown` waits for the backend before giving up.
        keep: a filter; spans for which it returns False are not queued.

    Example:
        >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        >>> queued = QueuedSpanExporter(InMemorySpanExporter(), name="memory")
        >>> queued.shutdown()
        True
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        name: str,
        max_queue_size: int = 16384,
        max_export_batch_size: int = 512,
        schedule_delay_s: float = 1.0,
        shutdown_timeout_s: float = 3.0,
        keep: Callable[[ReadableSpan], bool] | None = None,
    ) -> None:
        self.exporter = exporter
        self.name = name
        self.max_queue_size = max_queue_size
        self.max_export_batch_size = max_export_batch_size
        self.schedule_delay_s = schedule_delay_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._keep = keep
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stopping = False
        self._shut = False
        self.exported_spans = 0
        self.dropped_spans = 0
        self.failed_spans = 0
        self._in_flight = 0
        self._last_failure_log = 0.0
        self._thread = threading.Thread(target=self._run, name=f"otel-titan-{name}", daemon=True)
        self._thread.start()

    # -- called by otel-titan's processor -----------------------------------------------------
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Queue `spans` (dropping, and counting, what does not fit); never waits."""
        if self._shut:
            return SpanExportResult.FAILURE
        queue = self._queue
        keep = self._keep
        room = self.max_queue_size - len(queue)
        queued = 0
        for span in spans:
            if keep is not None and not keep(span):
                continue
            if queued < room:
                queue.append(span)
                queued += 1
            else:
                self.dropped_spans += 1
        if queued:
            self._idle.clear()
            if len(queue) >= self.max_export_batch_size:
                self._wake.set()
        return SpanExportResult.SUCCESS

    def delivery_losses(self) -> tuple[str, int, int]:
        """``("traces:<name>", dropped, failed)`` spans since init (the closing record, the health
        counters)."""
        return (f"traces:{self.name}", self.dropped_spans, self.failed_spans)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Start exporting what is queued now; does not wait (see `drain`)."""
        self._wake.set()
        return True

    def drain(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the queue to be exported (from any thread but the
        processor's)."""
        self._wake.set()
        return self._idle.wait(timeout_s)

    def shutdown(self) -> bool:  # type: ignore[override]  # drains the queue before the wrapped exporter's shutdown; its own signature
        """Export what is queued within `shutdown_timeout_s`, then shut the exporter down.

        Returns False when the backend did not take everything in time (the
        rest is counted in `dropped_spans`).
        """
        if self._shut:
            return True
        deadline = time.monotonic() + self.shutdown_timeout_s
        self._stopping = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        finished = not self._thread.is_alive()
        self._shut = True
        if not finished:
            # Still queued, plus the batch the thread is stuck delivering.
            self.dropped_spans += len(self._queue) + self._in_flight
            self._queue.clear()
        try:
            if "timeout_millis" in inspect.signature(self.exporter.shutdown).parameters:
                self.exporter.shutdown(timeout_millis=max(0.0, deadline - time.monotonic()) * 1000)  # type: ignore[call-arg]  # its signature takes one: checked just above
            else:
                self.exporter.shutdown()
        except Exception:  # noqa: BLE001 - shutting down: report, do not raise
            _log.warning(
                "otel-titan: %s exporter failed to shut down cleanly", self.name, exc_info=True
            )
        if not finished:
            _log.warning(
                "otel-titan: %s exporter did not finish within %.1f s at shutdown; %d spans in "
                "all were not delivered",
                self.name,
                self.shutdown_timeout_s,
                self.dropped_spans + self.failed_spans,
            )
        return finished

    # -- the thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        queue = self._queue
        while True:
            self._wake.wait(self.schedule_delay_s)
            self._wake.clear()
            while True:
                while queue:
                    count = min(self.max_export_batch_size, len(queue))
                    batch = [queue.popleft() for _ in range(count)]
                    self._export(batch)
                    if self._shut:
                        return
                self._idle.set()
                if not queue:  # nothing slipped in between the loop and `set`
                    break
                self._idle.clear()
            if self._stopping:
                return

    def _export(self, batch: list[ReadableSpan]) -> None:
        self._in_flight = len(batch)
        try:
            result = self.exporter.export(batch)
        except Exception:  # noqa: BLE001 - a broken exporter must not kill the thread
            result = SpanExportResult.FAILURE
            self._report_failure(exc_info=True)
        finally:
            self._in_flight = 0
        if self._shut:  # given up on at shutdown: already counted as not delivered
            return
        if result is SpanExportResult.SUCCESS:
            self.exported_spans += len(batch)
        else:
            self.failed_spans += len(batch)
            self._report_failure()

    def _report_failure(self, exc_info: bool = False) -> None:
        # One line a minute at most: a collector down for an hour is one problem, not 3600.
        now = time.monotonic()
        if now - self._last_failure_log >= 60.0:
            self._last_failure_log = now
            _log.warning(
                "otel-titan: %s export failed (%d spans failed, %d dropped so far); training and "
                "the JSONL file are not affected",
                self.name,
                self.failed_spans,
                self.dropped_spans,
                exc_info=exc_info,
            )

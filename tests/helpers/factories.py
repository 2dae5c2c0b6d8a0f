"""Handler factories used by the tests, importable by path as users' factories are."""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

#: What the last call of `register_memory` received, and its exporter.
LAST: dict[str, Any] = {}


def register_memory(*, add_span_exporter, **kwargs: Any) -> None:
    """Register the SDK's in-memory exporter and remember the arguments."""
    exporter = InMemorySpanExporter()
    LAST.clear()
    LAST.update(kwargs)
    LAST["exporter"] = exporter
    add_span_exporter(exporter)


def register_raising(**_: Any) -> None:
    raise RuntimeError("factory exploded")


def register_nothing(**_: Any) -> None:
    """A factory that registers nothing at all."""


NOT_CALLABLE = 42


#: Set to let `register_gate`'s exporter go on.
GATE = threading.Event()


class _Gate(SpanExporter):
    """Holds every export until `GATE` is set: a writer stuck on a frozen filesystem."""

    def export(self, spans):
        GATE.wait(60)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        GATE.set()


def register_gate(*, add_span_exporter, **_: Any) -> None:
    """Register an exporter that blocks the processor whenever `GATE` is clear."""
    add_span_exporter(_Gate())


def register_on_rank_zero(*, structured_logger, rank, **_: Any) -> None:
    """torchtitan's pattern: one database writer for the job, attached on rank 0 only."""
    import logging

    if rank == 0:
        structured_logger.addHandler(logging.NullHandler())

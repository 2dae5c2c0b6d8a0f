"""The ids of the `sl` span open on the calling thread, for a log line written inside it.

A log record sent as an OpenTelemetry log (exporters/otel_logs.py) carries the
trace and span id of the span it was written in, so Grafana links the line to
its step's trace. The ids are the ones the processor gives that span (the same
allocators, `trace_ids.py`), computed from its handle: no span object exists on
the training thread. Outside any `sl` span, another instrumentation's active
OpenTelemetry span is used, when there is one.
"""

from __future__ import annotations

from opentelemetry import trace

from otel_titan.core.capture import _current_span
from otel_titan.core.events import H_GEN, H_SEQ
from otel_titan.core.trace_ids import trace_id_of_handle

__all__ = ["current_span_ids"]


def current_span_ids() -> tuple[int, int] | None:
    """(trace id, span id) of the span the caller is inside, or None outside any span.

    Example:
        >>> current_span_ids() is None
        True
    """
    handle = _current_span.get()
    if handle is not None:
        generation = handle[H_GEN]
        if generation.span_ids is not None and generation.trace_ids is not None:
            return trace_id_of_handle(handle, generation.trace_ids), generation.span_ids.for_seq(
                handle[H_SEQ]
            )
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        return context.trace_id, context.span_id
    return None

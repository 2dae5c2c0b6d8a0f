"""Living next to other OpenTelemetry instrumentation in the same process.

Two independent directions, both optional:

* **join** (``join_otel_context``; on by default when a global SDK
  `TracerProvider` is configured when the logger starts): a top-level `sl`
  span opened while another instrumentation's span is active becomes that
  span's child, in its trace. Cost: one `get_current_span()` per top-level
  span on the calling thread (docs/collectors.md has the figure).
* **propagate** (``propagate_otel_context=True``): while an `sl` span is open
  it is the current OpenTelemetry span, so spans that other code opens inside
  it (an HTTP client, a database driver) become its children. Cost: computing
  the span's ids on the calling thread plus an OpenTelemetry context attach
  and detach per `sl` span.

Neither changes the JSONL records, except that a joined span carries the other
instrumentation's trace id instead of the per-step one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_titan.core.events import H_SEQ
from otel_titan.core.trace_ids import SpanIdAllocator, StepTraceIds, trace_id_of_handle

__all__ = ["sdk_tracer_provider_configured", "remote_parent_hook", "propagation_hooks"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def sdk_tracer_provider_configured() -> bool:
    """Whether the program installed a real (non-proxy, non-no-op) global `TracerProvider`.

    Example:
        >>> sdk_tracer_provider_configured()
        False
    """
    provider = trace.get_tracer_provider()
    return type(provider).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider")


def remote_parent_hook() -> Callable[[], Any]:
    """The function the hot path calls for a top-level span: the active foreign span context, or
    None."""
    get_current_span = trace.get_current_span

    def remote_parent() -> Any:
        context = get_current_span().get_span_context()
        return context if context.is_valid else None

    return remote_parent


def propagation_hooks(
    trace_ids: StepTraceIds, span_ids: SpanIdAllocator
) -> tuple[Callable[[tuple[Any, ...]], Any], Callable[[Any], None]]:
    """(attach, detach) making each open `sl` span the current OpenTelemetry span.

    The ids are the same the processor will give the span (same allocators),
    so other instrumentation's children point at the real `sl` span.
    """
    attach = otel_context.attach
    detach = otel_context.detach
    set_span_in_context = trace.set_span_in_context

    def propagate(handle: tuple[Any, ...]) -> Any:
        span_context = SpanContext(
            trace_id_of_handle(handle, trace_ids), span_ids.for_seq(handle[H_SEQ]), False, _SAMPLED
        )
        return attach(set_span_in_context(NonRecordingSpan(span_context)))

    return propagate, detach

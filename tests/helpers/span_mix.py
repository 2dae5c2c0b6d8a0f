"""A mix of real TitanSpans covering what OTLP must carry, from the real logger in this process.

Spans, nested spans, instants and scalars inside spans (events) and at top
level, errors (status, exception event), descriptions, step tags, a span in an
asyncio task, a child of a remote parent (another service's context), internal
instants with every attribute type, the incomplete copy of a span left open at
shutdown, a span with links, and a few plain SDK spans for the fallback path.
"""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags, TraceState

from otel_titan import structured_logger as sl
from otel_titan.core.capture import emit_internal_instant
from otel_titan.core.titan_span import TitanSpan

REMOTE = SpanContext(
    0x0AF7651916CD43DD8448EB211C80319C,
    0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(1),
    trace_state=TraceState([("vendor", "x1")]),
)


def titan_spans(output_dir: str) -> list[ReadableSpan]:
    """Run a small instrumented workload with the in-memory exporter; return what it exported."""
    captured: dict[str, Any] = {}

    def register(*, add_span_exporter: Any, **_: Any) -> None:
        captured["exporter"] = InMemorySpanExporter()
        add_span_exporter(captured["exporter"])

    sl.init_structured_logger(
        "training",
        output_dir,
        rank=3,
        world_size=8,
        run_id="equivalence",
        handlers=[register],
        join_otel_context=True,
    )
    try:
        sl.log_trace_instant("training_start")
        for step in range(1, 4):
            sl.set_step(step, relative_step=step - 1)
            if step == 2:
                sl.add_step_tag("gc")
                sl.add_step_tag("ckpt")
            with sl.log_trace_span("fwd_bwd", "forward and backward"):
                with sl.log_trace_span("forward"):
                    sl.log_trace_instant("micro_batch_done")
                # a plain child: the encoder's fast path with a local parent
                with sl.log_trace_span("backward"):
                    pass
                sl.log_trace_scalar({"loss": 2.5 / step, "tokens": 4096 * step, "neg": -7})
            try:
                with sl.log_trace_span("optimizer"):
                    if step == 3:
                        raise RuntimeError("nan in grads: ünïcode")
            except RuntimeError:
                pass
            sl.log_trace_scalar({"lr": 3e-4, "big": 2**62})

        async def task_body() -> None:
            with sl.log_trace_span("rollout"):
                await asyncio.sleep(0)

        asyncio.run(task_body())
        emit_internal_instant(
            "internal",
            {
                "s": "text",
                "i": -(2**63),
                "f": 1.25,
                "b": True,
                "l": ["a", "b"],
                "n": [1, 2.5, True],
            },
        )
        token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(REMOTE)))
        try:
            with sl.log_trace_span("remote_child"):
                pass
        finally:
            otel_context.detach(token)
        with sl.log_trace_span("hung_at_shutdown"):
            sl.shutdown_structured_logger()
    finally:
        sl.shutdown_structured_logger()
    spans = list(captured["exporter"].get_finished_spans())
    assert any(getattr(s, "incomplete", False) for s in spans), (
        "the open span's incomplete copy was not exported"
    )
    linked = next(s for s in spans if isinstance(s, TitanSpan) and s.name == "forward")
    linked._links = (Link(REMOTE, {"titan.link": "step", "n": 1}), Link(spans[0].context))
    return spans + foreign_spans()


def foreign_spans() -> list[ReadableSpan]:
    """Plain SDK spans (another instrumentation's): the encoder hands them to the SDK's encoder."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("other.lib", "1.0")
    with tracer.start_as_current_span("http_request", attributes={"http.method": "GET"}) as span:
        span.add_event("got", {"bytes": 12})
        with tracer.start_as_current_span("db"):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())

"""The ``sl.*`` API: torchtitan's structured logger on OpenTelemetry spans.

The top layer: the calls themselves live in `otel_titan.core` (capture,
step context) and are re-exported here; this package adds the wiring.

Data flow (one concern per module)::

    sl.log_trace_span / log_trace_instant / log_trace_scalar     core/capture.py   (calling thread)
        │  step + tags from core/step_context.py, caller frame, thread, task, ids
        ▼
    EventQueue (bounded deque, drops counted, never blocks)      core/event_queue.py
        ▼
    BatchProcessor thread (every 50 ms or on flush)              core/processor.py
        │  SpanBuilder: tuples → OpenTelemetry ReadableSpans     core/span_builder.py, trace_ids.py
        ▼
    exporters registered by handler factories                   handler_factories.py,
    core/exporter.py
        ├── JsonlSpanExporter → structured_logs/*.jsonl          otel_titan/exporters/jsonl.py
        └── any SDK SpanExporter (OTLP, console, yours)

    init / flush / shutdown                                      lifecycle.py, validation.py
    the running logger's state                                   runtime.py
    atexit, SIGTERM, fork                                        process_hooks.py, sigterm.py
    rank, world, run id, Resource                                core/identity.py

Example:
    >>> from otel_titan import structured_logger as sl
    >>> with sl.log_trace_span("fwd_bwd"):   # a no-op until init_structured_logger()
    ...     pass
"""

from otel_titan.core.capture import SpanScope, log_trace_instant, log_trace_scalar, log_trace_span
from otel_titan.core.exporter import HandlerFactoryError, HandlerSkipped
from otel_titan.core.identity import RunIdentity
from otel_titan.core.options import LoggerOptions
from otel_titan.core.step_context import (
    add_step_tag,
    clear_step_tags,
    get_relative_step,
    get_step,
    get_step_tags,
    set_step,
)

# The variables' public names since the first release (otel_titan.environment_variables defines
# them).
from otel_titan.environment_variables import OTEL_TITAN_HANDLERS as HANDLERS_ENV
from otel_titan.environment_variables import TITAN_STRUCT_LOGGER_HANDLERS as TORCHTITAN_HANDLERS_ENV
from otel_titan.exporters.compat import TraceEventsOnlyFilter, TraceJsonlFormatter
from otel_titan.structured_logger.lifecycle import (
    flush_structured_logger,
    get_exporters,
    get_run_identity,
    init_structured_logger,
    is_initialized,
    shutdown_structured_logger,
)
from otel_titan.structured_logger.run_config import log_run_config

__all__ = [
    "init_structured_logger",
    "flush_structured_logger",
    "shutdown_structured_logger",
    "is_initialized",
    "get_run_identity",
    "get_exporters",
    "log_trace_span",
    "log_trace_instant",
    "log_trace_scalar",
    "log_run_config",
    "set_step",
    "get_step",
    "get_relative_step",
    "add_step_tag",
    "clear_step_tags",
    "get_step_tags",
    "SpanScope",
    "RunIdentity",
    "LoggerOptions",
    "HandlerFactoryError",
    "HandlerSkipped",
    "HANDLERS_ENV",
    "TORCHTITAN_HANDLERS_ENV",
    "TraceJsonlFormatter",
    "TraceEventsOnlyFilter",
]

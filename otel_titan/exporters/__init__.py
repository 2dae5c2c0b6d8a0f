"""Exporters: where spans go once the background processor has built them.

They implement the interface of `otel_titan.core.exporter` and import only
`otel_titan.core` and `otel_titan.schema` (never the ``sl.*`` API above them).

* `jsonl` – the default per-process JSONL file (torchtitan's record format);
* `otlp` – OTLP (collector, Jaeger, Tempo) and console handlers, selected by `otel_env`;
* `queued` – a bounded queue and thread of its own for slow or remote exporters;
* `logging_bridge` – torchtitan-style `logging.Handler`s;
* `compat` – torchtitan's `TraceJsonlFormatter` and `TraceEventsOnlyFilter` for logging handlers;
* `records` – the record encoder (span → JSONL line; names from `otel_titan.schema`);
* `rotating_file` – size-bounded raw-fd file segments.
"""

from otel_titan.core.exporter import StartAwareSpanExporter
from otel_titan.exporters.jsonl import JsonlSpanExporter, register_jsonl_handler
from otel_titan.exporters.queued import QueuedSpanExporter

__all__ = [
    "StartAwareSpanExporter",
    "JsonlSpanExporter",
    "register_jsonl_handler",
    "QueuedSpanExporter",
]

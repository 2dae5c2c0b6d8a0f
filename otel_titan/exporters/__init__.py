"""Exporters: where spans go once the background processor has built them.

* `jsonl` – the default per-process JSONL file (torchtitan's record format);
* `otlp` – OTLP (collector, Jaeger, Tempo) and console handlers, selected by `otel_env`;
* `queued` – a bounded queue and thread of its own for slow or remote exporters;
* `logging_bridge` – torchtitan-style `logging.Handler`s;
* `base` – the handler interface (`StartAwareSpanExporter`);
* `records` – the record schema (span → dict/line);
* `rotating_file` – size-bounded raw-fd file segments.
"""

from otel_titan.core.exporter import StartAwareSpanExporter
from otel_titan.exporters.jsonl import JsonlSpanExporter, register_jsonl_handler
from otel_titan.exporters.queued import QueuedSpanExporter

__all__ = ["StartAwareSpanExporter", "JsonlSpanExporter", "register_jsonl_handler", "QueuedSpanExporter"]

"""Exporters: where spans go once the background processor has built them.

* `jsonl` – the default per-process JSONL file (torchtitan's record format);
* `base` – the handler interface (`StartAwareSpanExporter`);
* `records` – the record schema (span → dict/line);
* `rotating_file` – size-bounded raw-fd file segments.
"""

from otel_titan.exporters.base import StartAwareSpanExporter
from otel_titan.exporters.jsonl import JsonlSpanExporter, register_jsonl_handler

__all__ = ["StartAwareSpanExporter", "JsonlSpanExporter", "register_jsonl_handler"]

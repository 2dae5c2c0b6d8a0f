"""Compatibility layers: other projects' APIs running on otel-titan, unchanged
(docs/migrating-from-torchtitan.md).

The top layer beside the CLI (pyproject.toml's contracts): a layer imports the
writer (`otel_titan.structured_logger`) and, for tools, the reader
(`otel_titan.analysis`); nothing below imports it. Nothing here is imported
unless asked for.

* `otel_titan.compat.torchtitan`: torchtitan's
  ``torchtitan.observability.structured_logger`` package (``sl.*``, handler
  factories, ``TraceJsonlFormatter``, the Gantt generator), installed under
  torchtitan's own import path by `otel_titan.compat.torchtitan.install`.
"""

"""The pipeline: capture on the calling thread, a bounded queue, spans built on one background
thread.

It knows no exporter implementation, only the interface in `exporter.py`
(every hook the pipeline calls is declared there). Above it: `otel_titan.exporters`
(implementations) and `otel_titan.structured_logger` (the ``sl.*`` API and
the process wiring); below it only `otel_titan.schema`.

* `events` – the layout of every captured tuple, defined once;
* `capture` – the hot path (``log_trace_span`` / ``_instant`` / ``_scalar``) and its state;
* `step_context` – step and tags, per training loop, thread and task;
* `event_queue`, `clock`, `trace_ids`, `identity`, `options`;
* `titan_span`, `span_builder` – the span model and how tuples become spans;
* `processor` – the background thread; `exporter` – the exporter interface;
* `otel_context` – interop with other OpenTelemetry instrumentation;
* `warn_once` – the one warn-the-first-time helper.
"""

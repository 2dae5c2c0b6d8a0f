"""Interop with other OpenTelemetry instrumentation in the same process (real SDK
TracerProvider)."""

from __future__ import annotations

import json

from tests.conftest import run_python

_SETUP = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_titan import structured_logger as sl

other = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(other))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("someone.else")
"""

_REPORT = """
sl.shutdown_structured_logger()
import glob
records = [json.loads(l) for f in glob.glob(sys.argv[1] + "/structured_logs/*.jsonl") for l in open(f)]
theirs = [{"name": s.name, "span_id": f"{s.context.span_id:016x}", "trace_id": f"{s.context.trace_id:032x}",
           "parent": f"{s.parent.span_id:016x}" if s.parent else None} for s in other.get_finished_spans()]
print(json.dumps({"records": records, "theirs": theirs}))
"""


def run(tmp_path, body):
    result = run_python(_SETUP + body + _REPORT, str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_an_sl_span_inside_another_instrumentations_span_becomes_its_child(tmp_path):
    out = run(
        tmp_path,
        """
sl.init_structured_logger("training", sys.argv[1], world_size=1)  # a TracerProvider is set: joining is on
sl.set_step(1)
with tracer.start_as_current_span("http_request"):
    with sl.log_trace_span("handler"):
        with sl.log_trace_span("inner"):
            pass
with sl.log_trace_span("outside"):
    pass
""",
    )
    (request,) = out["theirs"]
    spans = {r["log_type_name"]: r for r in out["records"]}
    assert spans["handler_start"]["parent_span_id"] == request["span_id"]
    assert (
        spans["handler_start"]["trace_id"]
        == request["trace_id"]
        == spans["inner_start"]["trace_id"]
    )
    assert spans["inner_start"]["parent_span_id"] == spans["handler_start"]["span_id"]
    assert (
        spans["outside_start"]["parent_span_id"] is None
        and spans["outside_start"]["trace_id"] != request["trace_id"]
    )


def test_joining_can_be_switched_off(tmp_path):
    out = run(
        tmp_path,
        """
sl.init_structured_logger("training", sys.argv[1], world_size=1, join_otel_context=False)
with tracer.start_as_current_span("http_request"):
    with sl.log_trace_span("handler"):
        pass
""",
    )
    handler = [r for r in out["records"] if r["log_type_name"] == "handler_start"][0]
    assert handler["parent_span_id"] is None


def test_propagation_makes_other_spans_children_of_the_sl_span(tmp_path):
    out = run(
        tmp_path,
        """
sl.init_structured_logger("training", sys.argv[1], world_size=1, propagate_otel_context=True)
sl.set_step(7)
with sl.log_trace_span("checkpoint"):
    with sl.log_trace_span("upload"):
        with tracer.start_as_current_span("s3.put_object"):
            pass
with tracer.start_as_current_span("after"):
    pass
""",
    )
    theirs = {s["name"]: s for s in out["theirs"]}
    upload = [r for r in out["records"] if r["log_type_name"] == "upload_start"][0]
    assert theirs["s3.put_object"]["parent"] == upload["span_id"]
    assert theirs["s3.put_object"]["trace_id"] == upload["trace_id"]
    assert theirs["after"]["parent"] is None  # detached again when the sl span ended

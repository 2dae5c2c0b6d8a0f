"""Parents captured under another logger: a forked child, a re-initialised logger.

A child process forked inside an open span (DataLoader workers are forked inside
the step span) inherits that span as its current one. The ids its spans name
as their parent must be the ones the parent process's file records.
"""

from __future__ import annotations

import glob
import os

from tests.conftest import read_records, run_python


def _file_of(run_dir, source):
    (path,) = glob.glob(os.path.join(run_dir, "structured_logs", f"{source}.*.jsonl"))
    return read_records(path)


def _by_name(records):
    return {r["log_type_name"]: r for r in records}


_FORK_INSIDE_A_SPAN = """
import multiprocessing as mp
import os, sys
from otel_titan import structured_logger as sl

run = sys.argv[1]

def worker_body(source):
    sl.init_structured_logger(source, run, rank=0, world_size=1, run_id="r")
    with sl.log_trace_span("getitem"):
        sl.log_trace_instant("decoded")
    sl.log_trace_scalar({"bytes": 10})

def mp_worker():
    worker_body("mp_worker")
    sl.shutdown_structured_logger()

sl.init_structured_logger("training", run, rank=0, world_size=1, run_id="r")
sl.set_step(3)
with sl.log_trace_span("step"):
    with sl.log_trace_span("data_fetch"):
        process = mp.get_context("fork").Process(target=mp_worker)
        process.start()
        pid = os.fork()
        if pid == 0:
            worker_body("fork_worker")
    # The os.fork child leaves the inherited spans here, as the parent does.
if pid == 0:
    sl.shutdown_structured_logger()
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
process.join(60)
assert process.exitcode == 0
sl.shutdown_structured_logger()
"""


def test_a_child_forked_inside_a_span_names_the_parents_real_span(run_dir):
    result = run_python(_FORK_INSIDE_A_SPAN, str(run_dir), timeout=120)
    assert result.returncode == 0, result.stderr
    parent = _by_name(_file_of(run_dir, "training"))
    fetch = parent["data_fetch_start"]
    assert parent["data_fetch_end"]["span_id"] == fetch["span_id"]
    assert fetch["parent_span_id"] == parent["step_start"]["span_id"]
    for source in ("fork_worker", "mp_worker"):
        records = _file_of(run_dir, source)
        child = _by_name(records)
        getitem, decoded, scalar = child["getitem_start"], child["decoded"], child["metric_value"]
        # Children of the parent's open span point at the id the parent's file records, in its
        # trace.
        assert getitem["parent_span_id"] == fetch["span_id"], source
        assert scalar["parent_span_id"] == fetch["span_id"], source
        assert getitem["trace_id"] == scalar["trace_id"] == fetch["trace_id"], source
        # The child's own nesting is unchanged.
        assert decoded["parent_span_id"] == getitem["span_id"] == child["getitem_end"]["span_id"]
        # The child never ends the parent's spans in its own file (they were not its own).
        names = [r["log_type_name"] for r in records]
        assert names == [
            "structured_logger_opened",
            "getitem_start",
            "decoded",
            "getitem_end",
            "metric_value",
            "structured_logger_closed",
        ], (source, names)


def test_a_parent_captured_under_a_logger_without_ids_is_null_not_invented():
    # The rule's other half: when the parent's own ids are unknown, the parent is null.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from otel_titan.core import capture
    from otel_titan.core.span_builder import SpanBuilder
    from otel_titan.core.step_context import NO_STEP
    from otel_titan.core.trace_ids import SpanIdAllocator, StepTraceIds

    def handle(seq, parent, generation):
        code = test_a_parent_captured_under_a_logger_without_ids_is_null_not_invented.__code__
        return (
            capture.START,
            seq,
            f"s{seq}",
            None,
            0,
            code,
            1,
            parent,
            NO_STEP,
            1,
            None,
            None,
            generation,
        )

    trace_ids, span_ids = StepTraceIds("r", 0), SpanIdAllocator()
    builder = SpanBuilder(Resource.get_empty(), InstrumentationScope("t"), trace_ids, span_ids)
    mine = capture.Generation(trace_ids, span_ids)
    anonymous_parent = handle(1, None, capture.Generation())
    assert builder.started(handle(2, anonymous_parent, mine)).parent is None
    other_trace_ids, other_span_ids = StepTraceIds("r", 0), SpanIdAllocator()
    known_parent = handle(3, None, capture.Generation(other_trace_ids, other_span_ids))
    child = builder.started(handle(4, known_parent, mine))
    assert child.parent.span_id == other_span_ids.for_seq(3) != span_ids.for_seq(3)
    assert child.context.trace_id == other_trace_ids.for_step(None)


# -- SpanBuilder on its own: captured tuples in, TitanSpans out (no logger, no thread) -------------
def test_builder_a_span_whose_start_was_dropped_is_still_built_from_its_end():
    from otel_titan.core import events
    from tests.core._spans import Captured

    with Captured() as captured:
        with sl_span("fwd_bwd"):
            pass
    start, end = captured.events()
    builder = captured.builder
    # START never reached the builder
    span = builder.ended(end[events.END_HANDLE], end[events.END_MONO], None)
    assert (
        span.name == "fwd_bwd"
        and span.end_time - span.start_time == end[events.END_MONO] - start[events.H_MONO]
    )
    assert builder.open_spans() == []


def test_builder_an_error_sets_status_and_an_exception_event():
    from opentelemetry.trace import StatusCode

    from otel_titan.core import events
    from tests.core._spans import Captured

    with Captured() as captured:
        try:
            with sl_span("optimizer"):
                raise ValueError("nan in grads")
        except ValueError:
            pass
    start, end = captured.events()
    builder = captured.builder
    assert builder.open_spans() == [] and builder.started(start) in builder.open_spans()
    span = builder.ended(end[events.END_HANDLE], end[events.END_MONO], end[events.END_ERROR])
    assert (
        span.status.status_code is StatusCode.ERROR
        and span.status.description == "ValueError: nan in grads"
    )
    (exception,) = span.events
    assert (
        exception.attributes["exception.type"] == "ValueError"
        and "raise ValueError" in exception.attributes["exception.stacktrace"]
    )
    assert span.attributes["error.type"] == "ValueError"


def test_builder_ids_are_the_allocators_and_steps_name_the_trace():
    from otel_titan.core import events
    from tests.core._spans import Captured

    with Captured() as captured:
        import otel_titan.structured_logger as sl

        sl.set_step(3)
        try:
            with sl_span("a"):
                pass
        finally:
            sl.set_step(None)
    start, _ = captured.events()
    builder = captured.builder
    span = builder.started(start)
    assert span.context.span_id == builder.span_ids.for_seq(start[events.H_SEQ])
    assert span.context.trace_id == builder.trace_ids.for_step(3)
    assert span.attributes["titan.step"] == 3


def sl_span(name):
    from otel_titan import structured_logger as sl

    return sl.log_trace_span(name)


def test_the_span_context_shortcut_matches_the_sdk_constructor():
    from otel_titan.core import span_builder

    assert span_builder._tuple_layout_matches()  # with this SDK, the fast path is taken...
    assert span_builder._context is not span_builder._checked_context
    # ...and builds the same context
    assert span_builder._context(7, 9) == span_builder._checked_context(7, 9)

"""The record schema: lines() and records() agree, every value reads back, names are safe."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Status, StatusCode

from otel_titan.core.identity import discover_identity
from otel_titan.core.span_builder import _context
from otel_titan.core.titan_span import RecordKind, TitanSpan, fields_of
from otel_titan.core.trace_ids import SpanIdAllocator
from otel_titan.exporters.records import RecordEncoder, json_safe_number

IDENTITY = discover_identity(
    "training", environ={"RANK": "2", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "run"}
)
SpanClass = TitanSpan.bind(Resource.get_empty(), InstrumentationScope("t"))
ids = SpanIdAllocator(salt=1)

text = st.text(min_size=1, max_size=40)
numbers = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True)
)


def make(kind, name, step, tags, task, description, value=None, error=None, parent=True):
    span = SpanClass.make(
        name,
        _context(123456789, ids.for_seq(1)),
        _context(123456789, ids.for_seq(2)) if parent else None,
        1_796_000_000_000_000_000,
        None,
        kind,
        step,
        None if step is None else step + 1,
        tags,
        task,
        "dir/file.py",
        12,
        "func",
        77,
    )
    span.description = description
    if kind == RecordKind.SCALAR:
        span.metric_name, span.metric_value = name, value
    span._finish(1_796_000_000_123_456_789) if kind == RecordKind.SPAN and error is None else None
    if error is not None:
        span.error_type, span.error_message = error
        span._finish(
            1_796_000_000_123_456_789,
            Status(StatusCode.ERROR, "x"),
            Event("exception", {"exception.type": error[0], "exception.message": error[1]}),
        )
    return span


def lines_as_records(kind_args, ended):
    # Two encoders with the same history, so delta_ms agrees.
    a, b = RecordEncoder(IDENTITY), RecordEncoder(IDENTITY)
    span_a, span_b = make(*kind_args), make(*kind_args)
    parsed = [json.loads(line) for line in a.lines(ended, span_a)]
    built = [b.full_record(r) for r in b.records(ended, span_b)]
    return parsed, built


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from([RecordKind.SPAN, RecordKind.INSTANT, RecordKind.SCALAR]),
    name=text,
    step=st.one_of(st.none(), st.integers(-(2**40), 2**40)),
    tags=st.lists(text, max_size=3).map(tuple),
    task=st.one_of(st.none(), text),
    description=st.one_of(st.none(), text),
    value=numbers,
    error=st.one_of(st.none(), st.tuples(text, st.text(max_size=40))),
    ended=st.booleans(),
)
def test_lines_parse_to_exactly_the_records(
    kind, name, step, tags, task, description, value, error, ended
):
    error = error if kind == RecordKind.SPAN else None
    parsed, built = lines_as_records(
        (kind, name, step, tags, task, description, value, error), ended
    )
    assert len(parsed) == len(built) >= 1
    for line, record in zip(parsed, built, strict=False):
        assert line.pop("seq_id") >= 1
        assert line == json.loads(json.dumps(record))
        if kind == RecordKind.SCALAR:
            assert line["event_name"] == name and line["value"] == json_safe_number(value)
        if kind == RecordKind.INSTANT:
            assert line["log_type_name"] == name


def test_span_record_fields_and_error_pair():
    encoder = RecordEncoder(IDENTITY)
    span = make(RecordKind.SPAN, "optim", 5, ("gc",), "Task-3", None, error=("ValueError", "boom"))
    start = json.loads(encoder.lines(False, span)[0])
    error, end = (json.loads(line) for line in encoder.lines(True, span))
    assert (
        start["log_type_name"] == "optim_start"
        and error["log_type_name"] == "optim_error"
        and end["log_type_name"] == "optim_end"
    )
    assert end["value"] == 123.456789 and "value" not in error
    assert (start["step"], start["relative_step"], start["step_tags"], start["task_name"]) == (
        5,
        6,
        ["gc"],
        "Task-3",
    )
    assert start["caller"] == "dir/file.py:12:func" and start["tid"] == 77
    assert (
        start["trace_id"] == f"{123456789:032x}"
        and start["span_id"] == end["span_id"]
        and start["parent_span_id"]
    )
    assert (error["error_type"], error["error_message"], error["log_level"]) == (
        "ValueError",
        "boom",
        "ERROR",
    )
    assert [start["seq_id"], error["seq_id"], end["seq_id"]] == [1, 2, 3]
    for record in (start, error, end):
        assert (
            record["rank"] == record["global_rank"] == 2
            and record["world_size"] == 4
            and record["run_id"] == "run"
        )


def test_awkward_strings_round_trip_including_lone_surrogates():
    encoder = RecordEncoder(IDENTITY)
    for name in [
        'quote"back\\slash',
        "new\nline\ttab\x00nul",
        "ünïcødé ✓",
        "\ud800lone",
        "x" * 1_000_000,
    ]:
        span = make(RecordKind.INSTANT, name, None, (), None, None)
        (line,) = encoder.lines(True, span)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert json.loads(line)["log_type_name"] == name


def test_foreign_readable_spans_are_read_through_their_attributes():
    from opentelemetry.sdk.trace import ReadableSpan

    span = make(RecordKind.SPAN, "x", 3, ("a",), None, "d")
    foreign = ReadableSpan(
        "x",
        context=span.context,
        parent=span.parent,
        attributes=dict(span.attributes),
        start_time=span.start_time,
        end_time=span.end_time,
    )
    view = fields_of(foreign)
    assert (
        view.step,
        view.step_tags,
        view.description,
        view.code_file,
        view.code_line,
        view.thread_id,
    ) == (3, ("a",), "d", "dir/file.py", 12, 77)
    assert [
        json.loads(x)["log_type_name"] for x in RecordEncoder(IDENTITY).lines(True, foreign)
    ] == ["x_end"]


def test_fast_span_construction_matches_the_sdk_layout():
    from otel_titan.core import titan_span

    assert titan_span._SDK_LAYOUT_MATCHES, (
        "opentelemetry-sdk changed ReadableSpan's fields: review TitanSpan.make"
    )
    span = make(RecordKind.SPAN, "x", 1, (), None, None)
    assert (
        span.name == "x"
        and span.kind.name == "INTERNAL"
        and span.status.status_code is StatusCode.UNSET
    )
    assert span.events == () and span.links == () and span.attributes["titan.step"] == 1
    assert json.loads(span.to_json())["name"] == "x"

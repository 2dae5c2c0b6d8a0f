"""The event layouts of core/events.py are the ones capture builds and the builder takes apart."""

from __future__ import annotations

import inspect

from otel_titan import structured_logger as sl
from otel_titan.core import events
from otel_titan.core.span_builder import SpanBuilder
from tests.core._spans import Captured, this_line


def test_the_builder_takes_instant_and_scalar_fields_in_the_declared_order():
    # The processor calls builder.instant(*event[1:]) and builder.scalars(*event[1:]).
    assert tuple(inspect.signature(SpanBuilder.instant).parameters)[1:] == events.INSTANT_FIELDS
    assert tuple(inspect.signature(SpanBuilder.scalars).parameters)[1:] == events.SCALAR_FIELDS


def test_a_captured_span_matches_the_handle_layout():
    with Captured() as captured:
        with sl.log_trace_span("outer", "why"):
            line = this_line() - 1
            with sl.log_trace_span("inner"):
                pass
    outer, inner, inner_end, outer_end = captured.events()
    assert len(outer) == len(events.HANDLE_FIELDS)
    assert (
        outer[0] == events.START
        and outer[events.H_NAME] == "outer"
        and outer[events.H_DESCRIPTION] == "why"
    )
    assert (
        outer[events.H_LINE] == line
        and outer[events.H_CODE].co_name == "test_a_captured_span_matches_the_handle_layout"
    )
    assert inner[events.H_PARENT] is outer and inner[events.H_SEQ] > outer[events.H_SEQ]
    assert outer[events.H_GEN] is inner[events.H_GEN] is not None
    assert (
        inner_end[0] == events.END
        and inner_end[events.END_HANDLE] is inner
        and inner_end[events.END_ERROR] is None
    )
    assert outer_end[events.END_MONO] >= inner_end[events.END_MONO] >= inner[events.H_MONO]


def test_instant_and_scalar_events_match_their_layouts():
    with Captured() as captured:
        sl.set_step(7)
        try:
            with sl.log_trace_span("step"):
                sl.log_trace_instant("marker")
                sl.log_trace_scalar({"loss": 1.5})
        finally:
            sl.set_step(None)
    start, instant, scalar, _end = captured.events()
    fields = dict(zip(events.INSTANT_FIELDS, instant[1:], strict=True))
    assert (
        instant[0] == events.INSTANT
        and fields["name"] == "marker"
        and fields["parent_handle"] is start
    )
    assert fields["state"].step == 7 and fields["extra"] is None
    fields = dict(zip(events.SCALAR_FIELDS, scalar[1:], strict=True))
    assert (
        scalar[0] == events.SCALAR
        and fields["values"] == {"loss": 1.5}
        and fields["parent_handle"] is start
    )
    assert fields["tid"] == start[events.H_TID] and fields["task"] is None


def test_captured_events_build_into_spans():
    with Captured() as captured:
        with sl.log_trace_span("outer"):
            sl.log_trace_instant("marker")
            sl.log_trace_scalar({"loss": 1.5, "lr": 0.1})
    builder = captured.builder
    start, instant, scalar, end = captured.events()
    outer = builder.started(start)
    mark = builder.instant(*instant[1:])
    loss, lr = builder.scalars(*scalar[1:])
    finished = builder.ended(end[events.END_HANDLE], end[events.END_MONO], end[events.END_ERROR])
    assert finished is outer and outer.end_time >= outer.start_time
    assert mark.parent.span_id == outer.context.span_id == loss.parent.span_id
    assert (loss.metric_name, loss.metric_value, lr.metric_name) == ("loss", 1.5, "lr")
    assert [event.name for event in outer.events] == ["marker", "loss", "lr"]

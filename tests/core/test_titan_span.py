"""TitanSpan: the span model handed to exporters."""

from __future__ import annotations

from otel_titan import structured_logger as sl
from otel_titan.core import events
from tests.core._spans import Captured


def _open_span_with_an_event():
    with Captured() as captured:
        with sl.log_trace_span("hung_phase", "a phase that never ends"):
            sl.log_trace_instant("inside")
    start, instant, _end = captured.events()
    builder = captured.builder
    span = builder.started(start)
    builder.instant(*instant[1:])
    return span


def test_incomplete_copy_is_a_finished_copy_marked_incomplete():
    span = _open_span_with_an_event()
    assert span.end_time is None
    end = span.start_time + 5_000_000
    copy = span.incomplete_copy(end)
    # the open span is untouched
    assert copy is not span and span.end_time is None and not span.incomplete
    assert (copy.name, copy.context, copy.parent, copy.start_time, copy.end_time) == (
        span.name,
        span.context,
        span.parent,
        span.start_time,
        end,
    )
    assert copy.attributes["titan.incomplete"] is True and "titan.incomplete" not in span.attributes
    assert copy.attributes["titan.description"] == "a phase that never ends"
    assert [e.name for e in copy.events] == ["inside"]
    copy._events.append("later")  # the copy's events are its own list
    assert [e.name for e in span.events] == ["inside"]


def test_attributes_follow_the_schema():
    span = _open_span_with_an_event()
    attributes = span.attributes
    assert attributes["titan.record_kind"] == "span"
    assert attributes["code.function.name"] == "_open_span_with_an_event"
    assert attributes["thread.id"] > 0 and events.START == 0

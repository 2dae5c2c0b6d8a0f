"""The captured events: plain tuples, each layout defined here once, with its index constants.

The calling thread (`capture.py`) builds these tuples and the processor thread
(`processor.py`, `span_builder.py`) takes them apart. They are tuples, not
objects, for speed: a 13-field tuple costs about 58 ns to build, a namedtuple
about 360 ns, and the training thread builds one per call. So the layout is
written down here, next to the names of its fields, and both sides use these
constants; `tests/core/test_events.py` checks that the builder's parameters
follow the same order.

Index 0 is always the kind.

* a span's START is its *handle* itself (one tuple fewer per span):
  ``HANDLE_FIELDS`` = ``(START, seq, name, description, mono_ns, code, lineno,
  parent, state, tid, task, remote_parent, generation)``. It is also what the
  ContextVar of the current span holds, so a child captures its parent by
  reference and the processor can rebuild any span even if its START was dropped.
  ``generation`` is the `Generation` (one per `init_structured_logger`) the
  span was captured in (see capture.py);
* ``(END, handle, end_mono_ns, error)`` with ``error`` None or
  ``(type_name, message, TracebackException | None)``;
* ``(INSTANT, name, mono_ns, code, lineno, parent, state, tid, task, extra)``:
  `SpanBuilder.instant` takes ``event[1:]`` in this order (``INSTANT_FIELDS``);
* ``(SCALAR, values, mono_ns, code, lineno, parent, state, tid, task)``:
  `SpanBuilder.scalars` takes ``event[1:]`` in this order (``SCALAR_FIELDS``);
* ``(FLUSH, threading.Event, open_spans)``, ``(STOP,)`` and ``(BLACK_BOX, reason,
  threading.Event)`` (write the hang black box now: blackbox.py): control events.

Every timestamp is a `perf_counter_ns()` reading; the processor maps them to
wall-clock time with one offset (clock.py).

Example:
    >>> HANDLE_FIELDS[H_SEQ], HANDLE_FIELDS[H_GEN]
    ('seq', 'generation')
    >>> INSTANT_FIELDS[0], SCALAR_FIELDS[0]
    ('name', 'values')
"""

from __future__ import annotations

__all__ = [
    "START",
    "END",
    "INSTANT",
    "SCALAR",
    "FLUSH",
    "STOP",
    "BLACK_BOX",
    "HANDLE_FIELDS",
    "H_SEQ",
    "H_NAME",
    "H_DESCRIPTION",
    "H_MONO",
    "H_CODE",
    "H_LINE",
    "H_PARENT",
    "H_STATE",
    "H_TID",
    "H_TASK",
    "H_REMOTE",
    "H_GEN",
    "END_HANDLE",
    "END_MONO",
    "END_ERROR",
    "INSTANT_FIELDS",
    "SCALAR_FIELDS",
    "FLUSH_DONE",
    "FLUSH_OPEN_SPANS",
]

# Event kinds (index 0 of every event).
START, END, INSTANT, SCALAR, FLUSH, STOP, BLACK_BOX = range(7)

#: A span handle (its START event), field by field after the kind.
HANDLE_FIELDS = (
    "kind",
    "seq",
    "name",
    "description",
    "mono_ns",
    "code",
    "lineno",
    "parent",
    "state",
    "tid",
    "task",
    "remote_parent",
    "generation",
)
(
    H_SEQ,
    H_NAME,
    H_DESCRIPTION,
    H_MONO,
    H_CODE,
    H_LINE,
    H_PARENT,
    H_STATE,
    H_TID,
    H_TASK,
    H_REMOTE,
    H_GEN,
) = range(1, 13)

#: ``(END, handle, end_mono_ns, error)``.
END_HANDLE, END_MONO, END_ERROR = 1, 2, 3

#: ``event[1:]`` of an INSTANT, in order: the parameters of `SpanBuilder.instant`.
INSTANT_FIELDS = (
    "name",
    "mono",
    "code",
    "lineno",
    "parent_handle",
    "state",
    "tid",
    "task",
    "extra",
)
#: ``event[1:]`` of a SCALAR, in order: the parameters of `SpanBuilder.scalars`.
SCALAR_FIELDS = ("values", "mono", "code", "lineno", "parent_handle", "state", "tid", "task")

#: ``(FLUSH, done_event, open_spans)``.
FLUSH_DONE, FLUSH_OPEN_SPANS = 1, 2

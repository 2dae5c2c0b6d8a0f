"""`TitanSpan`: the OpenTelemetry `ReadableSpan` every `sl` call becomes.

It is a real SDK `ReadableSpan` (OTLP, console and your own exporters take it
as is) that also carries the structured-logging fields as typed attributes
(``span.step``, ``span.step_tags``, ``span.code_file``…), so the JSONL writer
reads them without going through an attribute dict. The OpenTelemetry
attribute dict (``span.attributes``) is derived from those fields the first
time someone asks for it: an exporter that never looks pays nothing.

Attribute names (docs/schema.md has the full table):

* ``titan.record_kind``: ``"span"``, ``"instant"`` or ``"scalar"``;
* ``titan.step``, ``titan.relative_step``, ``titan.step_tags`` when set;
* ``titan.description``, ``titan.task_name`` when present;
* ``titan.metric.name`` / ``titan.metric.value`` on scalars;
* ``code.file.path``, ``code.line.number``, ``code.function.name``, ``thread.id``
  (OpenTelemetry semantic conventions);
* ``error.type`` on failed spans (with status ERROR and an ``exception`` event).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from otel_titan.schema import ATTR, RecordKind

__all__ = ["TitanSpan", "RecordKind", "ATTR", "MAX_EVENTS_PER_SPAN"]

#: Events (instants, scalars, the exception) kept per span; older ones are dropped and counted.
MAX_EVENTS_PER_SPAN = 128


class TitanSpan(ReadableSpan):
    """A `ReadableSpan` built by otel-titan's processor, with typed logging fields.

    It is handed to start-aware exporters when it starts and finished in place
    when its end is processed, as the SDK's own `Span` is handed to
    `SpanProcessor.on_start` and later `on_end`. By the time an exporter sees
    a start, the span may already be finished (both happened in one batch):
    use the timeline's ``ended`` flag, not ``end_time``. Treat it as read-only.
    """

    # What varies per span lives in slots (a slot store is several times
    # cheaper than a dict store); the SDK's own methods read `self._name` and
    # friends through them. Typed fields are set by the SpanBuilder before
    # anyone sees the span.
    __slots__ = (
        "_name",
        "_context",
        "_parent",
        "_start_time",
        "_end_time",
        "_attribute_dict",
        "record_kind",
        "step",
        "relative_step",
        "step_tags",
        "task_name",
        "code_file",
        "code_line",
        "code_function",
        "thread_id",
        "ended",
        "_encoded",
    )
    # The SDK types these Optional (a span before it starts); a TitanSpan is made with its context
    # and start.
    _context: SpanContext
    _start_time: int
    _end_time: int | None
    record_kind: str
    step: int | None
    relative_step: int | None
    step_tags: tuple[str, ...]
    task_name: str | None
    code_file: str
    code_line: int
    code_function: str
    thread_id: int
    ended: bool
    _attribute_dict: dict[str, Any] | None
    #: Scratch for the JSONL encoder (exporters/records.py): the fields a span's two records share.
    _encoded: Any
    # description, metric_name, metric_value, error_type, error_message and
    # extra default to None (class attributes below) and are set when present.

    # Defaults shared by every instance (class attributes), so that building a
    # span sets only what varies. `bind` makes a subclass carrying the
    # process's Resource and instrumentation scope the same way.
    _kind = SpanKind.INTERNAL
    _instrumentation_info = None
    _instrumentation_scope: InstrumentationScope | None = None
    _resource: Resource = Resource.get_empty()
    _events: Any = ()
    _links: Any = ()
    _status = Status(StatusCode.UNSET)
    description: str | None = None
    metric_name: str | None = None
    metric_value: Any = None
    error_type: str | None = None
    error_message: str | None = None
    extra: dict[str, Any] | None = None
    #: True for an instant or scalar that is also an event of its (open) enclosing span;
    #: exporters that show events (OTLP) send it as that event only.
    attached_to_parent = False
    #: True on the copy of a span still open at shutdown or SIGTERM, sent to exporters
    #: that only see finished spans (OTLP) so a hung phase does not vanish from the trace.
    incomplete = False
    #: True on the scalars the logger writes itself (its per-step figures, step_sampler.py): kept
    #: out of what stands for the user's own records (torchtitan-style handlers:
    #: exporters/logging_bridge.py).
    by_logger = False

    @classmethod
    def bind(cls, resource: Resource, scope: InstrumentationScope) -> type[TitanSpan]:
        """A subclass whose spans all carry `resource` and `scope` (one per logger)."""
        return type(
            cls.__name__,
            (cls,),
            {"_resource": resource, "_instrumentation_scope": scope, "__module__": cls.__module__},
        )

    @classmethod
    def make(
        cls,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        start_time: int,
        end_time: int | None,
        record_kind: str,
        step: int | None,
        relative_step: int | None,
        step_tags: tuple[str, ...],
        task_name: str | None,
        code_file: str,
        code_line: int,
        code_function: str,
        thread_id: int,
    ) -> TitanSpan:
        """Build a span with every field in one step (the processor's hot path).

        Equivalent to ``ReadableSpan.__init__`` followed by setting the typed
        fields, at a fraction of the cost: only what varies goes in the
        instance. Falls back to ``__init__`` if the installed SDK's
        `ReadableSpan` has other fields than the ones this was written
        against (checked once at import).
        """
        span = cls.__new__(cls)
        if not _SDK_LAYOUT_MATCHES:
            ReadableSpan.__init__(
                span,
                name,
                context=context,
                parent=parent,
                resource=cls._resource,
                start_time=start_time,
                end_time=end_time,
                instrumentation_scope=cls._instrumentation_scope,
            )
        span._name = name
        span._context = context
        span._parent = parent
        span._start_time = start_time
        span._end_time = end_time
        span._attribute_dict = None
        span.record_kind = record_kind
        span.step = step
        span.relative_step = relative_step
        span.step_tags = step_tags
        span.task_name = task_name
        span.code_file = code_file
        span.code_line = code_line
        span.code_function = code_function
        span.thread_id = thread_id
        span.ended = end_time is not None
        span._encoded = None  # scratch for the JSONL encoder: the fields a span's two records share
        return span

    # The SDK reads `self._attributes`; here it is built from the typed fields on first read.
    @property
    def _attributes(self) -> dict[str, Any]:
        attributes = self._attribute_dict
        if attributes is None:
            attributes = self._attribute_dict = self._build_attributes()
        return attributes

    @_attributes.setter
    def _attributes(self, value: Any) -> None:
        self._attribute_dict = value

    def _build_attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            ATTR.RECORD_KIND: self.record_kind,
            ATTR.CODE_FILE: self.code_file,
            ATTR.CODE_LINE: self.code_line,
            ATTR.CODE_FUNCTION: self.code_function,
            ATTR.THREAD_ID: self.thread_id,
        }
        if self.step is not None:
            attributes[ATTR.STEP] = self.step
        if self.relative_step is not None:
            attributes[ATTR.RELATIVE_STEP] = self.relative_step
        if self.step_tags:
            attributes[ATTR.STEP_TAGS] = self.step_tags
        if self.task_name is not None:
            attributes[ATTR.TASK_NAME] = self.task_name
        if self.description is not None:
            attributes[ATTR.DESCRIPTION] = self.description
        if self.metric_name is not None:
            attributes[ATTR.METRIC_NAME] = self.metric_name
            attributes[ATTR.METRIC_VALUE] = self.metric_value
        if self.error_type is not None:
            attributes[ATTR.ERROR_TYPE] = self.error_type
        if self.extra:
            for key, value in self.extra.items():
                attributes[ATTR.EXTRA_PREFIX + key] = value
        if self.incomplete:
            attributes[ATTR.INCOMPLETE] = True
        return attributes

    def incomplete_copy(self, end_time: int) -> TitanSpan:
        """A finished copy of this open span, ending at `end_time` and marked
        ``titan.incomplete``."""
        copy = type(self).make(
            self._name,
            self._context,
            self._parent,
            self._start_time,
            end_time,
            self.record_kind,
            self.step,
            self.relative_step,
            self.step_tags,
            self.task_name,
            self.code_file,
            self.code_line,
            self.code_function,
            self.thread_id,
        )
        copy.description = self.description
        copy.incomplete = True
        if self._events:
            copy._events = list(self._events)
        return copy

    def _finish(
        self, end_time: int, status: Status | None = None, error_event: Event | None = None
    ) -> None:
        self._end_time = end_time
        if status is not None:
            self._status = status
        if error_event is not None:
            self._add_event(error_event)
        self.ended = True
        self._attribute_dict = None  # error.type may have changed them

    def _add_event(self, event: Event) -> None:
        events = self._events
        if not isinstance(events, BoundedList):
            # Most spans carry no event; the bounded list is made on first use
            # so a span that wraps a whole run cannot grow without bound.
            events = BoundedList(MAX_EVENTS_PER_SPAN)
            self._events = events
        events.append(event)


_SDK_FIELDS = frozenset(
    {
        "_name",
        "_context",
        "_kind",
        "_instrumentation_info",
        "_instrumentation_scope",
        "_parent",
        "_start_time",
        "_end_time",
        "_attributes",
        "_events",
        "_links",
        "_resource",
        "_status",
    }
)
_SDK_LAYOUT_MATCHES = (
    frozenset(vars(ReadableSpan("probe", resource=Resource.get_empty()))) == _SDK_FIELDS
)


def fields_of(span: ReadableSpan) -> TitanSpan | Any:
    """The typed logging fields of any `ReadableSpan` (a `TitanSpan` is returned as is).

    Lets the JSONL writer encode spans from another SDK pipeline with the same
    code: their attributes are read back into the typed fields.
    """
    if isinstance(span, TitanSpan):
        return span
    view = _AttributeView()
    # values of any type a foreign pipeline set: checked below
    attributes: Mapping[str, Any] = span.attributes or {}
    view.record_kind = attributes.get(ATTR.RECORD_KIND, RecordKind.SPAN)
    view.step = attributes.get(ATTR.STEP)
    view.relative_step = attributes.get(ATTR.RELATIVE_STEP)
    view.step_tags = tuple(attributes.get(ATTR.STEP_TAGS, ()))
    view.task_name = attributes.get(ATTR.TASK_NAME)
    view.description = attributes.get(ATTR.DESCRIPTION)
    view.code_file = str(attributes.get(ATTR.CODE_FILE, attributes.get("code.filepath", "")))
    view.code_line = int(attributes.get(ATTR.CODE_LINE, attributes.get("code.lineno", 0)) or 0)
    view.code_function = str(
        attributes.get(ATTR.CODE_FUNCTION, attributes.get("code.function", ""))
    )
    view.thread_id = int(attributes.get(ATTR.THREAD_ID, 0) or 0)
    view.metric_name = attributes.get(ATTR.METRIC_NAME)
    view.metric_value = attributes.get(ATTR.METRIC_VALUE)
    view.error_type = attributes.get(ATTR.ERROR_TYPE)
    view.error_message = None
    for event in span.events:
        if event.name == "exception" and event.attributes:
            view.error_type = event.attributes.get("exception.type", view.error_type)
            view.error_message = event.attributes.get("exception.message")
    view.extra = {
        k[len(ATTR.EXTRA_PREFIX) :]: v
        for k, v in attributes.items()
        if k.startswith(ATTR.EXTRA_PREFIX)
    } or None
    return view


class _AttributeView:
    """Typed fields read back from a foreign span's attributes (see `fields_of`)."""

    # Read from a foreign span's attributes: whatever value types its SDK pipeline put there.
    record_kind: Any
    step: Any
    relative_step: Any
    step_tags: tuple[Any, ...]
    task_name: Any
    description: Any
    code_file: str
    code_line: int
    code_function: str
    thread_id: int
    metric_name: Any
    metric_value: Any
    error_type: Any
    error_message: Any
    extra: dict[str, Any] | None

"""The calling thread's side: capture what only it knows, append one tuple, return.

Everything here runs on the training thread, so it does the least it can: read
the monotonic clock, the caller's code object and line, the step state, the thread and
task, and append a plain tuple to the queue. Building OpenTelemetry spans, ids,
JSON and all I/O happen later on the background processor
(`processor.py`, `span_builder.py`).

Every event is a plain tuple whose layout is defined once, in `events.py`.
Every timestamp is a `perf_counter_ns()` reading; the processor maps them to
wall-clock time with one offset (clock.py).

``generation`` is the `Generation` (one per `init_structured_logger`) the span
was captured in. A span belongs to the file of its generation and to no other:
its end is written only while that generation is the current one (a span left
open across shutdown and re-init stays visibly incomplete in the old file
instead of ending, under a new id, in the new one), and a child captured in
another generation (after re-init, or in a forked child whose ContextVar still
holds the parent process's open span) names its parent by the id that
parent's own generation gave it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import numbers
import os
import sys
import threading
import traceback
from asyncio import current_task
from asyncio import events as _asyncio_events
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from threading import get_native_id
from time import perf_counter_ns
from time import sleep as _yield_gil
from types import CodeType
from typing import Any, TypeVar

from otel_titan.core.event_queue import EventQueue
from otel_titan.core.events import END, H_GEN, H_PARENT, INSTANT, SCALAR, START
from otel_titan.core.step_context import context_state as _context_state
from otel_titan.core.step_context import default_state as _default
from otel_titan.core.warn_once import WarnOnce
from otel_titan.schema import INT64_MAX, INT64_MIN

__all__ = ["log_trace_span", "log_trace_instant", "log_trace_scalar", "SpanScope"]

#: Frames of an exception's stack kept for its span (nearest the span first):
#: extracting all of them at every level of a deep recursion that failed is
#: quadratic (seconds on the training thread, then more on the writer).
STACK_FRAMES = 64


F = TypeVar("F", bound=Callable[..., Any])

_log = logging.getLogger("otel_titan")

_get_running_loop = _asyncio_events._get_running_loop
_getframe = sys._getframe
_current_span: ContextVar[tuple[Any, ...] | None] = ContextVar(
    "otel_titan_current_span", default=None
)
#: Capture sequence numbers, process-wide and never reused (span ids derive from them).
_seq = itertools.count(1)


class Generation:
    """One `init_structured_logger`: what the ids of the spans captured under it are made from.

    Stored in every span handle (see events.py). ``trace_ids`` and
    ``span_ids`` are that logger's `StepTraceIds` and `SpanIdAllocator`, so a
    span of this generation can be named correctly from any later one (None
    when the caller did not say: its spans are then never named elsewhere).
    """

    __slots__ = ("trace_ids", "span_ids")

    def __init__(self, trace_ids: Any = None, span_ids: Any = None) -> None:
        self.trace_ids = trace_ids
        self.span_ids = span_ids


class CaptureState:
    """Everything the hot path reads, published by lifecycle.py as one object.

    `attach` builds a complete new state and publishes it with one assignment,
    `detach` replaces it with an "off" state: so a call never sees half of one
    logger and half of another, and there is one reset instead of a dozen
    module globals set through ``global`` statements. Each call reads the
    module's ``_state`` once into a local and its fields from there (a slot
    read costs about what a module-global read did).

    Fields:

    * ``items``: the queue's deque, appended to directly; None when off (every call is a no-op);
    * ``queue``: the `EventQueue`, for its drop and skip counters;
    * ``capacity`` and ``crowded_at``: below ``crowded_at`` (half the capacity)
      an event is one ``append``. Above it the process emits faster than the
      writer thread keeps up (under the GIL, eight threads emitting flat out
      leave it a few percent of the interpreter): each event then also wakes
      the writer and yields the GIL once (``time.sleep(0)``), which lets it
      catch up instead of dropping. The caller never waits for the writer: at
      full capacity the event is dropped and counted;
    * ``wake_writer``: the processor's `wake`;
    * ``generation``: the `Generation` of this logger (kept by the off state: a
      handle captured concurrently still names a real one, and spans still
      open can never match the next attach's);
    * ``remote_parent``, ``propagate``, ``detach``: interop with other
      OpenTelemetry instrumentation (see otel_context.py), None unless
      enabled: ``remote_parent()`` returns the other instrumentation's current
      span context, which a top-level `sl` span then joins as its child;
      ``propagate(handle)`` makes an `sl` span the current OpenTelemetry span
      for code inside it and returns the token ``detach`` takes back at exit
      (kept by the off state: spans still open must detach what they attached);
    * ``thread_ids``: a thread-local caching ``get_native_id()`` (a syscall,
      ~200 ns, against ~40 ns for the cache); fresh in every state, so a
      forked child never reuses its parent's threads' ids;
    * ``warned_keys``: scalar keys already warned about (`WarnOnce`);
    * ``compiling``: ``torch.compiler.is_dynamo_compiling`` once the program
      imported torch (found at attach, or by the processor thread within its
      period if torch is imported later: `notice_torch`), else None. Under
      ``torch.compile`` Dynamo traces each call and folds it to True, so the call
      returns before anything Dynamo cannot trace (``sys._getframe``) and the
      compiled graph has no trace of it (fullgraph=True included), as
      torchtitan's ``torch.compiler.is_compiling()`` check does. Run eagerly it
      returns False for ~25 ns, a quarter of what ``is_compiling`` costs
      (which also asks TorchScript); only Dynamo cannot run this code, so only
      Dynamo needs the answer.
    """

    __slots__ = (
        "items",
        "queue",
        "capacity",
        "crowded_at",
        "wake_writer",
        "generation",
        "remote_parent",
        "propagate",
        "detach",
        "thread_ids",
        "warned_keys",
        "compiling",
    )

    def __init__(self) -> None:
        self.items: Any = None
        self.queue: EventQueue | None = None
        self.capacity = 0
        self.crowded_at = 0
        self.wake_writer: Callable[[], bool] | None = None
        self.generation: Generation | None = None
        self.remote_parent: Callable[[], Any] | None = None
        self.propagate: Callable[[tuple[Any, ...]], Any] | None = None
        self.detach: Callable[[Any], None] | None = None
        self.thread_ids = threading.local()
        self.warned_keys = WarnOnce(_MAX_WARNED_KEYS)
        self.compiling: Callable[[], bool] | None = None


#: Scalar keys warned about per logger; past this many, warnings stop (the values are still
#: counted).
_MAX_WARNED_KEYS = 1000

# The one home of the hot path's process state (None fields = not initialised: every call is a
# no-op).
_state = CaptureState()


def attach(
    queue: EventQueue,
    remote_parent: Callable[[], Any] | None = None,
    propagate: tuple[Callable[[tuple[Any, ...]], Any], Callable[[Any], None]] | None = None,
    wake_writer: Callable[[], bool] | None = None,
    trace_ids: Any = None,
    span_ids: Any = None,
) -> None:
    """Point the hot path at `queue` (called by `init_structured_logger`).

    `trace_ids` and `span_ids` are the id sources the processor builds this
    logger's spans with; they make up its `Generation`.
    """
    global _state
    state = CaptureState()
    state.generation = Generation(trace_ids, span_ids)
    state.remote_parent = remote_parent
    state.propagate, state.detach = propagate if propagate is not None else (None, None)
    state.wake_writer = wake_writer
    state.capacity = queue.capacity
    state.crowded_at = max(1, queue.capacity // 2)
    state.queue = queue
    state.items = queue.items
    state.compiling = _dynamo_check()
    _state = state  # published whole: a non-None `items` means "ready"


def _dynamo_check() -> Callable[[], bool] | None:
    """``torch.compiler.is_dynamo_compiling`` if the program imported torch (it is never imported
    here), else None."""
    torch = sys.modules.get("torch")
    check = getattr(getattr(torch, "compiler", None), "is_dynamo_compiling", None)
    return check if callable(check) else None


def notice_torch() -> bool:
    """Look for torch once more (the processor thread calls this each period until it returns True).

    For a program that imports torch after `init_structured_logger`: its
    ``torch.compile`` calls must find the check too. Returns True once the
    check is in place (or when off: there is nothing to look for).
    """
    state = _state
    if state.items is None or state.compiling is not None:
        return True
    check = _dynamo_check()  # None while torch is half imported: looked for again next period
    if check is not None:
        state.compiling = check
    return check is not None


def detach() -> None:
    """Make every call a no-op again (shutdown, fork child, `enable=False`): the one reset."""
    global _state
    off = CaptureState()
    off.generation = _state.generation
    off.detach = _state.detach
    _state = off


def _enqueue_crowded(state: CaptureState, q: Any, event: tuple[Any, ...], records: int) -> None:
    """The queue is at least half full: append, wake the writer and yield the GIL; or drop when
    full.

    No yield when the writer is stuck in an export (a frozen filesystem): it
    does not need the GIL then, and the caller's time per span stays as usual.
    """
    if len(q) < state.capacity:
        q.append(event)
        wake = state.wake_writer
        if wake is not None and wake():
            _yield_gil(0)
    else:
        queue = state.queue
        if queue is not None:
            queue.drop(records)


#: Native thread id → `threading` name, noted on each thread's first record (once per thread, never
#: per record): the writer names threads from it even after they ended (docs/schema.md
#: ``thread_name``).
thread_names: dict[int, str] = {}
_MAX_THREAD_NAMES = 65536


def _first_call_on_thread(thread_ids: Any) -> int:
    """A thread's first record: cache its native id and note its name (the only per-thread cost)."""
    tid = thread_ids.tid = get_native_id()
    if len(thread_names) >= _MAX_THREAD_NAMES:
        thread_names.clear()
    thread_names[tid] = threading.current_thread().name
    return tid


def _step_thread_task(thread_ids: Any) -> tuple[Any, int, str | None]:
    """The calling thread's step state, native thread id and asyncio task name: what every event
    carries."""
    state = _context_state.get()
    if state is None:
        state = _default[0]
    try:
        tid = thread_ids.tid
    except AttributeError:
        tid = _first_call_on_thread(thread_ids)
    loop = _get_running_loop()
    return state, tid, None if loop is None else _task_name(loop)


def is_attached() -> bool:
    """Whether sl.* calls currently record anything."""
    return _state.items is not None


def _task_name(loop: Any) -> str | None:
    task = current_task(loop)
    return None if task is None else task.get_name()


def _describe_error(
    exc_type: type[BaseException], exc: BaseException | None, tb: Any
) -> tuple[str, str, Any]:
    # Errors are rare, so this runs on the caller: the exception object may be
    # mutated or freed once the `with` block is left. `lookup_lines=False`
    # keeps source files unread here; the processor formats the stack.
    try:
        message = str(exc) if exc is not None else ""
    except Exception as str_error:  # noqa: BLE001 - a broken __str__ must not break training
        message = f"<str() failed: {type(str_error).__name__}>"
    try:
        summary = (
            traceback.TracebackException(
                exc_type, exc, tb, limit=STACK_FRAMES, lookup_lines=False, capture_locals=False
            )
            if exc is not None
            else None
        )
    except Exception:  # noqa: BLE001 - a traceback that cannot be summarized must not break training
        summary = None
    return (
        exc_type.__qualname__
        if exc_type.__module__ == "builtins"
        else f"{exc_type.__module__}.{exc_type.__qualname__}",
        message,
        summary,
    )


def _check_name(name: object, what: str = "event_type") -> None:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__} {name!r:.80}")
    if not name:
        raise ValueError(f"{what} must be a non-empty string")


class log_trace_span:  # a lowercase class, like contextlib.nullcontext: it *is* the API call
    """Time a block or a function as one span: ``<event_type>_start`` / ``_end`` / ``_error``.

    Use it as a context manager or as a decorator (plain and ``async def``
    functions). The ``_end`` record carries the duration in milliseconds from a
    monotonic clock; an exception writes ``<event_type>_error`` (type and
    message) before ``_end`` and propagates unchanged. Spans nest: a span opened
    inside another becomes its child, per thread and per asyncio task.

    Args:
        event_type: the phase name, e.g. ``"fwd_bwd"``. Prefer stable,
            low-cardinality names; put changing numbers in `log_trace_scalar`.
        description: optional human text, kept in the record's ``description``
            and ``message``.
        stacklevel: which frame is the ``caller`` for the context-manager form
            (2 = the code containing the ``with``). A decorated function
            reports its call site (``path:line:function`` of the line calling
            or awaiting it), as torchtitan does; a coroutine started by the
            event loop (``asyncio.run``, a task) has no call site of user code,
            so it reports its own definition (the line Python records as its
            first: the topmost decorator's) rather than asyncio's internals.

    One object times one span at a time: write ``with sl.log_trace_span(...)``
    where the span happens rather than reusing one object in nested ``with``
    blocks (decorators make a fresh one per call).

    Before `init_structured_logger`, after shutdown or with ``enable=False``
    it costs about 0.4 µs (creating the object, two no-op calls) and records nothing. (It is a
    class so that the call that opens a span is a single allocation.)

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> with sl.log_trace_span("fwd_bwd"):
        ...     pass
        >>> @sl.log_trace_span("data_fetch")
        ... def fetch():
        ...     return 1
        >>> fetch()
        1
    """

    __slots__ = (
        "_name",
        "_description",
        "_depth",
        "_code",
        "_lineno",
        "_handle",
        "_token",
        "_otel_token",
    )
    _lineno: int  # set by `_at` only (decorators), read only when `_code` was set with it

    def __init__(
        self, event_type: str, description: str | None = None, *, stacklevel: int = 2
    ) -> None:
        if type(event_type) is not str or not event_type:
            _check_name(event_type)
        if description is not None and not isinstance(description, str):
            raise TypeError(f"description must be a str or None, got {type(description).__name__}")
        self._name = event_type
        self._description = description
        self._depth = stacklevel - 1
        self._code: CodeType | None = None

    @classmethod
    def _at(cls, name: str, description: str | None, code: CodeType, lineno: int) -> log_trace_span:
        """A scope whose caller is fixed (decorators): no frame lookup."""
        scope = cls.__new__(cls)
        scope._name = name
        scope._description = description
        scope._depth = 1
        scope._code = code
        scope._lineno = lineno
        return scope

    def __enter__(self) -> log_trace_span:
        hot = _state
        # Compilation first: a call Dynamo traces must never read the queue (another thread's
        # records change it while the frame is traced: "deque mutated during iteration", or a guard
        # on its length that fails at once).
        if hot.compiling is not None and hot.compiling():
            self._handle = None
            return self
        q = hot.items
        if q is None:
            self._handle = None
            return self
        code = self._code
        if code is None:
            try:
                frame = _getframe(self._depth)
            except ValueError:  # stacklevel deeper than the stack: use the outermost frame
                frame = _outermost_frame()
            code = frame.f_code
            lineno = frame.f_lineno
        else:
            lineno = self._lineno
        # `_step_thread_task`, inlined: a Python call more per span would cost
        # ~60 ns here, and at the recursion limit it would raise inside the
        # logger instead of in the user's own frame (tests/core/test_capture.py).
        state = _context_state.get()
        if state is None:
            state = _default[0]
        try:
            tid = hot.thread_ids.tid
        except AttributeError:
            tid = _first_call_on_thread(hot.thread_ids)
        loop = _get_running_loop()
        parent = _current_span.get()
        handle = (
            START,
            next(_seq),
            self._name,
            self._description,
            perf_counter_ns(),
            code,
            lineno,
            parent,
            state,
            tid,
            None if loop is None else _task_name(loop),
            hot.remote_parent() if parent is None and hot.remote_parent is not None else None,
            hot.generation,
        )
        # Everything that can fail (the calls above, the OpenTelemetry attach
        # below, which are Python calls one level deeper) runs before the span
        # is committed: an exception then leaves no trace of it.
        self._otel_token = None if hot.propagate is None else hot.propagate(handle)
        self._handle = handle
        self._token = _current_span.set(handle)
        if len(q) < hot.crowded_at:
            q.append(handle)
        else:
            try:
                _enqueue_crowded(hot, q, handle, 1)
            except BaseException:
                # Interrupted after the start was queued (KeyboardInterrupt while
                # yielding the GIL, RecursionError at the stack limit): the `with`
                # body never runs and __exit__ is never called, so end it here.
                self.__exit__(*sys.exc_info())
                raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        handle = self._handle
        # off, or inside torch.compile: read before the clock, which Dynamo cannot trace
        if handle is None:
            return None
        end = perf_counter_ns()
        self._handle = None
        try:
            _current_span.reset(self._token)
        except ValueError:  # exited in another context than entered (manual __exit__ across tasks)
            _current_span.set(handle[H_PARENT])  # type: ignore[arg-type]  # the parent's handle (a tuple) or None
        hot = _state
        if self._otel_token is not None:
            hot.detach(self._otel_token)  # type: ignore[misc]  # set with the token when OpenTelemetry context propagation is on
        q = hot.items
        if q is None or handle[H_GEN] is not hot.generation:
            # Shut down (and maybe re-initialised, or forked) while the span was
            # open: its file has its start and no end, which is the truth.
            return None
        if exc_type is None:
            if len(q) < hot.crowded_at:
                q.append((END, handle, end, None))
            else:
                _enqueue_crowded(hot, q, (END, handle, end, None), 1)
        else:
            try:
                error = _describe_error(exc_type, exc, tb)
            except Exception:  # noqa: BLE001 - RecursionError at the stack limit, MemoryError: still end the span
                error = (getattr(exc_type, "__qualname__", "BaseException"), "", None)
            event = (END, handle, end, error)
            if len(q) < hot.crowded_at:
                q.append(event)
            else:
                _enqueue_crowded(hot, q, event, 2)
        return None  # never swallow the exception

    def __call__(self, fn: F) -> F:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"log_trace_span({self._name!r}) cannot decorate the generator {fn.__qualname__}: "
                "a span around a generator would only time its creation; use `with "
                "sl.log_trace_span(...)` inside it"
            )
        name, description = self._name, self._description
        at = log_trace_span._at
        if inspect.iscoroutinefunction(fn):
            definition = _definition(fn)

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                hot = _state
                # compilation first (see __enter__)
                if (hot.compiling is not None and hot.compiling()) or hot.items is None:
                    return await fn(*args, **kwargs)
                code, lineno = _awaited_from(definition)
                with at(name, description, code, lineno):
                    return await fn(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]  # the same signature as the function it wraps

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            hot = _state
            # compilation first (see __enter__)
            if (hot.compiling is not None and hot.compiling()) or hot.items is None:
                # off, or traced by torch.compile: before the frame lookup Dynamo cannot trace
                return fn(*args, **kwargs)
            try:
                frame = _getframe(1)
            except ValueError:
                frame = _outermost_frame()
            with at(name, description, frame.f_code, frame.f_lineno):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]  # the same signature as the function it wraps

    def __repr__(self) -> str:
        return f"log_trace_span({self._name!r})"


#: The type `log_trace_span(...)` returns (it is the class itself).
SpanScope = log_trace_span


#: asyncio's own source files: a coroutine whose caller frame is one of them was started by the
#: event loop.
_ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep


def _definition(fn: Callable[..., Any]) -> tuple[CodeType | None, int]:
    """The code and first line of the function `fn` wraps (through decorators and partials), or
    (None, 0)."""
    target = inspect.unwrap(fn)
    while isinstance(target, functools.partial):
        target = target.func
    # The target's own __call__ code, not whether it is callable (B004).
    call = getattr(type(target), "__call__", None)  # noqa: B004 - its code is wanted, not callable()
    code = getattr(target, "__code__", None) or getattr(call, "__code__", None)
    return (code, code.co_firstlineno) if code is not None else (None, 0)


def _awaited_from(definition: tuple[CodeType | None, int]) -> tuple[CodeType, int]:
    """The caller of a decorated coroutine: the frame awaiting it, or its definition when the event
    loop started it."""
    try:
        frame = _getframe(2)  # 0: here, 1: the wrapper's coroutine, 2: whoever awaits or resumes it
    except ValueError:
        frame = None
    if frame is not None and not frame.f_code.co_filename.startswith(_ASYNCIO_DIR):
        return frame.f_code, frame.f_lineno
    code, lineno = definition
    if code is None:
        caller = _getframe(1)
        return caller.f_code, caller.f_lineno
    return code, lineno


def _outermost_frame() -> Any:
    frame = _getframe(1)
    while frame.f_back is not None:
        frame = frame.f_back
    return frame


def log_trace_instant(event_type: str, *, stacklevel: int = 2) -> None:
    """Record a point-in-time marker (``log_type: "instant"``), e.g. ``"training_start"``.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.log_trace_instant("checkpoint_saved")
    """
    if type(event_type) is not str or not event_type:
        _check_name(event_type)
    hot = _state
    # compilation first (see __enter__)
    if (hot.compiling is not None and hot.compiling()) or hot.items is None:
        return
    _emit_instant(hot, event_type, stacklevel, None)


def _emit_instant(
    hot: CaptureState, event_type: str, stacklevel: int, attributes: Mapping[str, Any] | None
) -> None:
    try:
        frame = _getframe(stacklevel)
    except ValueError:
        frame = _outermost_frame()
    state, tid, task = _step_thread_task(hot.thread_ids)
    q = hot.items
    event = (
        INSTANT,
        event_type,
        perf_counter_ns(),
        frame.f_code,
        frame.f_lineno,
        _current_span.get(),
        state,
        tid,
        task,
        attributes,
    )
    if len(q) < hot.crowded_at:
        q.append(event)
    else:
        _enqueue_crowded(hot, q, event, 1)


def emit_internal_instant(event_type: str, extra: Mapping[str, Any] | None = None) -> None:
    """Record an instant on behalf of the library itself (signals, lifecycle).

    `extra` becomes extra record fields (and ``titan.extra.<key>`` span attributes).
    """
    hot = _state
    if hot.items is not None:
        _emit_instant(hot, event_type, 1, extra)


#: Returned by `_as_metric_value` for a value that cannot be logged.
_SKIP: Any = object()


def _as_metric_value(value: object) -> Any:
    """`value` as an int or float for the file, or `_SKIP`; never reads a tensor (that could sync a
    device)."""
    kind = type(value)
    if kind is float:
        return value
    if kind is int:
        return value if INT64_MIN <= value <= INT64_MAX else _SKIP  # type: ignore[operator]  # an int: its type() was checked
    if kind is bool:
        return int(value)  # type: ignore[call-overload]  # a bool: its type() was checked
    try:
        # numpy / other registered numbers: convert here, while the value is ours to read.
        if isinstance(value, numbers.Integral):
            return _as_metric_value(int(value))
        if isinstance(value, numbers.Real):
            return float(value)
        # only if the program imported it: never imported here
        numpy: Any = sys.modules.get("numpy")
        if numpy is not None:
            # numpy's bool (what ``(arr > 0).all()`` returns) is registered as no kind of number,
            # and a 0-d array is one host value (reading it syncs no device): both are numbers here.
            if isinstance(value, numpy.bool_):
                return int(value)  # as a Python bool is written: 0/1
            array: Any = value
            if type(array) is numpy.ndarray and array.ndim == 0 and array.dtype.kind in "biuf":
                return _as_metric_value(array.item())
    except Exception:  # noqa: BLE001 - a number type that fails to convert is skipped like any bad value
        pass
    return _SKIP


def _why_skipped(value: object) -> str:
    if value is None:
        return "None is not a number"
    if type(value) is int or isinstance(value, numbers.Integral):
        return "an integer beyond the signed 64-bit range (pass a float)"
    if type(value).__module__ == "numpy":
        # numpy's scalars and arrays have `.item` and `.device` too, but live on the host: never "a
        # tensor".
        shape = getattr(value, "shape", ())
        if shape:
            return f"a numpy array of shape {tuple(shape)}, not one number (log one element, or a reduction such as arr.mean())"
        return f"a numpy {getattr(value, 'dtype', type(value).__qualname__)} is not a real number"
    torch = sys.modules.get("torch")
    if (torch is not None and isinstance(value, torch.Tensor)) or (
        hasattr(value, "item") and hasattr(value, "device")
    ):
        return f"a tensor ({type(value).__qualname__}); pass a Python number: otel-titan never calls .item(), which can force a device sync"
    return f"a {type(value).__qualname__} is not a real number"


def _skip_values(hot: CaptureState, skipped: list[tuple[str, object]]) -> None:
    """Count values that cannot be logged and warn once per key: the training loop must go on."""
    queue = hot.queue
    if queue is not None:
        queue.skip(len(skipped))
    for key, value in skipped:
        if not hot.warned_keys.first(key):
            continue
        _log.warning(
            "otel-titan: log_trace_scalar skipped the value of %r: %s. Values of this key that "
            "cannot be logged are skipped "
            "without further warnings and counted in skipped_values of the closing record.",
            key,
            _why_skipped(value),
        )


def log_trace_scalar(scalars: Mapping[str, int | float], *, stacklevel: int = 2) -> None:
    """Record one ``metric_value`` record per name of `scalars`.

    Values are real numbers: ``int`` (signed 64-bit), ``float`` (NaN and infinities too;
    docs/schema.md says how they are written), ``bool`` (as 0/1) and numpy scalars (``np.bool_`` as
    0/1 too) or 0-d numpy arrays. Any other value (``None``, a tensor, a string, an integer beyond
    64 bits) is skipped, as in torchtitan: a logger never stops training over a value. Each such key
    is warned about once, and the skipped values are counted in ``skipped_values`` of the closing
    record. A tensor is never read (``.item()`` can force a device sync): pass ``loss.item()``
    yourself where that sync is acceptable. A `scalars` that is not a mapping, or a key that is not
    a non-empty string, raises `TypeError`/`ValueError` (a mistake in the code, found on the first
    call). When logging is off the call returns at once without looking at the values.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.log_trace_scalar({"loss": 2.5, "num_tokens": 4096})
    """
    hot = _state
    # compilation first: a traced call never reads the queue (__enter__)
    if hot.compiling is not None and hot.compiling():
        return
    q = hot.items
    if q is None:
        return
    if not isinstance(scalars, Mapping):
        raise TypeError(
            f"log_trace_scalar takes a mapping of name to number, got {type(scalars).__name__}"
        )
    values: dict[str, int | float] = {}
    skipped: list[tuple[str, object]] | None = None
    for key, value in scalars.items():
        if type(key) is not str or not key:
            _check_name(key, "log_trace_scalar key")
        kind = type(value)
        if kind is float:
            values[key] = value
            continue
        number = _as_metric_value(value)
        if number is _SKIP:
            if skipped is None:
                skipped = []
            skipped.append((key, value))
        else:
            values[key] = number
    if skipped is not None:
        _skip_values(hot, skipped)
    if not values:
        return
    try:
        frame = _getframe(stacklevel - 1)
    except ValueError:
        frame = _outermost_frame()
    state, tid, task = _step_thread_task(hot.thread_ids)
    event = (
        SCALAR,
        values,
        perf_counter_ns(),
        frame.f_code,
        frame.f_lineno,
        _current_span.get(),
        state,
        tid,
        task,
    )
    if len(q) < hot.crowded_at:
        q.append(event)
    else:
        _enqueue_crowded(hot, q, event, len(values))

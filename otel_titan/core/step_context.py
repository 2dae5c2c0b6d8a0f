"""The current training step and its tags, as every record sees them.

Every thread and asyncio task has a *view* (a small immutable `StepState` in a
ContextVar) or none; a context without a view sees the process-wide default.
One context, the *training loop*, owns that default:

* the training loop's `set_step` / `add_step_tag` / `clear_step_tags` move the
  default (and its own view), so every thread that never wrote a step of its
  own (data loading, checkpointing, executor workers) follows the loop;
* any other thread or task that writes gets a view of its own, starting from
  what it saw, and nothing it does reaches the default or anyone else's view;
* an asyncio task (or `asyncio.to_thread` call) copies its creator's view when
  it is created, so a task started during step N keeps step N even after the
  loop moved on to N+1.

The training loop is the main thread (outside asyncio tasks) whenever it
writes; otherwise the first thread or task to call `set_step` (an asyncio
controller, a trainer thread), until it ends. A helper that tags a step
therefore tags only its own records: it can never pin every other thread to
an old step.

The hot path reads this state with one `ContextVar.get` and, at most, one module
global, and never takes a lock; only writes (once a step) look up the caller.
"""

from __future__ import annotations

import operator
import threading
import weakref
from asyncio import current_task
from asyncio import events as _asyncio_events
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, NamedTuple

from otel_titan.schema import INT64_MAX, INT64_MIN

__all__ = [
    "StepState",
    "set_step",
    "get_step",
    "get_relative_step",
    "add_step_tag",
    "clear_step_tags",
    "get_step_tags",
    "current_step_state",
    "training_loop_thread",
    "add_boundary_hook",
    "clear_boundary_hooks",
]


class StepState(NamedTuple):
    """What `set_step` and `add_step_tag` recorded: copied into every capture."""

    step: int | None
    relative_step: int | None
    tags: tuple[str, ...]


NO_STEP = StepState(None, None, ())


class _LoopStepState(StepState):
    """A `StepState` the training loop wrote: how an asyncio task tells the loop's tags from its own
    (`add_step_tag`)."""

    __slots__ = ()


# The process-wide default lives in a one-element list so the hot path reads it
# with a constant-time index instead of a `global` statement in a writer.
_default: list[StepState] = [NO_STEP]
_context_state: ContextVar[StepState | None] = ContextVar("otel_titan_step_state", default=None)
# The training loop that owns `_default`: weak references to its thread and to
# its asyncio task (None outside a task), or None until one claims it. Weak, so
# an ended trainer thread or finished controller task can be replaced.
_owner: list[tuple[Any, Any] | None] = [None]
#: For capture.py's hot path, which inlines `current_step_state` (a call costs more
#: than the rest): the ContextVar of a thread's or task's own state, and the
#: one-element list holding the training loop's. Read them, never set them.
context_state = _context_state
default_state = _default
#: Called by the training loop's `set_step` with the step that just ended (`add_boundary_hook`), in
#: order.
_boundary_hooks: list[Callable[[int], None]] = []
_get_running_loop = _asyncio_events._get_running_loop
_main_thread = threading.main_thread
_current_thread = threading.current_thread


def current_step_state() -> StepState:
    """Return the `StepState` the calling context sees.

    Example:
        >>> from otel_titan.core import step_context as sc
        >>> sc.set_step(3); sc.current_step_state().step
        3
    """
    state = _context_state.get()
    return _default[0] if state is None else state


def training_loop_thread() -> threading.Thread:
    """The thread of the training loop that owns the default step (the main thread until another
    claims it).

    For the stall watchdog (processor.py), which watches that thread's spans to
    tell a process stuck between two spans of a step from one that is idle.
    """
    owner = _owner[0]
    thread = owner[0]() if owner is not None else None
    return thread if thread is not None and thread.is_alive() else _main_thread()


def _owns_default(claim: bool) -> bool:
    """Whether the caller is the training loop (see the module docstring); with `claim`, become it
    if free.

    Only writes call this (once a step), so finding the caller's thread and
    task here costs the hot path nothing.
    """
    thread = _current_thread()
    loop = _get_running_loop()
    task = None if loop is None else current_task(loop)
    owner = _owner[0]
    if owner is not None:
        owner_thread, owner_task = owner
        if owner_thread() is thread and (
            owner_task is None if task is None else owner_task is not None and owner_task() is task
        ):
            return True
    # The main thread outside asyncio tasks always counts as the training loop;
    # anyone else becomes it only by calling `set_step` while it is free.
    if not (task is None and thread is _main_thread()) and (
        not claim or (owner is not None and _is_alive(owner))
    ):
        return False
    _owner[0] = (weakref.ref(thread), None if task is None else weakref.ref(task))
    return True


def _in_task() -> bool:
    loop = _get_running_loop()
    return loop is not None and current_task(loop) is not None


def _is_alive(owner: tuple[Any, Any]) -> bool:
    thread = owner[0]()
    if thread is None or not thread.is_alive():
        return False
    if owner[1] is None:
        return True
    task = owner[1]()
    return task is not None and not task.done()


def _write(new: StepState, claim: bool = False) -> bool:
    # The training loop moves the default every view-less thread reads; anyone
    # else only changes its own view. Both set the caller's view, so tasks it
    # creates from now on start from `new`. True when it was the training loop.
    owns = _owns_default(claim)
    if owns:
        new = _LoopStepState(*new)
        _default[0] = new
    _context_state.set(new)
    return owns


def add_boundary_hook(hook: Callable[[int], None]) -> Callable[[], None]:
    """Have the training loop's `set_step` call `hook(ended_step)` at each step boundary; returns
    its remover.

    A boundary is the training loop moving from one step to another (not a
    helper thread's step of its own, nor `set_step` to the same step or from
    none). The per-step process figures read their memory and CPU time here,
    at the boundary itself, instead of up to a processor interval into the next
    step (process_figures.py `BoundaryReadings`); the logger looks for a
    DeviceMesh at the first few (`lifecycle._look_for_a_mesh`). Hooks run on
    the training thread, in the order added: keep each to a few microseconds;
    an exception from one is swallowed (the others still run). A hook may
    remove itself. `clear_boundary_hooks` removes them all.

    Example:
        >>> ended = []
        >>> remove = add_boundary_hook(ended.append)
        >>> set_step(1); set_step(2); set_step(2); remove(); set_step(3)
        >>> ended
        [1]
    """
    _boundary_hooks.append(hook)

    def remove() -> None:
        if hook in _boundary_hooks:
            _boundary_hooks.remove(hook)

    return remove


def clear_boundary_hooks() -> None:
    """Remove every boundary hook (the logger's shutdown, and a forked child: its parent's hooks are
    not its own)."""
    _boundary_hooks.clear()


def _as_step(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int or None, got bool {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]  # accepts int, numpy integers, 0-d int tensors; else TypeError
    except TypeError:
        raise TypeError(
            f"{what} must be an int or None, got {type(value).__name__} {value!r}"
        ) from None
    if not INT64_MIN <= number <= INT64_MAX:
        raise ValueError(f"{what} {number} does not fit in a signed 64-bit integer")
    return number


def set_step(step: int | None, *, relative_step: int | None = None) -> None:
    """Stamp every following record with `step` (and `relative_step`); clear the tags.

    `relative_step` is the step counted from this process's (re)start, so
    `step - loaded_step` after resuming from a checkpoint; when omitted it is
    `step`, as in torchtitan (right for a run that did not resume). `None`
    unsets the step: records then carry no `step` field. Integers outside the
    signed 64-bit range raise `ValueError`; non-integers raise `TypeError`.

    Called by the training loop, this moves the step every thread without a
    step of its own sees; called by any other thread or task, it sets that
    thread's or task's own step only (see the module docstring).

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.set_step(101, relative_step=1)
        >>> sl.get_step(), sl.get_relative_step(), sl.get_step_tags()
        (101, 1, ())
        >>> sl.set_step(7); sl.get_relative_step()
        7
    """
    number = _as_step(step, "step")
    relative = number if relative_step is None else _as_step(relative_step, "relative_step")
    ended = _default[0].step
    if (
        _write(StepState(number, relative, ()), claim=True)
        and _boundary_hooks
        and ended is not None
        and ended != number
    ):
        for hook in tuple(_boundary_hooks):  # a copy: a hook may remove itself
            try:
                hook(ended)
            except Exception:  # noqa: BLE001 - a hook must never cost the training loop its step
                pass


def get_step() -> int | None:
    """Return the step the calling context sees, or None before `set_step`.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.set_step(7); sl.get_step()
        7
    """
    return current_step_state().step


def get_relative_step() -> int | None:
    """Return the relative step the calling context sees (the step itself unless given), or None.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.set_step(7, relative_step=2); sl.get_relative_step()
        2
    """
    return current_step_state().relative_step


def add_step_tag(tag: str) -> None:
    """Add `tag` to the current step's `step_tags` (once; order kept) until the next `set_step`.

    Tags mark steps worth filtering later ("gc", "eval", "checkpoint"). From
    the training loop the tag reaches every thread that follows it; from any
    other thread or task it marks that thread's or task's own records only.
    An asyncio task that tags then carries its own tags only, not the
    training loop's as well, as in torchtitan (two actor tasks tagging the
    same step "gc" and "eval" each see their own); a thread keeps the loop's
    tags and adds its own.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.set_step(10); sl.add_step_tag("gc"); sl.add_step_tag("gc")
        >>> sl.get_step_tags()
        ('gc',)
    """
    if type(tag) is not str:
        raise TypeError(f"step tag must be a str, got {type(tag).__name__} {tag!r}")
    if not tag:
        raise ValueError("step tag must be a non-empty string")
    state = current_step_state()
    tags = state.tags
    if type(state) is _LoopStepState and _in_task() and not _owns_default(False):
        tags = ()  # as in torchtitan: a task that tags a step sees its own tags, not the loop's as well
    if tag not in tags:
        _write(StepState(state.step, state.relative_step, tags + (tag,)))


def clear_step_tags() -> None:
    """Remove every tag of the current step (`set_step` does this too).

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.add_step_tag("eval"); sl.clear_step_tags(); sl.get_step_tags()
        ()
    """
    state = current_step_state()
    if state.tags:
        _write(StepState(state.step, state.relative_step, ()))


def get_step_tags() -> tuple[str, ...]:
    """Return the current step's tags, oldest first.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.set_step(1); sl.add_step_tag("eval"); sl.get_step_tags()
        ('eval',)
    """
    return current_step_state().tags


def _reset_for_tests() -> None:
    """Forget every step and tag (process default, its owner, and this context)."""
    _default[0] = NO_STEP
    _owner[0] = None
    _context_state.set(None)

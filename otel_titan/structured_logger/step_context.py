"""The current training step and its tags, as every record sees them.

`set_step` / `add_step_tag` / `clear_step_tags` write a small immutable
`StepState` into a ContextVar *and*, when the calling context follows the
process-wide default, into that default too. Readers take the ContextVar's value
when the context has one and the process-wide default otherwise. That gives:

* a training loop on the main thread moves the step for every helper thread
  (data loading, checkpointing) that never set a step of its own;
* an asyncio task created during step N keeps step N (tasks copy the context at
  creation) even after the controller has moved on to N+1;
* a task or thread that diverged and sets its own step or tags changes only its
  own view, never the default the rest of the process sees.

The hot path reads this state with one `ContextVar.get` and, at most, one module
global, and never takes a lock.
"""

from __future__ import annotations

import operator
from contextvars import ContextVar
from typing import NamedTuple

__all__ = [
    "StepState",
    "set_step",
    "get_step",
    "get_relative_step",
    "add_step_tag",
    "clear_step_tags",
    "get_step_tags",
    "current_step_state",
]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class StepState(NamedTuple):
    """What `set_step` and `add_step_tag` recorded: copied into every capture."""

    step: int | None
    relative_step: int | None
    tags: tuple[str, ...]


NO_STEP = StepState(None, None, ())

# The process-wide default lives in a one-element list so the hot path reads it
# with a constant-time index instead of a `global` statement in a writer.
_default: list[StepState] = [NO_STEP]
_context_state: ContextVar[StepState | None] = ContextVar("otel_titan_step_state", default=None)


def current_step_state() -> StepState:
    """Return the `StepState` the calling context sees.

    Example:
        >>> from otel_titan.structured_logger import step_context as sc
        >>> sc.set_step(3); sc.current_step_state().step
        3
    """
    state = _context_state.get()
    return _default[0] if state is None else state


def _write(new: StepState) -> None:
    current = _context_state.get()
    # A context that follows the default (never set, or still identical to it)
    # moves the default along; a diverged one (a task holding an older step)
    # only changes its own view.
    if current is None or current is _default[0]:
        _default[0] = new
    _context_state.set(new)


def _as_step(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int or None, got bool {value!r}")
    try:
        number = operator.index(value)  # accepts int, numpy integers, 0-d int tensors
    except TypeError:
        raise TypeError(f"{what} must be an int or None, got {type(value).__name__} {value!r}") from None
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError(f"{what} {number} does not fit in a signed 64-bit integer")
    return number


def set_step(step: int | None, *, relative_step: int | None = None) -> None:
    """Stamp every following record with `step` (and `relative_step`); clear the tags.

    `relative_step` is the step counted from this process's (re)start, so
    `step - loaded_step` after resuming from a checkpoint. `None` unsets the step:
    records then carry no `step` field. Integers outside the signed 64-bit range
    raise `ValueError`; non-integers raise `TypeError`.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.set_step(101, relative_step=1)
        >>> sl.get_step(), sl.get_step_tags()
        (101, ())
    """
    _write(StepState(_as_step(step, "step"), _as_step(relative_step, "relative_step"), ()))


def get_step() -> int | None:
    """Return the step the calling context sees, or None before `set_step`.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.set_step(7); sl.get_step()
        7
    """
    return current_step_state().step


def get_relative_step() -> int | None:
    """Return the relative step the calling context sees, or None.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.set_step(7, relative_step=2); sl.get_relative_step()
        2
    """
    return current_step_state().relative_step


def add_step_tag(tag: str) -> None:
    """Add `tag` to the current step's `step_tags` (once; order kept) until the next `set_step`.

    Tags mark steps worth filtering later ("gc", "eval", "checkpoint").

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
    if tag not in state.tags:
        _write(StepState(state.step, state.relative_step, state.tags + (tag,)))


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
    """Forget every step and tag (process default and this context)."""
    _default[0] = NO_STEP
    _context_state.set(None)

"""torchtitan's ``step_state`` module: otel-titan's step and tags (`otel_titan.core.step_context`),
under torchtitan's names.

The public calls are otel-titan's own. torchtitan keeps each value twice, in a
module global (``_STEP_GLOBAL``, ``_RELATIVE_STEP_GLOBAL``, ``_TAGS_GLOBAL``)
and in a ContextVar (``_STEP_CV``, ``_RELATIVE_STEP_CV``, ``_TAGS_CV``); its
tests (and test fixtures written after them) read and reset those names. Here
they are views of otel-titan's state, so resetting them resets it: a
``_*_GLOBAL`` is a field of the training loop's step (what every thread without
a step of its own sees), a ``_*_CV`` a field of the calling context's own view.
One difference stays (docs/migrating-from-torchtitan.md): the training loop's
writes set its own view too, so ``_TAGS_CV`` is not empty after the loop's
``add_step_tag``.

Example:
    >>> from otel_titan.compat.torchtitan.observability.structured_logger import step_state
    >>> step_state.set_step(7); step_state._STEP_GLOBAL
    7
"""

from __future__ import annotations

import sys
import types
from typing import Any

from otel_titan.core import step_context
from otel_titan.core.step_context import NO_STEP, StepState
from otel_titan.structured_logger import (
    add_step_tag,
    clear_step_tags,
    get_relative_step,
    get_step,
    get_step_tags,
    set_step,
)

__all__ = [
    "set_step",
    "get_step",
    "get_relative_step",
    "add_step_tag",
    "clear_step_tags",
    "get_step_tags",
]

_FIELDS = {"step": 0, "relative_step": 1, "tags": 2}


class _ContextField:
    """One field of the calling context's own view, with a ContextVar's ``get`` / ``set``
    (torchtitan's ``_*_CV``).

    ``get`` is the field of the context's own view (None, or ``()`` for tags,
    when it has none); ``set`` gives the context a view with that field
    changed, and drops the view when it becomes empty, so that the context
    falls back to the training loop's step, as torchtitan's readers fall back
    to its globals.
    """

    def __init__(self, field: str) -> None:
        self._index = _FIELDS[field]
        self._field = field

    def get(self) -> Any:
        own = step_context.context_state.get()
        return (own or NO_STEP)[self._index]

    def set(self, value: Any) -> None:
        own = step_context.context_state.get() or NO_STEP
        new = own._replace(**{self._field: tuple(value) if self._index == 2 else value})  # type: ignore[arg-type]  # the field this accessor stands for, by name
        step_context.context_state.set(None if new == NO_STEP else new)

    def __repr__(self) -> str:
        return f"<otel-titan context view field {self._field!r}>"


def _default_field(field: str) -> property:
    index = _FIELDS[field]

    def get(module: Any) -> Any:
        return step_context.default_state[0][index]

    def set_(module: Any, value: Any) -> None:
        state: StepState = step_context.default_state[0]
        step_context.default_state[0] = state._replace(
            **{field: tuple(value) if index == 2 else value}  # type: ignore[arg-type]  # the field this accessor stands for, by name
        )

    return property(get, set_, doc=f"The training loop's {field} (torchtitan's module global).")


class _StepStateModule(types.ModuleType):
    """This module, with torchtitan's private globals as views of otel-titan's state (see the module
    docstring)."""

    _STEP_GLOBAL = _default_field("step")
    _RELATIVE_STEP_GLOBAL = _default_field("relative_step")
    _TAGS_GLOBAL = _default_field("tags")


_STEP_CV = _ContextField("step")
_RELATIVE_STEP_CV = _ContextField("relative_step")
_TAGS_CV = _ContextField("tags")

sys.modules[__name__].__class__ = _StepStateModule

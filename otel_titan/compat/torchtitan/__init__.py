"""torchtitan's structured logger, on otel-titan: torchtitan code runs unchanged
(docs/migrating-from-torchtitan.md).

Call `install` once, before the code that imports torchtitan's logger runs
(at the top of the training script, or in a ``sitecustomize``)::

    import otel_titan.compat.torchtitan
    otel_titan.compat.torchtitan.install()

    from torchtitan.observability import structured_logger as sl   # otel-titan's, now
    sl.init_structured_logger(source="training", output_dir="./outputs")

From then on ``torchtitan.observability.structured_logger`` and its modules
(``structured_logging``, ``step_state``, ``jsonl_handler``,
``gantt_generator``) are this package's: `otel_titan.structured_logger`'s
calls under torchtitan's names, its handler API (``TraceJsonlFormatter``,
``register_jsonl_handler``, torchtitan's factory arguments), torchtitan's
Gantt generator, and ``logging.getLogger("torchtitan.structured_logger")``
is otel-titan's structured logger, whose handlers receive every record. The
rest of torchtitan, when installed, is untouched (only its package's
``__init__`` is imported, to hold the alias); when it is not installed, a
placeholder ``torchtitan`` package holds it.

Without `install`, the same modules are importable under their own path:
``from otel_titan.compat.torchtitan.observability import structured_logger as sl``.

Example:
    >>> import otel_titan.compat.torchtitan as compat
    >>> compat.install()
    >>> from torchtitan.observability import structured_logger as sl
    >>> sl.init_structured_logger.__module__
    'otel_titan.compat.torchtitan.observability.structured_logger.structured_logging'
    >>> compat.uninstall()
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import types

from otel_titan.schema import LOGGER_NAME

__all__ = ["install", "uninstall", "is_installed", "TORCHTITAN_LOGGER_NAME"]

#: The name torchtitan gives its structured logger; `install` makes it otel-titan's logger.
TORCHTITAN_LOGGER_NAME = "torchtitan.structured_logger"

_OURS = "otel_titan.compat.torchtitan"
#: torchtitan's modules, relative to ``torchtitan``, each aliased to ours.
_MODULES = (
    "observability",
    "observability.structured_logger",
    "observability.structured_logger.step_state",
    "observability.structured_logger.structured_logging",
    "observability.structured_logger.jsonl_handler",
    "observability.structured_logger.gantt_generator",
)
#: What `install` changed, for `uninstall`: sys.modules entries it replaced (name → previous or
#: None).
_replaced: dict[str, types.ModuleType | None] = {}
_placeholder: list[types.ModuleType] = []
_logger_before: list[object] = []


def install() -> None:
    """Make ``torchtitan.observability.structured_logger`` otel-titan's (see the module docstring);
    a second call does nothing."""
    if _replaced:
        return
    parent = sys.modules.get("torchtitan")
    if parent is None and importlib.util.find_spec("torchtitan") is not None:
        # its __init__ only, so that torchtitan.observability is an attribute too
        parent = importlib.import_module("torchtitan")
    if parent is None:
        parent = types.ModuleType(
            "torchtitan",
            "otel-titan's placeholder: torchtitan is not installed; only its structured logger is "
            "here",
        )
        parent.__path__ = []  # a package with no modules of its own: other torchtitan imports fail as before
        _placeholder.append(parent)
        _replaced["torchtitan"] = None
        sys.modules["torchtitan"] = parent
    for relative in _MODULES:
        name = f"torchtitan.{relative}"
        module = importlib.import_module(f"{_OURS}.{relative}")
        _replaced[name] = sys.modules.get(name)
        sys.modules[name] = module
    observability = sys.modules["torchtitan.observability"]
    if parent is not None:
        parent.observability = observability  # type: ignore[attr-defined]  # torchtitan's package attribute, set as torchtitan does
    _alias_logger()


def _alias_logger() -> None:
    """``logging.getLogger("torchtitan.structured_logger")`` returns otel-titan's structured logger
    from now on."""
    structured_logger = logging.getLogger(LOGGER_NAME)
    manager = logging.Logger.manager
    with _logging_lock():
        _logger_before.append(manager.loggerDict.get(TORCHTITAN_LOGGER_NAME))
        manager.loggerDict[TORCHTITAN_LOGGER_NAME] = structured_logger


def _logging_lock():  # logging's module lock, so that a concurrent getLogger never sees half a change
    lock = getattr(logging, "_lock", None)
    return lock if lock is not None else _NoLock()


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def uninstall() -> None:
    """Undo `install` (for tests, and programs that switch back): the previous modules and logger
    come back."""
    if not _replaced:
        return
    for name, previous in reversed(list(_replaced.items())):
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
    parent = sys.modules.get("torchtitan")
    if parent is not None and not _placeholder:
        previous_observability = _replaced.get("torchtitan.observability")
        if previous_observability is not None:
            parent.observability = previous_observability  # type: ignore[attr-defined]  # torchtitan's package attribute, restored
        elif getattr(parent, "observability", None) is not None:
            del parent.observability
    _replaced.clear()
    _placeholder.clear()
    manager = logging.Logger.manager
    with _logging_lock():
        before = _logger_before.pop() if _logger_before else None
        if before is None:
            manager.loggerDict.pop(TORCHTITAN_LOGGER_NAME, None)
        else:
            manager.loggerDict[TORCHTITAN_LOGGER_NAME] = before  # type: ignore[assignment]  # the logger (or placeholder) that was there before


def is_installed() -> bool:
    """Whether `install` is in effect.

    Example:
        >>> is_installed()
        False
    """
    return bool(_replaced)

"""Handler factories: which ones run, importing them, and what they receive.

A handler factory is a function, named by its import path, that
`init_structured_logger` calls once with keyword arguments (listed in
`FACTORY_KWARGS` and docs/handlers.md). It registers OpenTelemetry span
exporters through ``add_span_exporter`` or, torchtitan-style, adds a
`logging.Handler` to ``structured_logger``.

Which factories run, first match wins:

1. the ``handlers=[...]`` option of `init_structured_logger`;
2. ``OTEL_TITAN_HANDLERS`` (this project's name);
3. ``TITAN_STRUCT_LOGGER_HANDLERS`` (torchtitan's name, so existing job
   scripts keep working);
4. the defaults: the JSONL file, plus what ``OTEL_TRACES_EXPORTER`` asks for
   (``otlp``, ``console``; nothing when ``OTEL_SDK_DISABLED=true``).

When one of the variables is set, *only* the listed factories run.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Mapping, Sequence

from otel_titan.core.exporter import HandlerFactoryError, HandlerSkipped
from otel_titan.exporters.otel_env import traces_exporter_handler_specs

__all__ = [
    "HANDLERS_ENV",
    "TORCHTITAN_HANDLERS_ENV",
    "JSONL_HANDLER",
    "HandlerFactoryError",
    "HandlerSkipped",
    "resolve_handler_specs",
    "load_factory",
    "default_handler_specs",
    "FACTORY_KWARGS",
]

HANDLERS_ENV = "OTEL_TITAN_HANDLERS"
TORCHTITAN_HANDLERS_ENV = "TITAN_STRUCT_LOGGER_HANDLERS"
JSONL_HANDLER = "otel_titan.exporters.jsonl.register_jsonl_handler"

#: Keyword arguments every factory receives (and ``**kw`` for those added later).
FACTORY_KWARGS = (
    "structured_logger",  # logging.Logger for torchtitan-style handlers (addHandler)
    "add_span_exporter",  # register an OpenTelemetry SpanExporter (or StartAwareSpanExporter)
    "rank",
    "local_rank",
    "world_size",
    "source",
    "output_dir",  # absolute (resolved once, at init: an os.chdir later does not change it)
    "run_id",
    "attempt",
    "job_id",
    "trace_id",  # pimm's name for the run-level id (= run_id)
    "identity",  # the whole RunIdentity
    "resource",  # the OpenTelemetry Resource
    "options",  # the validated LoggerOptions
    "stats",  # queue counters (dropped_records)
)


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def default_handler_specs(environ: Mapping[str, str]) -> list[str]:
    """The factories that run when nothing names them: the JSONL file, plus ``OTEL_TRACES_EXPORTER``'s.

    Example:
        >>> default_handler_specs({"OTEL_TRACES_EXPORTER": "otlp"})[1]
        'otel_titan.exporters.otlp.register_otlp_handler'
    """
    return [JSONL_HANDLER, *traces_exporter_handler_specs(environ)]


def resolve_handler_specs(explicit: Sequence[Any] | None, environ: Mapping[str, str] | None = None) -> tuple[list[Any], str]:
    """Return the handler factories to run and where that list came from.

    Example:
        >>> resolve_handler_specs(None, {"TITAN_STRUCT_LOGGER_HANDLERS": "a.b.f, c.d.g"})
        (['a.b.f', 'c.d.g'], 'TITAN_STRUCT_LOGGER_HANDLERS')
    """
    env = os.environ if environ is None else environ
    if explicit is not None:
        return list(explicit), "handlers= option"
    for name in (HANDLERS_ENV, TORCHTITAN_HANDLERS_ENV):
        value = env.get(name, "")
        if value.strip():
            return _split(value), name
    return default_handler_specs(env), "default"


def load_factory(spec: Any) -> Callable[..., Any]:
    """Import ``"package.module.function"`` (or ``"package.module:function"``); callables pass through.

    Raises `HandlerFactoryError` naming the path and the reason.

    Example:
        >>> load_factory("otel_titan.exporters.jsonl.register_jsonl_handler").__name__
        'register_jsonl_handler'
        >>> load_factory("no_such_pkg.make")
        Traceback (most recent call last):
        ...
        otel_titan.core.exporter.HandlerFactoryError: handler factory 'no_such_pkg.make': cannot import module 'no_such_pkg' (ModuleNotFoundError: No module named 'no_such_pkg')
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec:
        raise HandlerFactoryError(f"handler factory {spec!r} is neither a 'module.function' path nor a callable")
    if ":" in spec:
        module_name, _, attribute = spec.partition(":")
    else:
        module_name, _, attribute = spec.rpartition(".")
    if not module_name or not attribute:
        raise HandlerFactoryError(f"handler factory {spec!r} must be a fully-qualified 'package.module.function' path")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - report any import-time failure with the path
        raise HandlerFactoryError(f"handler factory {spec!r}: cannot import module {module_name!r} ({type(error).__name__}: {error})") from error
    try:
        factory = getattr(module, attribute)
    except AttributeError:
        raise HandlerFactoryError(f"handler factory {spec!r}: module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(factory):
        raise HandlerFactoryError(f"handler factory {spec!r} is a {type(factory).__name__}, not a callable")
    return factory


def describe(spec: Any) -> str:
    """A readable name for a factory spec in messages."""
    if isinstance(spec, str):
        return spec
    return f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"

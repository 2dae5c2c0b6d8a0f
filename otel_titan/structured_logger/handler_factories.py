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
   (``otlp``, ``console``), plus the metrics exporter when ``OTEL_METRICS_EXPORTER``
   asks for one (``otlp``, ``prometheus``, ``console``), plus the training log as
   OpenTelemetry logs when ``OTEL_LOGS_EXPORTER=otlp``, plus every record as
   an OTLP log record when ``OTEL_TITAN_OTLP_RECORDS=true`` (for
   ``otel-titan watch --otlp``: exporters/otlp_records.py); nothing of the
   OpenTelemetry side when ``OTEL_SDK_DISABLED=true``.

When one of the variables is set, *only* the listed factories run.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter

from otel_titan.core.exporter import (
    HandlerFactoryError,
    HandlerSkipped,
    PipelineStats,
    discard_exporter,
)
from otel_titan.core.identity import RunIdentity
from otel_titan.core.options import LoggerOptions
from otel_titan.environment_variables import OTEL_TITAN_HANDLERS, TITAN_STRUCT_LOGGER_HANDLERS
from otel_titan.exporters.logging_bridge import LoggingBridgeExporter
from otel_titan.exporters.metrics import metrics_exporter_handler_specs
from otel_titan.exporters.otel_env import traces_exporter_handler_specs
from otel_titan.exporters.otel_logs import logs_exporter_handler_specs
from otel_titan.exporters.otlp_records import RECORDS_HANDLER, records_enabled

__all__ = [
    "JSONL_HANDLER",
    "HandlerFactoryError",
    "HandlerSkipped",
    "resolve_handler_specs",
    "load_factory",
    "default_handler_specs",
    "FACTORY_KWARGS",
    "run_factories",
    "close_handlers",
]

_log = logging.getLogger("otel_titan")

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
    "trace_id",  # pimm's name for the run-level id (= run_id; the process run id when no run id was given)
    "identity",  # the whole RunIdentity
    "resource",  # the OpenTelemetry Resource
    "options",  # the validated LoggerOptions
    "stats",  # queue counters (dropped_records)
)


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def default_handler_specs(environ: Mapping[str, str]) -> list[str]:
    """The factories that run when nothing names them: the JSONL file, plus those of
    ``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER``, ``OTEL_LOGS_EXPORTER`` and
    ``OTEL_TITAN_OTLP_RECORDS``.

    Example:
        >>> default_handler_specs({"OTEL_TRACES_EXPORTER": "otlp"})[1]
        'otel_titan.exporters.otlp.register_otlp_handler'
        >>> default_handler_specs({"OTEL_METRICS_EXPORTER": "prometheus"})[1]
        'otel_titan.exporters.metrics.register_metrics_handler'
    """
    records = [RECORDS_HANDLER] if records_enabled(environ) else []
    return [
        JSONL_HANDLER,
        *traces_exporter_handler_specs(environ),
        *metrics_exporter_handler_specs(environ),
        *logs_exporter_handler_specs(environ),
        *records,
    ]


def resolve_handler_specs(
    explicit: Sequence[Any] | None, environ: Mapping[str, str] | None = None
) -> tuple[list[Any], str]:
    """Return the handler factories to run and where that list came from.

    Example:
        >>> resolve_handler_specs(None, {"TITAN_STRUCT_LOGGER_HANDLERS": "a.b.f, c.d.g"})
        (['a.b.f', 'c.d.g'], 'TITAN_STRUCT_LOGGER_HANDLERS')
    """
    env = os.environ if environ is None else environ
    if explicit is not None:
        return list(explicit), "handlers= option"
    for name in (OTEL_TITAN_HANDLERS, TITAN_STRUCT_LOGGER_HANDLERS):
        value = env.get(name, "")
        if value.strip():
            return _split(value), name
    return default_handler_specs(env), "default"


def load_factory(spec: Any) -> Callable[..., Any]:
    """Import ``"package.module.function"`` (or ``"package.module:function"``); callables pass
    through.

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
        raise HandlerFactoryError(
            f"handler factory {spec!r} is neither a 'module.function' path nor a callable"
        )
    if ":" in spec:
        module_name, _, attribute = spec.partition(":")
    else:
        module_name, _, attribute = spec.rpartition(".")
    if not module_name or not attribute:
        raise HandlerFactoryError(
            f"handler factory {spec!r} must be a fully-qualified 'package.module.function' path"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # report any import-time failure with the path
        raise HandlerFactoryError(
            f"handler factory {spec!r}: cannot import module {module_name!r} "
            f"({type(error).__name__}: {error})"
        ) from error
    try:
        factory = getattr(module, attribute)
    except AttributeError:
        raise HandlerFactoryError(
            f"handler factory {spec!r}: module {module_name!r} has no attribute {attribute!r}"
        ) from None
    if not callable(factory):
        raise HandlerFactoryError(
            f"handler factory {spec!r} is a {type(factory).__name__}, not a callable"
        )
    return factory


def describe(spec: Any) -> str:
    """A readable name for a factory spec in messages."""
    if isinstance(spec, str):
        return spec
    return f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"


def run_factories(
    handlers: Sequence[Any] | None,
    structured_logger: logging.Logger,
    *,
    identity: RunIdentity,
    resource: Resource,
    options: LoggerOptions,
    stats: PipelineStats,
    output_dir: str,
) -> tuple[list[SpanExporter], list[logging.Handler]]:
    """Run the factories that apply (see the module docstring); return what they registered.

    Strict: a factory that cannot be imported or raises (other than
    `HandlerSkipped`) fails the whole call with `HandlerFactoryError`, and
    whatever the earlier factories made is undone first (`discard` hooks,
    handlers closed). A factory that registers nothing is accepted (as in
    torchtitan: one may attach on rank 0 only) and said on the ``otel_titan``
    logger. A `LoggingBridgeExporter` feeds the handlers attached to
    `structured_logger`, by a factory or later.
    """
    try:
        specs, origin = resolve_handler_specs(handlers)
    except ValueError as error:  # e.g. OTEL_TRACES_EXPORTER=zipkin
        raise HandlerFactoryError(str(error)) from error
    exporters: list[SpanExporter] = []
    handlers_before = list(structured_logger.handlers)

    def add_span_exporter(exporter: SpanExporter) -> None:
        if not isinstance(exporter, SpanExporter):
            raise TypeError(
                "add_span_exporter() takes an opentelemetry SpanExporter, got "
                f"{type(exporter).__name__}"
            )
        exporters.append(exporter)

    kwargs = {
        "structured_logger": structured_logger,
        "add_span_exporter": add_span_exporter,
        "rank": identity.rank,
        "local_rank": identity.local_rank,
        "world_size": identity.world_size,
        "source": identity.source,
        "output_dir": output_dir,
        "run_id": identity.run_id,
        "attempt": identity.attempt,
        "job_id": identity.job_id,
        "trace_id": identity.process_run_id,  # never None, unlike run_id
        "identity": identity,
        "resource": resource,
        "options": options,
        "stats": stats,
    }
    try:
        for spec in specs:
            _run_one(spec, origin, kwargs, exporters, structured_logger)
        if not specs:
            raise HandlerFactoryError(f"no handler factory to run ({origin} is empty)")
        new_handlers = [h for h in structured_logger.handlers if h not in handlers_before]
        # Always: a handler attached to the logger later (not by a factory) receives the records
        # too, as in torchtitan.
        exporters.append(LoggingBridgeExporter(structured_logger, identity))
    except BaseException:
        _discard_all(exporters)
        close_handlers(
            structured_logger, [h for h in structured_logger.handlers if h not in handlers_before]
        )
        raise
    return exporters, new_handlers


def _run_one(
    spec: Any,
    origin: str,
    kwargs: dict[str, Any],
    exporters: list[SpanExporter],
    structured_logger: logging.Logger,
) -> None:
    factory = load_factory(spec)
    registered_before = len(exporters) + len(structured_logger.handlers)
    try:
        factory(**kwargs)
    except HandlerSkipped as skipped:
        _log.info("otel-titan: handler factory %s skipped: %s", describe(spec), skipped)
        return
    except Exception as error:
        raise HandlerFactoryError(
            f"handler factory {describe(spec)!r} (from {origin}) raised {type(error).__name__}: "
            f"{error}"
        ) from error
    if len(exporters) + len(structured_logger.handlers) == registered_before:
        # Accepted, as torchtitan does: a factory may attach on some ranks only (rank 0's database
        # writer). Said, so that a factory that attaches nothing by mistake does not pass unseen.
        _log.info(
            "otel-titan: handler factory %s (from %s) registered no exporter (add_span_exporter) "
            "and no handler (structured_logger.addHandler) on rank %s",
            describe(spec),
            origin,
            kwargs["rank"],
        )


def _discard_all(exporters: list[SpanExporter]) -> None:
    for exporter in exporters:
        try:
            discard_exporter(exporter)
        except Exception:  # noqa: BLE001 - already failing; report the original error
            pass


def close_handlers(structured_logger: logging.Logger, handlers: Sequence[logging.Handler]) -> None:
    """Detach `handlers` from `structured_logger` and close them (a failing close is ignored)."""
    for handler in handlers:
        structured_logger.removeHandler(handler)
        try:
            handler.close()
        except Exception:  # noqa: BLE001 - closing: one failing handler must not keep the others open
            pass

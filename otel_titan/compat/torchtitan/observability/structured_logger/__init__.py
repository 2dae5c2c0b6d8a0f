"""torchtitan's ``torchtitan.observability.structured_logger``, on otel-titan
(docs/migrating-from-torchtitan.md).

Once `otel_titan.compat.torchtitan.install` has run, torchtitan code runs unchanged::

    from torchtitan.observability import structured_logger as sl

    sl.init_structured_logger(source="training", output_dir="./outputs")
    with sl.log_trace_span("fwd_bwd"):
        ...

The calls are otel-titan's own (`otel_titan.structured_logger`): the same
records, in torchtitan's format, written by otel-titan's background writer.

Example:
    >>> from otel_titan.compat.torchtitan.observability import structured_logger as sl
    >>> sl.log_trace_instant("checkpoint_saved")   # a no-op until init_structured_logger()
"""

from otel_titan.compat.torchtitan.observability.structured_logger.step_state import (
    add_step_tag,
    clear_step_tags,
    get_relative_step,
    get_step,
    get_step_tags,
    set_step,
)
from otel_titan.compat.torchtitan.observability.structured_logger.structured_logging import (
    init_structured_logger,
    log_trace_instant,
    log_trace_scalar,
    log_trace_span,
)

__all__ = [
    "init_structured_logger",
    "set_step",
    "add_step_tag",
    "clear_step_tags",
    "get_step",
    "get_step_tags",
    "get_relative_step",
    "log_trace_scalar",
    "log_trace_instant",
    "log_trace_span",
]

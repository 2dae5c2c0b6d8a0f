"""otel-titan: the structured logger for distributed training, on OpenTelemetry.

Example:
    >>> from otel_titan import structured_logger as sl
    >>> sl.set_step(1)
"""

from otel_titan import structured_logger

__version__ = "0.1.0"

__all__ = ["structured_logger", "__version__"]

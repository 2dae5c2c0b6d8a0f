"""otel-titan: the structured logger for distributed training, on OpenTelemetry.

Importing the package loads nothing else: ``otel_titan.structured_logger``
(the writer, with OpenTelemetry) and ``otel_titan.analysis`` (the reader) are
loaded on first use (PEP 562), so ``otel-titan summarize`` starts without the
writer. Layers, lowest first: `schema` → `core` → `exporters` →
`structured_logger` → `cli`; `analysis` stands on `schema` alone
(``[tool.importlinter]`` in pyproject.toml, checked by the tests).

Example:
    >>> from otel_titan import structured_logger as sl
    >>> sl.set_step(1)
"""

from __future__ import annotations

import importlib
from typing import Any

from otel_titan._version import __version__

__all__ = ["structured_logger", "analysis", "__version__"]

_LAZY = frozenset({"structured_logger", "analysis", "core", "exporters", "schema"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        # importlib, not an import statement: the package root stays out of the layers' import
        # graph.
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)

"""How this copy of otel-titan is installed, and how to add an optional extra to it.

otel-titan is installed from a checkout of its repository or from a wheel built
from one (it is not on a package index): an error that names a missing extra
says the ``pip install`` that works here, with this checkout's own path when
the running copy is one. Standard library only, like `otel_titan._version`.
"""

from __future__ import annotations

from pathlib import Path

from otel_titan._version import __version__

__all__ = ["checkout_root", "install_hint"]


def checkout_root() -> Path | None:
    """The repository this copy runs from (an editable install, or ``PYTHONPATH``), or None for an
    installed wheel.

    Example:
        >>> root = checkout_root()
        >>> root is None or (root / "pyproject.toml").is_file()
        True
    """
    root = Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    try:
        if pyproject.is_file() and 'name = "otel-titan"' in pyproject.read_text(encoding="utf-8"):
            return root
    except OSError:
        pass
    return None


def install_hint(extra: str) -> str:
    """The command that installs otel-titan's optional `extra` (``analysis``, ``metrics``,
    ``cluster``) into this environment.

    From the checkout this copy runs from, when it is one; otherwise from a
    checkout or a built wheel, whose paths only the user knows.

    Example:
        >>> install_hint("analysis").startswith("pip install '")
        True
    """
    root = checkout_root()
    if root is not None:
        return f"pip install '{root}[{extra}]'"
    return f"pip install '/path/to/otel-titan[{extra}]' (a checkout), or 'otel-titan[{extra}] @ file:///path/to/otel_titan-{__version__}-py3-none-any.whl'"

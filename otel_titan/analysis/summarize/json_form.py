"""The ``--json`` form of a summary: the diagnosis first, then the facts it was drawn from."""

from __future__ import annotations

import time
from typing import Any

from otel_titan.analysis.model.facts import RunSummary
from otel_titan.analysis.model.headline import headline_data

__all__ = ["summary_json"]


def summary_json(summary: RunSummary, now_us: float | None = None) -> dict[str, Any]:
    """What ``otel-titan summarize --json`` prints: ``headline`` (`headline_data`) first, so that
    ``summarize --json | head`` shows the diagnosis, not paths; then `RunSummary.to_dict`.

    Both are computed at one `now_us` (default: now), so a process's state agrees between them.

    Example:
        >>> import json
        >>> from otel_titan.analysis import summarize_run
        >>> document = json.loads(json.dumps(summary_json(summarize_run("outputs"))))
        >>> document["headline"]["states"], len(document["processes"])
        ({'closed': 2}, 2)
    """
    now_us = time.time() * 1e6 if now_us is None else now_us
    return {"headline": headline_data(summary, now_us), **summary.to_dict(now_us)}

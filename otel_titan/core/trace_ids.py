"""Trace and span ids: one trace per training step and group of ranks.

The rule (documented in docs/schema.md and docs/collectors.md):

* ranks are grouped by `trace group <trace_group_of>`: rank // G, with G the
  trace group size (default 32 ranks, option ``trace_group_size``, variable
  ``OTEL_TITAN_TRACE_GROUP_SIZE``; 0 puts every rank in one group);
* a *top-level* span (no enclosing `sl` span) of step N gets the trace id
  ``sha256("otel-titan|<run_id>|<attempt>|ranks|<group>|step|<N>")[:16]``
  (with G = 0: ``sha256("otel-titan|<run_id>|<attempt>|step|<N>")[:16]``);
  every rank of a group computes the same id without talking to the others, so
  Jaeger or Tempo shows step N of those ranks as one trace, and a step of a
  1,024-rank job is 32 traces that stay within the backends' limits (one
  trace per step of every rank would be ~10 MB and ~25,000 spans, which
  Tempo rejects and Jaeger's UI cannot draw). The traces of one step share
  ``titan.step`` on every span, and ``titan.trace_group`` on the Resource;
* spans, instants and scalars before the first `set_step` share the trace
  ``sha256("otel-titan|<run_id>|<attempt>|[ranks|<group>|]pre-step")[:16]``;
* a child inherits the trace of its top-level ancestor (even if the step moved
  while the ancestor was open), and a span opened inside another
  instrumentation's active span joins that span's trace.

The attempt is part of the key so that step N replayed after an elastic restart
is a different trace from the step N that failed.

Span ids are unique per process and look random: the capture sequence number
plus a random salt goes through a short multiply/xor-shift mixer and is XORed
with a second random salt. Every step is a bijection on 64-bit integers, so
distinct sequence numbers never collide, and it costs a few integer operations.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Mapping
from typing import Any

from otel_titan.core.events import H_GEN, H_PARENT, H_REMOTE, H_STATE
from otel_titan.environment_variables import OTEL_TITAN_TRACE_GROUP_SIZE

__all__ = [
    "StepTraceIds",
    "SpanIdAllocator",
    "splitmix64",
    "trace_id_of_handle",
    "trace_group_of",
    "resolve_trace_group_size",
    "DEFAULT_TRACE_GROUP_SIZE",
]

_MASK = (1 << 64) - 1

#: Ranks per trace and step by default: 32 ranks × ~20-40 spans per step stays far below Jaeger's
#: ~2,000 spans per trace and Tempo's 5 MB per trace (docs/collectors.md, "Traces that fit").
DEFAULT_TRACE_GROUP_SIZE = 32


def resolve_trace_group_size(option: int | None, environ: Mapping[str, str] | None = None) -> int:
    """The trace group size: the option, else ``OTEL_TITAN_TRACE_GROUP_SIZE``, else 32; 0 = all
    ranks in one trace.

    Example:
        >>> resolve_trace_group_size(None, {}), resolve_trace_group_size(8, {}), resolve_trace_group_size(None, {"OTEL_TITAN_TRACE_GROUP_SIZE": "0"})
        (32, 8, 0)
    """
    if option is not None:
        return option
    raw = (os.environ if environ is None else environ).get(OTEL_TITAN_TRACE_GROUP_SIZE, "").strip()
    if not raw:
        return DEFAULT_TRACE_GROUP_SIZE
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"{OTEL_TITAN_TRACE_GROUP_SIZE}={raw!r} is not an integer (ranks per trace; 0 = all "
            "ranks in one trace)"
        ) from None
    if value < 0:
        raise ValueError(
            f"{OTEL_TITAN_TRACE_GROUP_SIZE}={raw!r} must be >= 0 (ranks per trace; 0 = all ranks "
            "in one trace)"
        )
    return value


def trace_group_of(rank: int | None, group_size: int) -> int | None:
    """The trace group of `rank` (None when every rank shares one trace: `group_size` 0).

    Example:
        >>> trace_group_of(70, 32), trace_group_of(70, 0), trace_group_of(None, 32)
        (2, None, 0)
    """
    if group_size == 0:
        return None
    return (rank or 0) // group_size


def splitmix64(value: int) -> int:
    """SplitMix64's output function: a fast bijective mixer of 64-bit integers.

    Example:
        >>> splitmix64(1) != splitmix64(2)
        True
    """
    z = value & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class StepTraceIds:
    """Map a step (or None, before the first step) to the run's trace id for it.

    Example:
        >>> ids = StepTraceIds(run_id="job-42", attempt=0)
        >>> ids.for_step(5) == StepTraceIds("job-42", 0).for_step(5)
        True
        >>> f"{ids.for_step(5):032x}" != f"{ids.for_step(None):032x}"
        True
        >>> StepTraceIds("job-42", 0, group=1).for_step(5) != StepTraceIds("job-42", 0, group=2).for_step(5)
        True
    """

    __slots__ = ("_prefix", "_cache", "group")

    def __init__(self, run_id: str, attempt: int, group: int | None = None) -> None:
        self.group = group
        self._prefix = f"otel-titan|{run_id}|{attempt}|" + (
            "" if group is None else f"ranks|{group}|"
        )
        self._cache: dict[int | None, int] = {}

    def for_step(self, step: int | None) -> int:
        """Return the 128-bit trace id of `step` (never zero)."""
        trace_id = self._cache.get(step)
        if trace_id is None:
            key = self._prefix + ("pre-step" if step is None else f"step|{step}")
            trace_id = int.from_bytes(hashlib.sha256(key.encode()).digest()[:16], "big") or 1
            if len(self._cache) > 4096:  # steps only move forward; keep the cache small
                self._cache.clear()
            self._cache[step] = trace_id
        return trace_id


class SpanIdAllocator:
    """Unique, random-looking 64-bit span ids for one process.

    Spans get ids from their capture sequence number (so a child can name its
    parent before either reached the processor); instants and scalars take
    fresh ids from a disjoint range.

    Example:
        >>> ids = SpanIdAllocator(salt=7)
        >>> ids.for_seq(1) != ids.for_seq(2) != ids.fresh()
        True
    """

    __slots__ = ("_add", "_xor", "_fresh")

    _FRESH_BASE = 1 << 62  # capture sequence numbers stay far below this
    _ODD = 0x9E3779B97F4A7C15  # odd, so multiplication modulo 2**64 is a bijection

    def __init__(self, salt: int | None = None) -> None:
        seed = (
            secrets.randbits(128) if salt is None else splitmix64(salt) << 64 | splitmix64(salt + 1)
        )
        self._add = seed >> 64
        self._xor = seed & _MASK
        self._fresh = 0

    def for_seq(self, seq: int) -> int:
        """The span id of the span captured with sequence number `seq`."""
        z = ((seq + self._add) * self._ODD) & _MASK
        z ^= z >> 29
        z = (z * 0xBF58476D1CE4E5B9) & _MASK
        return (z ^ (z >> 32) ^ self._xor) or 1

    def fresh(self) -> int:
        """A new span id for a zero-length span (instant or scalar)."""
        self._fresh += 1
        return self.for_seq(self._FRESH_BASE + self._fresh)


def trace_id_of_handle(handle: tuple[Any, ...], trace_ids: StepTraceIds) -> int:
    """The trace id of a captured span: that of its top-level ancestor.

    The ancestor's remote parent (another instrumentation's span it was opened
    in) names the trace if it has one, else the ancestor's step, keyed by the
    run of the logger it was captured under (its generation: a span of the
    parent process, seen from a forked child, keeps the parent's trace);
    `trace_ids` when that generation did not say.
    """
    while handle[H_PARENT] is not None:
        handle = handle[H_PARENT]
    remote = handle[H_REMOTE]
    if remote is not None:
        return int(remote.trace_id)
    own = handle[H_GEN].trace_ids
    return (trace_ids if own is None else own).for_step(handle[H_STATE].step)

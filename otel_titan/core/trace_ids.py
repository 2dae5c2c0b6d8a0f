"""Trace and span ids: one trace per training step across every rank of a run.

The rule (documented in docs/schema.md and docs/collectors.md):

* a *top-level* span (no enclosing `sl` span) of step N gets the trace id
  ``sha256("otel-titan|<run_id>|<attempt>|step|<N>")[:16]``; every rank of the
  run computes the same id without talking to the others, so Jaeger or Tempo
  shows step N of all ranks as one trace;
* spans, instants and scalars before the first `set_step` share the trace
  ``sha256("otel-titan|<run_id>|<attempt>|pre-step")[:16]``;
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
import secrets
from typing import Any

from otel_titan.core.events import H_GEN, H_PARENT, H_REMOTE, H_STATE

__all__ = ["StepTraceIds", "SpanIdAllocator", "splitmix64", "trace_id_of_handle"]

_MASK = (1 << 64) - 1


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
    """

    __slots__ = ("_prefix", "_cache")

    def __init__(self, run_id: str, attempt: int) -> None:
        self._prefix = f"otel-titan|{run_id}|{attempt}|"
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
        seed = secrets.randbits(128) if salt is None else splitmix64(salt) << 64 | splitmix64(salt + 1)
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
        return remote.trace_id
    own = handle[H_GEN].trace_ids
    return (trace_ids if own is None else own).for_step(handle[H_STATE].step)

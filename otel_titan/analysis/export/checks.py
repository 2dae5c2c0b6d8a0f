"""What the export checks before it writes: the hosts' clock offsets, and whether Perfetto could
open the trace.

Why: a trace merged from hosts whose clocks disagree puts ranks side by side
that were not; `tail_alignment` estimates each host's offset from the ends
of the files (the step-closing collective of the last steps, `model.clocks`)
without a second full read, and the export shifts each process's times by
it. And Perfetto's UI loads a JSON trace of about 1 GB at most (it crashes on
larger ones): `check_size` estimates the trace's size from the input's before
anything is written and refuses, proposing a window (``--steps``, ``--ranks``)
that fits, unless told to go ahead.
"""

from __future__ import annotations

import math

from otel_titan.analysis.model.clocks import ClockAlignment, ClosingVisitor, estimate_offsets
from otel_titan.analysis.model.timeline import walk_process
from otel_titan.analysis.read.filters import StepRange
from otel_titan.analysis.read.lines import SkippedLines, file_records
from otel_titan.analysis.read.records import RunLogs
from otel_titan.analysis.read.tails import tail_records

__all__ = [
    "tail_alignment",
    "check_size",
    "steps_held",
    "no_match_message",
    "TraceTooBigError",
    "PERFETTO_MAX_TRACE_BYTES",
    "TRACE_BYTES_PER_INPUT_BYTE",
]

#: About the largest JSON trace Perfetto's UI opens in a browser.
PERFETTO_MAX_TRACE_BYTES = 1_000_000_000
#: Trace bytes per JSONL byte: 0.20 measured on the export benchmark's run, 0.2 on generated runs;
#: with a margin.
TRACE_BYTES_PER_INPUT_BYTE = 0.25
#: Lines read from the end of each file to align clocks (about 20 steps of a training loop).
_ALIGN_LINES = 256


class TraceTooBigError(ValueError):
    """The trace would be too big for Perfetto's UI; the message proposes a window."""


def tail_alignment(run: RunLogs) -> ClockAlignment:
    """Per-host clock offsets from the last steps of every process (reads only the files' tails).

    Example:
        >>> from otel_titan.analysis import read_run
        >>> tail_alignment(read_run("outputs")).describe()
        'not aligned: all ranks on one host (one clock)'
    """
    # the step-closing spans alone: nothing else of the summary's collector is needed here
    visitor = ClosingVisitor()
    skipped = SkippedLines(log=False)
    for process in run.processes:
        records, _ = tail_records(process, skipped, min_lines=_ALIGN_LINES, trimmed=True)
        visitor.begin(process.host_name or process.label, process.label, process.attempt)
        walk_process(records, visitor)
    return estimate_offsets(visitor.closing)


def _last_step(run: RunLogs) -> int | None:

    best = None
    skipped = SkippedLines(log=False)
    for process in run.processes[:64]:  # the steps a run reached: a sample of processes says it
        records, _ = tail_records(process, skipped, min_lines=16, trimmed=True)
        steps = [r["step"] for r in records if type(r.get("step")) is int]
        if steps and (best is None or max(steps) > best):
            best = max(steps)
    return best


def steps_held(run: RunLogs) -> tuple[int, int] | None:
    """(first, last) step the run's records hold, from each process's first records and its tail;
    None without steps.

    For the message of an export whose ``--steps`` matched nothing: it reads
    the head of each process's oldest file up to its first record with a step,
    and its tail, never the whole run.
    """
    skipped = SkippedLines(log=False)
    firsts: list[int] = []
    for process in run.processes:
        # oldest first: the process's first step is in the first file that has one
        for path in process.segments:
            step = next(
                (r["step"] for r in file_records(path, skipped) if type(r.get("step")) is int), None
            )
            if step is not None:
                firsts.append(step)
                break
    last = _last_step(run)
    if not firsts or last is None:
        return None
    return min(firsts), max(last, max(firsts))


def no_match_message(run: RunLogs, steps: StepRange | None, processes: int) -> str:
    """Why an export wrote nothing: the filter, and what the run holds instead (its steps, its
    processes).

    Example:
        >>> from otel_titan.analysis import read_run
        >>> no_match_message(read_run("outputs"), StepRange(100, 200), 2)
        "outputs/structured_logs: no records match the filters: --steps 100:200, but the run's steps are 1–3 (2 processes selected)"
    """
    what = f"{run.log_dir}: no records match the filters"
    if steps is not None:
        held = steps_held(run)
        where = (
            "the run has no steps"
            if held is None
            else f"the run's steps are {held[0]}–{held[1]}"
            if held[0] != held[1]
            else f"the run's only step is {held[0]}"
        )
        what += f": --steps {steps}, but {where}"
    return what + f" ({processes} process{'es' if processes != 1 else ''} selected)"


def check_size(run: RunLogs, steps: StepRange | None, limit: int = PERFETTO_MAX_TRACE_BYTES) -> int:
    """The estimated trace size in bytes; raises `TraceTooBigError` (with a window that fits) above
    `limit`.

    Example:
        >>> from otel_titan.analysis import read_run
        >>> run = read_run("outputs")
        >>> 0 < check_size(run, None) < 100_000
        True
        >>> check_size(run, None, limit=1_000)
        Traceback (most recent call last):
        ...
        otel_titan.analysis.export.checks.TraceTooBigError: the trace would be about ... Export a window instead: --steps ...; or --force to write it anyway.
    """
    last = _last_step(run)
    fraction = 1.0
    if steps is not None and last:
        lo = max(steps.first or 1, 1)
        hi = min(steps.last if steps.last is not None else last, last)
        fraction = max(hi - lo + 1, 0) / last
    estimate = int(run.total_bytes * TRACE_BYTES_PER_INPUT_BYTE * fraction)
    if estimate <= limit:
        return estimate
    keep = 0.8 * limit / estimate  # the share of the current selection that fits, with a margin
    proposals = []
    if last:
        span = steps_wanted = max(1, math.floor((fraction * last) * keep))
        top = min(steps.last, last) if steps is not None and steps.last is not None else last
        proposals.append(
            f"--steps {max(top - span + 1, 1)}:{top} (the last {steps_wanted} steps, about "
            f"{_gb(estimate * steps_wanted / (fraction * last))})"
        )
    ranks = sorted({p.rank for p in run.processes if p.rank is not None})
    if len(ranks) > 1:
        count = max(1, math.floor(len(ranks) * keep))
        chosen = ranks[:count]
        proposals.append(
            f"--ranks {chosen[0]}-{chosen[-1]} ({count} of {len(ranks)} ranks, about "
            f"{_gb(estimate * count / len(ranks))})"
            if count > 1
            else f"--ranks {chosen[0]}"
        )
    raise TraceTooBigError(
        f"the trace would be about {_gb(estimate)} (from {_gb(run.total_bytes)} of JSONL), more "
        "than Perfetto's UI opens "
        f"(about {_gb(limit)}; larger files crash it): nothing written. Export a window instead: "
        + " or ".join(proposals)
        + "; or --force to write it anyway."
    )


def _gb(count: float) -> str:
    return f"{count / 1e9:.1f} GB" if count >= 1e8 else f"{count / 1e6:.1f} MB"

"""Runs with chosen per-rank, per-step times, in otel-titan's own record format (docs/schema.md).

The real library cannot be told how long a span took, so the straggler
statistics are tested on files written here, record for record as the
library writes them: the ``structured_logger_opened`` line, ``_start`` /
``_end`` pairs with span ids and ``seq_id``, the identity fields (``run_id``,
``attempt``), and the closing record.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

from tests.helpers.analysis import T0


def rank_file(
    run_dir: Path,
    rank: int,
    step_ms: Sequence[float],
    *,
    phases: dict[str, Sequence[float | None]] | None = None,
    untraced_before: dict[str, Sequence[float]] | None = None,
    run_id: str = "run-a",
    attempt: int = 0,
    world_size: int = 8,
    source: str = "training",
    start_us: int = T0,
    closed: bool = True,
) -> Path:
    """Write one rank's file: step N (1-based) lasts ``step_ms[N-1]`` ms; ``phases[name][N-1]`` ms
    of it in that phase.

    Phases run one after the other from the start of their step, in the order
    given (None: the phase does not run in that step), each after
    ``untraced_before[name][N-1]`` ms of untraced work. A step with no phase
    begins with a ``step_begin`` instant. The last step's end is one more
    record (``training_end``), so every step listed has a measured time.
    """
    phases = phases or {}
    untraced_before = untraced_before or {}
    identity = {
        "schema_version": 1,
        "rank": rank,
        "global_rank": rank,
        "local_rank": rank,
        "world_size": world_size,
        "source": source,
        "host_name": "vm",
        "pid": 4000 + rank,
        "run_id": run_id,
        "attempt": attempt,
        "job_id": None,
        "logger_name": "otel_titan.structured_logger",
    }
    trace = hashlib.sha256(f"{run_id}|{attempt}|{rank}".encode()).hexdigest()
    records: list[dict] = []

    def add(name: str, time_us: int, log_type: str = "event", **fields: object) -> None:
        record = {
            "delta_ms": 0.0,
            "time": time_us // 1_000_000,
            "time_ms": time_us // 1000,
            "time_us": time_us,
            "log_type": log_type,
            "log_type_name": name,
            "event_name": None,
            "log_level": "INFO",
            "tid": identity["pid"],
            "caller": "train.py:10:main",
            "log_file": "train.py",
            "log_function": "main",
            "message": name,
            **fields,
            "seq_id": len(records) + 1,
            **identity,
        }
        records.append(record)

    add(
        "structured_logger_opened",
        start_us,
        log_type="instant",
        otel_titan_version="0.1.0",
        queue_size=65536,
    )
    now = start_us + 1000
    for index, length in enumerate(step_ms):
        step = index + 1
        begin = now
        ran = False
        for name, durations in phases.items():
            ms = durations[index] if index < len(durations) else None
            if ms is None:
                continue
            gap = untraced_before.get(name)
            now += int(round((gap[index] if gap is not None and index < len(gap) else 0.0) * 1000))
            span_id = hashlib.sha256(f"{trace}|{step}|{name}".encode()).hexdigest()[:16]
            ids = {
                "trace_id": trace[:32],
                "span_id": span_id,
                "parent_span_id": None,
                "step": step,
                "relative_step": step,
            }
            add(f"{name}_start", now, **ids)
            now += int(round(ms * 1000))
            add(f"{name}_end", now, value=ms, **ids)
            ran = True
        if not ran:
            add("step_begin", begin, log_type="instant", step=step, relative_step=step)
        now = begin + int(round(length * 1000))
    add(
        "training_end",
        now,
        log_type="instant",
        step=len(step_ms) + 1,
        relative_step=len(step_ms) + 1,
    )
    if closed:
        add(
            "structured_logger_closed",
            now + 100,
            log_type="instant",
            closing=True,
            dropped_records=0,
            failed_records=0,
        )
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(start_us / 1e6))
    suffix = hashlib.sha256(f"{run_id}|{attempt}".encode()).hexdigest()[:6]
    path = run_dir / "structured_logs" / f"{source}.global_rank_{rank}.{stamp}-{suffix}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    return path


def jittered(base: Sequence[float], sigma: float, seed: int, offset: float = 0.0) -> list[float]:
    """``base`` per step plus a fixed offset and seeded Gaussian noise (a healthy rank's step
    times)."""
    rng = random.Random(seed)
    return [round(b + offset + rng.gauss(0.0, sigma), 3) for b in base]

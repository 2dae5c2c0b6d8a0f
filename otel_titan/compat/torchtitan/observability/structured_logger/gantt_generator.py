# The conversion below follows torchtitan's gantt_generator.py (pytorch/torchtitan, BSD 3-Clause,
# (c) Meta Platforms, Inc. and affiliates; tests/compat/torchtitan/LICENSE): the same pairing, track
# packing and events, so the same files give the same trace. What differs is said in the docstring.
"""torchtitan's Gantt generator: per-rank JSONL → one Chrome Trace JSON dict, torchtitan's way.

`generate_gantt_trace(log_dir, output_path)` behaves as torchtitan's: it reads
every ``*.jsonl`` of `log_dir`, pairs ``_start`` / ``_end`` last-in-first-out
per (file, ``task_name``), packs each file's asyncio tasks onto tracks, writes
``{"traceEvents": [...]}`` to `output_path` and returns that dict (``{"traceEvents": []}``
for a folder with no records); a scalar is an instant named ``train.loss=2.5000``,
an ``_error`` an instant ``ERROR: <name>``, a process is named after its file.

Two changes, both for otel-titan's files: the logger's own records
(`otel_titan.schema.is_logger_record`: opened, heartbeat, stall, step rollups,
its per-step process figures) are left out, as they are not the program's
instants and scalars; and a scalar whose value is written as ``"NaN"`` or
``"Infinity"`` (otel-titan keeps every line strict JSON) is named with that
word where torchtitan's own generator stops with a ``ValueError``.

otel-titan's own trace export, with unfinished spans, rotated segments, clock
alignment and counters, is `otel_titan.analysis.export_trace` (``otel-titan export``).

Example:
    >>> import tempfile
    >>> generate_gantt_trace(tempfile.mkdtemp(), tempfile.mktemp(suffix=".json"))
    {'traceEvents': []}
"""

from __future__ import annotations

import heapq
import json
import logging
import os
from collections import defaultdict
from glob import glob
from typing import Any

from otel_titan.schema import is_logger_record

__all__ = ["generate_gantt_trace", "load_all_records"]

logger = logging.getLogger(__name__)


def generate_gantt_trace(log_dir: str, output_path: str) -> dict:
    """Merge per-rank JSONL into a Chrome Trace JSON for Perfetto (https://ui.perfetto.dev); return
    it and write it to `output_path`.

    Args:
        log_dir: folder holding the per-rank ``*.jsonl`` files (``<run>/structured_logs``).
        output_path: where the Chrome Trace JSON is written.

    Returns:
        The Chrome Trace dict, ``{"traceEvents": [...]}``.
    """
    records = load_all_records(log_dir)
    if not records:
        logger.info("No records found in %s", log_dir)
        return {"traceEvents": []}
    sources = sorted({r["_source_file"] for r in records})
    source_to_pid = {s: i for i, s in enumerate(sources)}
    paired, instants = _collect_paired_and_instants(records, source_to_pid)
    tid_by_source_and_task = _assign_tids_per_source(paired)
    events = _emit_chrome_events(
        paired=paired,
        instants=instants,
        source_to_pid=source_to_pid,
        tid_by_source_and_task=tid_by_source_and_task,
    )
    trace = {"traceEvents": events}
    os.makedirs(os.path.dirname(output_path) or ".", exist_ok=True)
    with open(output_path, "w") as f:
        json.dump(trace, f, indent=2)
    logger.info(
        "Chrome Trace: %s (%d events from %d sources; view in https://ui.perfetto.dev)",
        output_path,
        len(events),
        len(sources),
    )
    return trace


def load_all_records(log_dir: str) -> list[dict]:
    """Every record of the ``*.jsonl`` files of `log_dir` (name order), each with ``_source_file``
    (its file's name without ``.jsonl``).

    The logger's own records are left out (see the module docstring).
    """
    records = []
    for path in sorted(glob(os.path.join(log_dir, "*.jsonl"))):
        source = os.path.basename(path)
        source_name = source.rsplit(".", 1)[0] if "." in source else source
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    r = json.loads(line)
                    if is_logger_record(r):
                        continue
                    r["_source_file"] = source_name
                    records.append(r)
    return records


def _metric_name(r: dict) -> str:
    value = r.get("value") or 0
    if isinstance(value, str):  # "NaN", "Infinity", "-Infinity": otel-titan's strict-JSON spelling
        return f"{r.get('event_name', 'metric')}={value}"
    return f"{r.get('event_name', 'metric')}={value:.4f}"


def _collect_paired_and_instants(
    records: list[dict], source_to_pid: dict[str, int]
) -> tuple[list[dict], list[dict]]:
    """Pair ``_start`` / ``_end`` with a last-in-first-out stack per (source, task_name); everything
    else is an instant."""
    paired: list[dict[str, Any]] = []
    instants: list[dict[str, Any]] = []
    pending: dict[tuple[str, str | None], list[dict]] = defaultdict(list)

    for r in records:
        event_type = r.get("log_type_name", "")
        log_type = r.get("log_type", "")
        time_us = r.get("time_us") or (r.get("time_ms") or 0) * 1000
        pid = source_to_pid[r["_source_file"]]
        rank = r.get("rank", 0)
        step = r.get("step")
        task_name = r.get("task_name")
        source = r["_source_file"]
        caller = r.get("caller")
        key = (source, task_name)
        instant = {
            "time_us": time_us,
            "pid": pid,
            "source": source,
            "task_name": task_name,
            "step": step,
            "caller": caller,
        }

        # log_type "instant" first: instants named like spans (training_start) are never span
        # halves.
        if log_type == "instant":
            instants.append(
                {"name": _metric_name(r) if event_type == "metric_value" else event_type, **instant}
            )
        elif event_type.endswith("_start"):
            type_name = event_type.removesuffix("_start")
            pending[key].append(
                {
                    "ts": time_us,
                    "step": step,
                    "display_name": r.get("event_name") or type_name,
                    "pid": pid,
                    "rank": rank,
                    "task_name": task_name,
                    "source": source,
                    "caller": caller,
                }
            )
        elif event_type.endswith("_end"):
            type_name = event_type.removesuffix("_end")
            duration_ms = r.get("value", 0)
            duration_us = (duration_ms or 0) * 1000
            stack = pending.get(key)
            start = stack.pop() if stack else None
            if start is not None:
                start_ts = start["ts"]
                end_ts = start_ts + duration_us
            else:  # an orphan _end (a truncated file): its window from its own time and duration
                end_ts = time_us
                start_ts = end_ts - duration_us
            begun = start or {}
            paired.append(
                {
                    "pid": pid,
                    "rank": begun.get("rank", rank),
                    "task_name": begun.get("task_name", task_name),
                    "source": begun.get("source", source),
                    "start_ts": start_ts,
                    "end_ts": end_ts,
                    "display_name": begun.get("display_name", type_name),
                    "step": step,
                    "duration_ms": duration_ms,
                    "caller": begun.get("caller", caller),
                }
            )
        elif event_type.endswith("_error"):
            instants.append({"name": f"ERROR: {event_type.removesuffix('_error')}", **instant})
        else:
            instants.append({"name": event_type, **instant})
    return paired, instants


def _assign_tids_per_source(paired: list[dict]) -> dict[tuple[str, str | None], int]:
    """Give every span a track (``tid``): each (source, task) one, task ranges slot-packed per
    source (min-heap interval scheduling)."""
    by_source: dict[str, list[dict]] = defaultdict(list)
    for p in paired:
        by_source[p["source"]].append(p)
    tid_by_source_and_task: dict[tuple[str, str | None], int] = {}
    for source, spans in by_source.items():
        task_range: dict[str | None, list[int]] = {}
        for s in spans:
            tn = s.get("task_name")
            r = task_range.get(tn)
            if r is None:
                task_range[tn] = [s["start_ts"], s["end_ts"]]
            else:
                r[0] = min(r[0], s["start_ts"])
                r[1] = max(r[1], s["end_ts"])
        busy: list[tuple[int, int]] = []
        next_slot = 0
        for tn, (start, end) in sorted(task_range.items(), key=lambda x: x[1][0]):
            if busy and busy[0][0] <= start:
                _, slot = heapq.heappop(busy)
            else:
                slot = next_slot
                next_slot += 1
            heapq.heappush(busy, (end, slot))
            tid_by_source_and_task[(source, tn)] = slot
        for s in spans:
            s["tid"] = tid_by_source_and_task[(source, s.get("task_name"))]
    return tid_by_source_and_task


def _emit_chrome_events(
    *,
    paired: list[dict],
    instants: list[dict],
    source_to_pid: dict[str, int],
    tid_by_source_and_task: dict[tuple[str, str | None], int],
) -> list[dict]:
    """The Chrome Trace events: a ``process_name`` per source, an ``X`` per span, an ``i`` per
    instant (on its task's track, else 0)."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": source}}
        for source, pid in source_to_pid.items()
    ]
    for p in paired:
        duration_ms = p["duration_ms"] or 0
        args: dict = {
            **({"step": p["step"]} if p["step"] is not None else {}),
            "duration_ms": f"{duration_ms:.2f}" if duration_ms else "0.00",
        }
        if p.get("caller"):
            args["caller"] = p["caller"]
        events.append(
            {
                "name": p["display_name"],
                "ph": "X",
                "ts": p["start_ts"],
                "dur": p["end_ts"] - p["start_ts"],
                "pid": p["pid"],
                "tid": p.get("tid", 0),
                "args": args,
            }
        )
    for i in instants:
        args = {"step": i["step"]} if i["step"] is not None else {}
        if i.get("caller"):
            args["caller"] = i["caller"]
        tid = tid_by_source_and_task.get((i["source"], i["task_name"]), 0)
        events.append(
            {
                "name": i["name"],
                "ph": "i",
                "ts": i["time_us"],
                "pid": i["pid"],
                "tid": tid,
                "s": "t",
                "args": args,
            }
        )
    return events

"""Replay a run's files through the live detector faster than real time: how detection latency and false alarms are counted.

The detector (`detect.Detector`) is a pure function of the records it was
given and when, so feeding it a finished run's records in time order, each
"read" at the first refresh after it was written (plus `latency_s`, the
writer's flush period and the filesystem's delay), gives the frames and
alerts `watch` would have given live, in a fraction of the time. A file that
ends torn is told to the detector as torn from its last record on, as the
follower would see it. Records are streamed (one per process held at a time,
merged by time): memory stays that of the detector.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from otel_titan.analysis.watch.detect import Detector, Rules
from otel_titan.analysis.read.records import read_run
from otel_titan.analysis.read.lines import SkippedLines
from otel_titan.analysis.read.tails import ends_torn

__all__ = ["ReplayResult", "replay"]


@dataclass
class ReplayResult:
    """What a replay gave: the alert and resolved events (each with ``at``: the simulated refresh time), and its cost."""

    events: list[dict[str, Any]] = field(default_factory=list)
    refreshes: int = 0
    simulated_s: float = 0.0
    records: int = 0
    cpu_s: float = 0.0
    first_s: float | None = None
    last_frame: dict[str, Any] | None = None

    def alerts(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The raised alerts, of `kind` when given."""
        return [e for e in self.events if e["type"] == "alert" and (kind is None or e["kind"] == kind)]


def _identity(process: Any) -> dict[str, Any]:
    return {"label": process.label, "source": process.source, "rank": process.rank, "attempt": process.attempt, "run_id": process.run_id,
            "host": process.host_name, "world_size": process.world_size, "pid": process.pid}


def replay(path: str, *, rules: Rules | None = None, interval: float = 1.0, latency_s: float = 0.1, tail_s: float = 60.0,
           stop: Callable[[dict[str, Any]], bool] | None = None) -> ReplayResult:
    """Feed the run at `path` to a fresh detector, refreshing every `interval` simulated seconds; `tail_s` more after its last record.

    `stop(event)`: end the replay at the first event for which it returns True (a benchmark waiting for one alert).

    Example:
        >>> # result = replay("/tmp/run"); [a["kind"] for a in result.alerts()]
    """
    cpu = time.process_time()
    logs = read_run(path, log_skipped=False)
    skipped = SkippedLines(log=False)
    detector = Detector(rules)
    result = ReplayResult()
    torn_at: dict[str, float] = {}

    def stream(index: int, process: Any) -> Iterator[tuple[int, int, dict[str, Any]]]:
        last = None
        for record in process.records(skipped):
            last = record["time_us"]
            yield record["time_us"], index, record
        if last is not None and ends_torn(process):
            torn_at[process.base] = last / 1e6 + latency_s

    processes = logs.processes
    merged = heapq.merge(*(stream(i, p) for i, p in enumerate(processes)), key=lambda item: item[0])
    pending: dict[int, list[dict[str, Any]]] = {}
    next_refresh: float | None = None
    finished = False

    def refresh(now: float) -> bool:
        for index, records in pending.items():
            process = processes[index]
            detector.observe(process.base, _identity(process), records, now)
        pending.clear()
        for base, since in torn_at.items():
            if since <= now:
                detector.file_facts(base, torn_since=since, gone=False)
        frame, events = detector.evaluate(now)
        result.refreshes += 1
        result.last_frame = frame
        for event in events:
            event["at"] = now
            result.events.append(event)
            if stop is not None and stop(event):
                return True
        return False

    last_s = 0.0
    for time_us, index, record in merged:
        seen = time_us / 1e6 + latency_s
        if next_refresh is None:
            result.first_s = seen
            next_refresh = seen + interval
        while seen > next_refresh:
            if refresh(next_refresh):
                finished = True
                break
            next_refresh += interval
        if finished:
            break
        pending.setdefault(index, []).append(record)
        result.records += 1
        last_s = seen
    if not finished and next_refresh is not None:
        end = last_s + tail_s
        while next_refresh <= end:
            if refresh(next_refresh):
                break
            next_refresh += interval
    result.simulated_s = (next_refresh or 0.0) - (result.first_s or 0.0)
    result.cpu_s = time.process_time() - cpu
    return result

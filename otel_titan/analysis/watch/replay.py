"""Replay a run's files through the live detector faster than real time: how detection latency and
false alarms are counted.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from otel_titan.analysis.read.lines import SkippedLines
from otel_titan.analysis.read.records import read_run
from otel_titan.analysis.read.tails import ends_torn
from otel_titan.analysis.watch.detect import Detector, Rules

__all__ = ["ReplayResult", "Replayer", "replay"]


@dataclass
class ReplayResult:
    """What a replay gave: the alert and resolved events (each with ``at``: the simulated refresh
    time), and its cost."""

    events: list[dict[str, Any]] = field(default_factory=list)
    refreshes: int = 0
    simulated_s: float = 0.0
    records: int = 0
    cpu_s: float = 0.0
    first_s: float | None = None
    last_frame: dict[str, Any] | None = None

    def alerts(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The raised alerts, of `kind` when given."""
        return [
            e for e in self.events if e["type"] == "alert" and (kind is None or e["kind"] == kind)
        ]


def _identity(process: Any) -> dict[str, Any]:
    return {
        "label": process.label,
        "source": process.source,
        "rank": process.rank,
        "attempt": process.attempt,
        "run_id": process.run_id,
        "host": process.host_name,
        "world_size": process.world_size,
        "pid": process.pid,
    }


def replay(
    path: str,
    *,
    rules: Rules | None = None,
    interval: float = 1.0,
    latency_s: float = 0.1,
    tail_s: float = 60.0,
    stop: Callable[[dict[str, Any]], bool] | None = None,
) -> ReplayResult:
    """Feed the run at `path` to a fresh detector, refreshing every `interval` simulated seconds;
    `tail_s` more after its last record.

    `stop(event)`: end the replay at the first event for which it returns True (a benchmark waiting
    for one alert).

    Example:
        >>> # result = replay("/tmp/run"); [a["kind"] for a in result.alerts()]
    """
    replayer = Replayer(rules=rules, interval=interval, latency_s=latency_s)
    if not replayer.feed(path, stop=stop):
        replayer.finish(tail_s, stop=stop)
    return replayer.result


class Replayer:
    """One detector fed folder after folder: a run generated in chunks replays as the one long run
    it is.

    `feed` streams one folder's records in time order into the detector,
    refreshing every `interval` simulated seconds as it goes; the next `feed`
    continues the same clock and the same detector (the baselines, the learned
    durations, the alerts), so a job-day that never fits on disk at once is
    still judged as one job. `key(process)`: the detector's key for a process
    (default its file's path; across chunks, something that stays, such as
    its rank). `frames`: build the frame at every refresh (off: events only,
    for counting false alarms at scale, the frame being the costliest part of
    an evaluation and unused there).
    """

    def __init__(
        self,
        *,
        rules: Rules | None = None,
        interval: float = 1.0,
        latency_s: float = 0.1,
        key: Callable[[Any], str] | None = None,
        frames: bool = True,
    ) -> None:
        self.detector = Detector(rules)
        self.result = ReplayResult()
        self.interval, self.latency_s, self.frames = interval, latency_s, frames
        self.key = key or (lambda process: process.base)
        self.next_refresh: float | None = None
        self.last_s = 0.0
        #: Records read but not yet handed to the detector (key → (identity, records)); files seen
        #: torn (key → since).
        self._pending: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        self._torn_at: dict[str, float] = {}

    def _refresh(self, now: float, stop: Callable[[dict[str, Any]], bool] | None) -> bool:
        detector, result = self.detector, self.result
        for key, (identity, records) in self._pending.items():
            detector.observe(key, identity, records, now)
        self._pending.clear()
        for key, since in self._torn_at.items():
            if since <= now:
                detector.file_facts(key, torn_since=since, gone=False)
        frame, events = detector.evaluate(now, with_frame=self.frames)
        result.refreshes += 1
        if frame is not None:
            result.last_frame = frame
        for event in events:
            event["at"] = now
            result.events.append(event)
            if stop is not None and stop(event):
                return True
        return False

    def feed(self, path: str, stop: Callable[[dict[str, Any]], bool] | None = None) -> bool:
        """Stream the run at `path` through the detector; True when `stop` ended it.

        Its last records wait for the next refresh, as they would live: the next
        `feed` (the run's next chunk) or `finish` makes it.
        """
        cpu = time.process_time()
        logs = read_run(path, log_skipped=False)
        skipped = SkippedLines(log=False)
        result = self.result
        latency_s = self.latency_s
        processes = logs.processes
        keys = [self.key(p) for p in processes]
        identities = [_identity(p) for p in processes]

        def stream(index: int, process: Any) -> Iterator[tuple[int, int, dict[str, Any]]]:
            last = None
            for record in process.records(skipped):
                last = record["time_us"]
                yield record["time_us"], index, record
            if last is not None and ends_torn(process):
                self._torn_at[keys[index]] = last / 1e6 + latency_s

        merged = heapq.merge(
            *(stream(i, p) for i, p in enumerate(processes)), key=lambda item: item[0]
        )
        pending = self._pending
        finished = False
        try:
            for time_us, index, record in merged:
                seen = time_us / 1e6 + latency_s
                if self.next_refresh is None:
                    result.first_s = seen
                    self.next_refresh = seen + self.interval
                while seen > self.next_refresh:
                    if self._refresh(self.next_refresh, stop):
                        finished = True
                        break
                    self.next_refresh += self.interval
                if finished:
                    break
                entry = pending.get(keys[index])
                if entry is None:
                    entry = pending[keys[index]] = (identities[index], [])
                entry[1].append(record)
                result.records += 1
                self.last_s = seen
        finally:
            result.cpu_s += time.process_time() - cpu
            result.simulated_s = (self.next_refresh or 0.0) - (result.first_s or 0.0)
        return finished

    def finish(
        self, tail_s: float, stop: Callable[[dict[str, Any]], bool] | None = None
    ) -> ReplayResult:
        """Refresh for `tail_s` simulated seconds after the last record (what `watch` sees once the
        run stopped writing)."""
        cpu = time.process_time()
        if self.next_refresh is not None:
            end = self.last_s + tail_s
            while self.next_refresh <= end:
                if self._refresh(self.next_refresh, stop):
                    break
                self.next_refresh += self.interval
        self.result.simulated_s = (self.next_refresh or 0.0) - (self.result.first_s or 0.0)
        self.result.cpu_s += time.process_time() - cpu
        return self.result

"""Play a generated run in real time: each rank's lines appear in its file when their time comes.

The live mode of `benchmarks/generate_run.py` (``--live``): the run is
generated first (with its faults and ground truth, starting a few seconds
from now) into ``OUT/.generated/``, then every line is appended to
``OUT/structured_logs/<same file>`` at its true time (its timestamp less its
host's clock offset), flushed every 50 ms like the writer thread. A rank's
file appears with its first line (a restart's new attempt appears when it
starts); a crash's torn half line is written as it is. Memory: one pending
line per file (files are read as they are played).
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["play"]

#: The writer thread's flush period (core/processor: 50 ms).
FLUSH_S = 0.05


def play(
    source_dir: str,
    out_dir: str,
    truth: dict[str, Any],
    *,
    flush_s: float = FLUSH_S,
    should_stop: Callable[[], bool] | None = None,
) -> int:
    """Append every line of ``source_dir/structured_logs`` to ``out_dir/structured_logs`` at its
    true time; returns lines written."""
    src_logs = os.path.join(source_dir, "structured_logs")
    dst_logs = os.path.join(out_dir, "structured_logs")
    os.makedirs(dst_logs, exist_ok=True)
    offsets = truth["host_offsets_us"]
    rank_host = {int(k): v for k, v in truth["rank_host"].items()}
    names = sorted(n for n in os.listdir(src_logs) if n.endswith(".jsonl"))
    sources = [open(os.path.join(src_logs, n), "rb") for n in names]  # closed below
    dests: dict[int, Any] = {}
    heap: list[tuple[float, int, bytes]] = []
    last_true: dict[int, float] = {}

    def push(index: int) -> None:
        raw = sources[index].readline()
        if not raw:
            return
        if raw.endswith(b"\n"):
            record = orjson.loads(raw)
            rank = record.get("rank")
            true_us = record["time_us"] - offsets.get(rank_host.get(rank, ""), 0.0)
        else:
            # a torn last line: written right after the line before it
            true_us = last_true.get(index, 0.0)
        last_true[index] = true_us
        heapq.heappush(heap, (true_us, index, raw))

    for index in range(len(sources)):
        push(index)
    written = 0
    try:
        while heap:
            if should_stop is not None and should_stop():
                break
            now_us = time.time() * 1e6
            touched = set()
            while heap and heap[0][0] <= now_us:
                _, index, raw = heapq.heappop(heap)
                dest = dests.get(index)
                if dest is None:
                    # closed below
                    dest = dests[index] = open(os.path.join(dst_logs, names[index]), "ab")
                dest.write(raw)
                touched.add(index)
                written += 1
                push(index)
            for index in touched:
                dests[index].flush()
            if heap:
                time.sleep(max(0.0, min(flush_s, (heap[0][0] - time.time() * 1e6) / 1e6)))
    finally:
        for handle in sources:
            handle.close()
        for handle in dests.values():
            handle.close()
    return written

"""Load: 16 threads and 1,000 concurrent asyncio tasks emitting together for 10 s, with rotation.

Injected: 16 threads in a tight span loop, plus an event loop running 1,000
tasks that each set their own step, add their own tag and emit spans, instants
and scalars, all at once, for 10 s, into a logger rotating at 1 MB with 3
backups. Checked: every record accounted for (written + dropped = emitted, from
the test's own count), every line of every segment parses (no interleaving),
no line twice, `seq_id` strictly increasing across segments read oldest first,
each task's records carry its own step and tag, disk use within
(backup_count + 1) × max_file_size_mb.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import threading
import time

import pytest

from otel_titan import structured_logger as sl
from tests.conftest import jsonl_files

pytestmark = pytest.mark.slow

SECONDS = 10.0
THREADS = 16
TASKS = 1000
MAX_MB = 1.0
BACKUPS = 3


def test_threads_and_tasks_together_with_rotation(run_dir):
    sl.init_structured_logger(
        "training", run_dir, world_size=1, max_file_size_mb=MAX_MB, backup_count=BACKUPS
    )
    stop = threading.Event()
    emitted = [0] * (THREADS + 1)

    def thread_worker(index: int) -> None:
        count = 0
        sl.set_step(10_000 + index)
        while not stop.is_set():
            with sl.log_trace_span("thread_work"):
                pass
            count += 2
        emitted[index] = count

    async def task_worker(index: int, counter: list[int]) -> None:
        sl.set_step(index)
        sl.add_step_tag(f"task{index}")
        while not stop.is_set():
            with sl.log_trace_span("task_work"):
                sl.log_trace_instant("tick")
                await asyncio.sleep(0)
            sl.log_trace_scalar({"x": 1.0})
            counter[0] += 4
            await asyncio.sleep(0.001)

    def loop_thread() -> None:
        async def main() -> None:
            counter = [0]
            await asyncio.gather(
                *(
                    asyncio.create_task(task_worker(i, counter), name=f"actor-{i}")
                    for i in range(TASKS)
                )
            )
            emitted[THREADS] = counter[0]

        asyncio.run(main())

    workers = [threading.Thread(target=thread_worker, args=(i,)) for i in range(THREADS)] + [
        threading.Thread(target=loop_thread)
    ]
    for worker in workers:
        worker.start()
    time.sleep(SECONDS)
    stop.set()
    for worker in workers:
        worker.join(60)
    assert sl.shutdown_structured_logger(timeout=120)
    total_emitted = sum(emitted)
    assert emitted[THREADS] > 0 and all(emitted[:THREADS])

    (active,) = jsonl_files(run_dir)
    older = sorted(glob.glob(active + ".*"), key=lambda p: -int(p.rsplit(".", 1)[1]))
    segments = older + [active]
    # rotation happened, and only backup_count older segments stay
    assert len(segments) == BACKUPS + 1
    disk = sum(os.path.getsize(p) for p in segments)
    assert disk <= (BACKUPS + 1) * MAX_MB * 1024 * 1024 + 4096
    seq_ids: list[int] = []
    lines_seen = set()
    for path in segments:
        with open(path, "rb") as handle:
            for raw in handle:
                assert raw.endswith(b"\n")
                record = json.loads(raw)  # raises on an interleaved or torn line
                assert raw not in lines_seen
                lines_seen.add(raw)
                seq_ids.append(record["seq_id"])
                task = record.get("task_name")
                if task is not None and task.startswith("actor-"):
                    index = int(task.split("-")[1])
                    assert record["step"] == index and record["step_tags"] == [f"task{index}"]
                elif record["log_type_name"].startswith("thread_work"):
                    assert record["step"] >= 10_000 and "step_tags" not in record
    assert all(b > a for a, b in zip(seq_ids, seq_ids[1:]))  # strictly increasing across segments
    # and contiguous: no line lost between kept segments
    assert seq_ids[-1] - seq_ids[0] == len(seq_ids) - 1

    closing = json.loads(open(active, "rb").read().splitlines()[-1])
    assert closing["log_type_name"] == "structured_logger_closed"
    assert (
        closing["written_records"] + closing["dropped_records"] + closing["failed_records"]
        == total_emitted
    )
    print(
        f"emitted {total_emitted:,} records in {SECONDS:.0f} s: written "
        f"{closing['written_records']:,}, dropped {closing['dropped_records']:,}; "
        f"{disk / 1e6:.1f} MB on disk in {len(segments)} segments"
    )

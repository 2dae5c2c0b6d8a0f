"""Sustained throughput: N threads emitting spans as fast as they can for S seconds.

    python -m benchmarks.throughput [--threads 8] [--seconds 10]

Default queue size. Prints one JSON line: spans emitted, records written and
dropped (from the file's closing record), spans/s written over the whole run
(emission plus the final drain).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import tempfile
import threading
import time

from otel_titan import structured_logger as sl


def run(threads: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as directory:
        return _run(threads, seconds, directory)


def _run(threads: int, seconds: float, directory: str) -> dict:
    sl.init_structured_logger("training", directory, world_size=1, run_id="bench")
    sl.set_step(1)
    stop = threading.Event()
    emitted = [0] * threads

    def emit(index: int) -> None:
        count = 0
        span = sl.log_trace_span
        while not stop.is_set():
            for _ in range(100):
                with span("work"):
                    pass
            count += 100
        emitted[index] = count

    workers = [threading.Thread(target=emit, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    emitting = time.perf_counter() - start
    sl.shutdown_structured_logger(timeout=120)
    total = time.perf_counter() - start
    (path,) = glob.glob(os.path.join(directory, "structured_logs", "*.jsonl"))
    with open(path, "rb") as handle:
        handle.seek(max(0, os.path.getsize(path) - 4096))
        closing = json.loads(handle.read().splitlines()[-1])
    spans = sum(emitted)
    return {
        "threads": threads,
        "seconds": emitting,
        "spans_emitted": spans,
        "records_written": closing["written_records"],
        "records_dropped": closing["dropped_records"],
        "spans_written_per_s": closing["written_records"] / 2 / total,
        "drain_s": total - emitting,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(json.dumps(run(args.threads, args.seconds)))


if __name__ == "__main__":
    main()

"""One worker of `summary_parallel`: summarize a share of a run's processes in a fresh interpreter.

Started by `summary_parallel` (`worker_io.start_process`, calling
`worker_main`) with a JSON spec on stdin (the processes, where to write the
result); it reports progress as ``P <bytes>`` lines and its warnings as
``W`` lines on stdout (`worker_io`), and pickles its process summaries and
run-wide accumulators into the result file. A module of its own, above `summary`,
so that `summary` can import `summary_parallel` (the dispatcher) and no
module has to import its own caller.
"""

from __future__ import annotations

import pickle
import sys

from otel_titan.analysis.export_parallel import process_logs
from otel_titan.analysis.record_lines import SkippedLines
from otel_titan.analysis.summary import _Collector, collect_processes
from otel_titan.analysis.summary_parallel import PROGRESS_BYTES
from otel_titan.analysis.worker_io import start_worker

__all__ = ["worker_main"]


def worker_main() -> int:
    """Summarize the share of processes the spec on stdin names; 0 when its result file is written."""
    spec = start_worker()
    processes = process_logs(spec["processes"])
    skipped = SkippedLines(log=spec["log_skipped"])
    stdout = sys.stdout.buffer
    unreported = 0

    def on_bytes(count: int) -> None:
        nonlocal unreported
        unreported += count
        if unreported >= PROGRESS_BYTES:
            stdout.write(b"P %d\n" % unreported)
            stdout.flush()
            unreported = 0

    collector = _Collector()
    summaries = collect_processes(processes, collector, skipped, on_bytes)
    if unreported:
        stdout.write(b"P %d\n" % unreported)
        stdout.flush()
    result = {
        "state": collector.state(),
        "summaries": summaries,
        "skipped": skipped.count,
        "skipped_examples": skipped.examples,
        "skipped_by_file": dict(skipped.by_file),
        "repaired": skipped.repaired,
        "repaired_by_file": dict(skipped.repaired_by_file),
    }
    with open(spec["result"], "wb") as handle:
        pickle.dump(result, handle, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())

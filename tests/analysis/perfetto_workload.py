"""A rank's workload for the Perfetto UI tests, run by the real library in its own process.

Run: ``RANK=r WORLD_SIZE=n python -m tests.analysis.perfetto_workload OUTPUT_DIR``. Per step: a
``fwd_bwd`` span holding a tight loop of empty ``inner`` spans (sub-µs: many share a microsecond
with their neighbours and with their parent's start or end), each holding an empty ``leaf``;
a failed ``optim``; a scalar. Then a helper thread's span, three concurrent asyncio tasks, and a
span that never ends (the process exits inside it).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

from otel_titan import structured_logger as sl

STEPS = 3
INNER = 300

#: (name, depth on its track) → spans per rank.
EXPECTED = {
    ("fwd_bwd", 0): STEPS,
    ("inner", 1): STEPS * INNER,
    ("leaf", 2): STEPS * INNER,
    ("optim", 0): STEPS,
    ("helper_work", 0): 1,
    ("task", 0): 3,
    ("never_ends", 0): 1,
}


def main() -> int:
    sl.init_structured_logger(source="training", output_dir=sys.argv[1])
    for step in range(1, STEPS + 1):
        sl.set_step(step)
        with sl.log_trace_span("fwd_bwd"):
            for _ in range(INNER):
                with sl.log_trace_span("inner"), sl.log_trace_span("leaf"):
                    pass
        try:
            with sl.log_trace_span("optim"):
                raise ValueError("boom")
        except ValueError:
            pass
        sl.log_trace_scalar({"loss": 1.0 / step})

    def helper() -> None:
        with sl.log_trace_span("helper_work"):
            pass

    thread = threading.Thread(target=helper, name="helper")
    thread.start()
    thread.join()

    async def task() -> None:
        with sl.log_trace_span("task"):
            await asyncio.sleep(0.002)

    async def tasks() -> None:
        await asyncio.gather(task(), task(), task())

    asyncio.run(tasks())
    sl.log_trace_span("never_ends").__enter__()
    sl.shutdown_structured_logger()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RANK", "0")
    sys.exit(main())

"""A writer that stalls for 10 s (a frozen network filesystem): the training thread must not notice.

Injected: a handler factory whose exporter blocks inside its export call until
released, placed before the JSONL exporter, so the background thread is stuck
in an export exactly as it would be in a `write()` to a frozen NFS mount.
Checked: the caller's p99 time per span, the queue's size (memory), the drop
count, and that the drops are written down once the stall ends.
"""

from __future__ import annotations

import statistics
import time

import pytest

from otel_titan import structured_logger as sl
from otel_titan.structured_logger import runtime
from tests.conftest import jsonl_files, read_records
from tests.helpers import factories

pytestmark = pytest.mark.slow

QUEUE = 4096  # small, so that ten seconds of a training-like rate overflow it


def emit_for(
    seconds: float, durations: list[float], counter: list[int], queue_sizes: list[int]
) -> None:
    """A training-like loop: bursts of 20 spans every 2 ms; records each span's caller time."""
    queue = runtime.STATE.running.queue  # type: ignore[union-attr]
    deadline = time.perf_counter() + seconds
    step = 0
    while time.perf_counter() < deadline:
        step += 1
        sl.set_step(step)
        for _ in range(20):
            start = time.perf_counter()
            with sl.log_trace_span("phase"):
                pass
            durations.append(time.perf_counter() - start)
            counter[0] += 2
        queue_sizes.append(len(queue))
        time.sleep(0.002)


def test_a_stalled_writer_costs_the_caller_nothing_and_drops_are_counted_then_written(run_dir):
    factories.GATE.set()
    sl.init_structured_logger(
        "training",
        run_dir,
        world_size=1,
        queue_size=QUEUE,
        handlers=[
            "tests.helpers.factories.register_gate",
            "otel_titan.exporters.jsonl.register_jsonl_handler",
        ],
    )
    emitted = [0]
    normal: list[float] = []
    stalled: list[float] = []
    sizes: list[int] = []
    emit_for(2.0, normal, emitted, sizes)  # the writer works

    sl.log_trace_instant("stall_begins")
    emitted[0] += 1
    # On disk before the freeze: otherwise a batch popped just before it, frozen in the gate,
    # would push it past the stall, after the drop report (a race under load, not a fault).
    assert sl.flush_structured_logger(timeout=30)
    factories.GATE.clear()  # from the next export on, the writer is frozen...
    time.sleep(0.2)  # ...as soon as its next batch starts
    stall_sizes: list[int] = []
    emit_for(10.0, stalled, emitted, stall_sizes)
    factories.GATE.set()  # the filesystem comes back
    assert sl.flush_structured_logger(timeout=30)  # the backlog drains

    sl.log_trace_instant("stall_ended")
    emitted[0] += 1
    assert sl.flush_structured_logger(timeout=30)
    assert sl.shutdown_structured_logger(timeout=30)

    p99_normal = statistics.quantiles(normal, n=100)[98]
    p99_stalled = statistics.quantiles(stalled, n=100)[98]
    print(
        f"caller per span: p99 {p99_normal * 1e6:.1f} us writing, {p99_stalled * 1e6:.1f} us "
        f"stalled; max stalled {max(stalled) * 1e6:.0f} us"
    )
    # A caller that waited for the writer would take seconds; the bound leaves room for a noisy
    # machine.
    assert p99_stalled <= max(5 * p99_normal, 0.001)
    assert max(stalled) < 0.5
    # Memory is bounded by the queue: never more than its capacity (plus one in-flight event).
    assert max(stall_sizes) <= QUEUE + 1

    records = read_records(jsonl_files(run_dir)[0])
    names = [r["log_type_name"] for r in records]
    closing = records[-1]
    assert closing["log_type_name"] == "structured_logger_closed"
    assert closing["dropped_records"] > 0
    # every record accounted for
    assert closing["written_records"] + closing["dropped_records"] == emitted[0]
    reports = [r for r in records if r["log_type_name"] == "records_dropped"]
    assert reports and sum(r["value"] for r in reports) == closing["dropped_records"]
    # The stall's drops are reported once the writer is back, before what came after.
    report_positions = [i for i, name in enumerate(names) if name == "records_dropped"]
    assert any(
        names.index("stall_begins") < i < names.index("stall_ended") for i in report_positions
    )


def test_the_callers_time_is_not_spent_yielding_to_a_stuck_writer():
    # When the writer is stuck in an export, `wake` says so and the crowded
    # path skips its GIL yield (there is nothing the writer could do with it).
    from otel_titan.core.event_queue import EventQueue
    from otel_titan.core.processor import BatchProcessor

    class Builder:
        pass

    import threading

    processor = BatchProcessor(EventQueue(8), Builder(), [])  # type: ignore[arg-type]
    assert processor.wake() is True
    # A thread that waits (as a writer blocked in write() does) and one that computes.
    waiting, computing = threading.Event(), threading.Event()
    clocks = {}

    def wait_forever():
        clocks["waiter"] = time.pthread_getcpuclockid(threading.get_ident())
        waiting.wait(10)

    def compute():
        clocks["computer"] = time.pthread_getcpuclockid(threading.get_ident())
        while not computing.is_set():
            sum(range(1000))

    threads = [threading.Thread(target=wait_forever), threading.Thread(target=compute)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.1)
        for name, expected in (("waiter", False), ("computer", True)):
            processor._cpu_clock = clocks[name]
            processor._last_cpu = time.clock_gettime(clocks[name])
            processor._blocked_sampled_at = 0.0
            processor._exporting_since = time.monotonic() - 1.0  # an export running for a second
            time.sleep(0.1)
            # no yield to a blocked writer; yield to a busy one
            assert processor.wake() is expected, name
    finally:
        waiting.set()
        computing.set()
        for thread in threads:
            thread.join()

"""Cost of one span (enter + exit) for one implementation, measured in a fresh process.

    python -m benchmarks.span_cost CASE [--spans N] [--reps R]

Prints one JSON line: per repetition, the calling thread's wall time per span
(the loop around `with span:`, which includes waiting for the interpreter
lock while background threads hold it), that thread's own CPU time per span,
the whole process's CPU time per span, every background thread included,
measured after a drain (the case's flush), and the CPU time per span of the
OTLP exporter's own thread (encoding and sending; 0 without OTLP).
The first repetition is a warm-up and is reported separately.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time

from benchmarks.cases import CASES, STEP


def measure(case_name: str, spans: int, reps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-{case_name}-") as directory:
        return _measure(case_name, spans, reps, directory)


def _exporter_threads_cpu_s() -> float:
    """CPU seconds used so far by the OTLP exporters' own threads (named ``otel-titan-otlp…``), 0
    when none."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("otel-titan-otlp") and thread.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (OSError, AttributeError):  # the thread just ended, or no per-thread clocks here
                pass
    return total


def _measure(case_name: str, spans: int, reps: int, directory: str) -> dict:
    case = CASES[case_name](directory)
    caller, caller_cpu, cpu, exporter_cpu = [], [], [], []
    try:
        for rep in range(reps + 1):  # rep 0 warms up caches, the JIT-less interpreter and the files
            STEP[0] = rep + 1
            span = case.span
            cpu_start = time.process_time()
            exporter_start = _exporter_threads_cpu_s()
            thread_start = time.thread_time()
            start = time.perf_counter()
            for _ in range(spans):
                with span("fwd_bwd"):
                    pass
            elapsed = time.perf_counter() - start
            thread_used = time.thread_time() - thread_start
            case.drain()
            cpu_used = time.process_time() - cpu_start
            exporter_cpu.append((_exporter_threads_cpu_s() - exporter_start) / spans * 1e6)
            caller.append(elapsed / spans * 1e6)
            caller_cpu.append(thread_used / spans * 1e6)
            cpu.append(cpu_used / spans * 1e6)
    finally:
        case.close()
    return {
        "case": case_name,
        "spans": spans,
        "warmup": {
            "caller_us": caller[0],
            "caller_cpu_us": caller_cpu[0],
            "cpu_us": cpu[0],
            "otlp_thread_cpu_us": exporter_cpu[0],
        },
        "caller_us": caller[1:],
        "caller_cpu_us": caller_cpu[1:],
        "cpu_us": cpu[1:],
        "otlp_thread_cpu_us": exporter_cpu[1:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(measure(args.case, args.spans, args.reps)))


if __name__ == "__main__":
    main()

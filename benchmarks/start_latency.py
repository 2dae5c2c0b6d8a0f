"""How long a span's `_start` record takes to reach the file, idle and with threads spinning for the
interpreter lock.

    python -m benchmarks.start_latency [--rounds 10] [--probes 5] [--spinners 0,4] [--quick]

The promise measured is the one a hang depends on: a rank stuck inside a span
has that span's ``_start`` record in its file, readable by another process,
without any flush. Each round starts one fresh process per case (the cases
interleaved, so a noisy moment hits all of them). The process initialises the
logger with its defaults, starts N threads that run pure-Python loops (they
hold the interpreter lock and give it up only when the interpreter forces a
switch, every 5 ms: the writer thread must wait its turn behind them), then
opens `--probes` spans one at a time. This process (the observer) tails the
file and notes when each ``probe_start`` line appears; the latency is that
moment minus the record's own ``time_us`` (same machine, same wall clock).
The gap before each probe is random (0-100 ms), so probes land at every phase
of the writer's 50 ms schedule.

Prints one JSON line (and a summary on stderr): per case, every sample (ms),
the median, p95 and max.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# -- the measured process --------------------------------------------------------------------------
def child(directory: str, spinners: int, probes: int) -> None:
    from otel_titan import structured_logger as sl

    sl.init_structured_logger(
        "bench", directory, rank=0, world_size=1, run_id="bench-start-latency"
    )
    spinning = True

    def spin() -> None:
        count = 0
        while spinning:
            count += 1

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(spinners)]
    for thread in threads:
        thread.start()
    print("ready", flush=True)
    for _ in range(probes):
        if sys.stdin.readline().strip() != "go":
            break
        with sl.log_trace_span("probe"):
            sys.stdin.readline()  # "seen": the observer found the _start record
    spinning = False
    for thread in threads:
        thread.join()
    sl.shutdown_structured_logger()


# -- the observer ----------------------------------------------------------------------------------
def _one_process(spinners: int, probes: int, rng: random.Random) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="bench-start-latency-") as directory:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.start_latency",
                "--child",
                directory,
                "--spinners",
                str(spinners),
                "--probes",
                str(probes),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            assert process.stdin is not None and process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError(
                    f"the measured process did not start (exit status {process.wait()})"
                )
            (path,) = glob.glob(os.path.join(directory, "structured_logs", "*.jsonl"))
            samples = []
            with open(path, "rb") as log:
                pending = b""
                for _ in range(probes):
                    time.sleep(rng.uniform(0, 0.1))
                    process.stdin.write("go\n")
                    process.stdin.flush()
                    deadline = time.monotonic() + 60
                    found = None
                    while found is None:
                        chunk = log.read()
                        if chunk:
                            seen_ns = time.time_ns()
                            pending += chunk
                            *lines, pending = pending.split(b"\n")
                            for line in lines:
                                if b'"probe_start"' in line:
                                    found = (seen_ns - json.loads(line)["time_us"] * 1000) / 1e6
                        elif time.monotonic() > deadline:
                            raise RuntimeError("no probe_start record within 60 s")
                        else:
                            time.sleep(0.0005)
                    samples.append(found)
                    process.stdin.write("seen\n")
                    process.stdin.flush()
            process.stdin.close()
            if process.wait(60) != 0:
                raise RuntimeError(
                    f"the measured process failed (exit status {process.returncode})"
                )
            return samples
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def summary(samples: list[float]) -> dict:
    samples = [round(s, 3) for s in samples]  # µs resolution: the record's own time is in µs
    ordered = sorted(samples)
    return {
        "samples_ms": samples,
        "median_ms": statistics.median(ordered),
        "p95_ms": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
        "max_ms": ordered[-1],
        "min_ms": ordered[0],
    }


def measure(
    rounds: int, probes: int, spinner_counts: list[int], seed: int = 0, progress=None
) -> dict:
    rng = random.Random(seed)
    samples: dict[int, list[float]] = {count: [] for count in spinner_counts}
    for round_index in range(rounds):
        for count in spinner_counts:
            if progress:
                progress(
                    f"start latency: round {round_index + 1}/{rounds}, {count} spinning threads"
                )
            samples[count].extend(_one_process(count, probes, rng))
    return {
        "rounds": rounds,
        "probes_per_process": probes,
        "cases": {
            f"spinning_{count}": {"spinning_threads": count, **summary(samples[count])}
            for count in spinner_counts
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument(
        "--rounds", type=int, default=10, help="fresh processes per case (default 10)"
    )
    parser.add_argument("--probes", type=int, default=5, help="spans per process (default 5)")
    parser.add_argument(
        "--spinners",
        default="0,4",
        help="comma-separated numbers of spinning threads, one case each (default 0,4)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 round of 3 probes: a smoke run, figures not meaningful",
    )
    parser.add_argument("--child", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, int(args.spinners), args.probes)
        return
    if args.quick:
        args.rounds, args.probes = 1, 3
    counts = [int(c) for c in args.spinners.split(",")]
    result = measure(
        args.rounds, args.probes, counts, progress=lambda m: print(m, file=sys.stderr, flush=True)
    )
    for case in result["cases"].values():
        print(
            f"_start in the file after: {case['median_ms']:.1f} ms median, {case['p95_ms']:.1f} "
            f"ms p95, {case['max_ms']:.1f} ms max "
            f"({len(case['samples_ms'])} spans, {case['spinning_threads']} threads spinning for "
            "the interpreter lock)",
            file=sys.stderr,
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Where summarize's time goes: JSON decoders against DuckDB's reader and today's reader, on the
same files (issue 19, item "at the speed of the parser").

Why: before replacing the reader's decoder (orjson, one dict per line), know
what a typed decoder would buy. Measured on one generated run, in one
interpreter (a decoder comparison: no start-up to hide), the cases
interleaved (the order rotates every round), medians of ``--repeat`` rounds,
the files read from memory (each read once first):

* ``duckdb``: ``read_ndjson`` of summarize's 15 columns (`analysis_scale.SUMMARY_COLUMNS`), grouped;
* ``orjson``: ``orjson.loads`` per line, one dict each (what `read.lines` does at its core);
* ``msgspec dict``: ``msgspec.json.Decoder()`` per line, one dict each;
* ``msgspec Struct``: ``msgspec.json.Decoder(Record)`` per line, a typed Struct of the 15 fields
  (others skipped unparsed);
* ``msgspec Struct lines``: the same, a whole file at a time (``decode_lines``);
* ``reader``: `read.lines.file_records`, the reader with every tolerance, each record whole
  (orjson);
* ``reader trimmed``: the same with ``trimmed=True``, as summarize and export read (msgspec into a
  TypedDict of the fields the analysis reads; odd lines take the tolerant path);
* ``summarize``: `summarize_run`, the whole command but its start and text.

msgspec is in the analysis extra (requirements-dev.txt pins it); without it the msgspec cases are
skipped.

Usage::

    python benchmarks/parse_speed.py                  # 128 ranks x 40 steps (about 46 MB), 3 rounds
    python benchmarks/parse_speed.py --quick          # a smoke run
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import orjson  # noqa: E402 - after the sys.path set-up (run as a script)

from benchmarks.analysis_scale import SUMMARY_COLUMNS  # noqa: E402 - after the sys.path set-up (run as a script)
from benchmarks.generate_run import RunSpec, generate_run  # noqa: E402 - after the sys.path set-up (run as a script)
from otel_titan.analysis import summarize_run  # noqa: E402 - after the sys.path set-up (run as a script)
from otel_titan.analysis.read.lines import SkippedLines, file_records  # noqa: E402 - after the sys.path set-up (run as a script)


def cases(run: str) -> dict[str, Callable[[], Any]]:
    """Each case: a function reading every file of `run` once."""
    import duckdb

    files = sorted(glob.glob(os.path.join(run, "structured_logs", "*.jsonl")))
    blobs = []
    for path in files:
        with open(path, "rb") as handle:
            blobs.append(handle.read())
    columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in SUMMARY_COLUMNS.items()) + "}"
    listed = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
    found: dict[str, Callable[[], Any]] = {
        "duckdb": lambda: (
            duckdb.connect()
            .execute(
                "SELECT filename, log_type_name, count(*), min(time_us), max(step) FROM "
                f"read_ndjson({listed}, columns = {columns}, "
                "ignore_errors = true, filename = true) GROUP BY ALL"
            )
            .fetchall()
        ),
        "orjson": lambda: sum(
            1 for blob in blobs for line in blob.splitlines() if orjson.loads(line)
        ),
    }
    try:
        import msgspec
    except ImportError:
        return {
            **found,
            "reader": lambda: _reader(files),
            "summarize": lambda: summarize_run(run, log_skipped=False, cache=False),
        }

    class Record(msgspec.Struct):
        time_us: int | None = None
        log_type: str | None = None
        log_type_name: str | None = None
        event_name: str | None = None
        step: int | None = None
        span_id: str | None = None
        parent_span_id: str | None = None
        rank: int | None = None
        source: str | None = None
        host_name: str | None = None
        tid: int | None = None
        run_id: str | None = None
        attempt: int | None = None
        value: float | str | None = None
        caller: str | None = None

    plain, typed = msgspec.json.Decoder(), msgspec.json.Decoder(Record)
    found["msgspec dict"] = lambda: sum(
        1 for blob in blobs for line in blob.splitlines() if plain.decode(line)
    )
    found["msgspec Struct"] = lambda: sum(
        1 for blob in blobs for line in blob.splitlines() if typed.decode(line)
    )
    found["msgspec Struct lines"] = lambda: sum(len(typed.decode_lines(blob)) for blob in blobs)
    found["reader"] = lambda: _reader(files)
    found["reader trimmed"] = lambda: _reader(files, trimmed=True)
    found["summarize"] = lambda: summarize_run(run, log_skipped=False, cache=False)
    return found


def _reader(files: list[str], trimmed: bool = False) -> int:
    skipped = SkippedLines(log=False)
    return sum(1 for path in files for _ in file_records(path, skipped, trimmed=trimmed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="JSON decoders against DuckDB's read_ndjson and today's reader, on one generated run."
    )
    parser.add_argument("--ranks", type=int, default=128)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="8 ranks, 4 steps, one round (the figures mean nothing)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.ranks, args.steps, args.repeat = 8, 4, 1
    work = tempfile.mkdtemp(prefix="otel-titan-parse-bench-")
    try:
        run = os.path.join(work, "run")
        generate_run(run, RunSpec(ranks=args.ranks, steps=args.steps, seed=1))
        size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(run, "structured_logs", "*")))
        measured = cases(run)
        times: dict[str, list[float]] = {name: [] for name in measured}
        cpu: dict[str, list[float]] = {name: [] for name in measured}
        names = list(measured)
        for round_ in range(args.repeat):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                started, cpu_started = time.perf_counter(), time.process_time()
                measured[name]()
                times[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - cpu_started)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(times["duckdb"])
    print(
        f"{args.ranks} ranks x {args.steps} steps, {size / 1e6:,.0f} MB; load average "
        f"{os.getloadavg()[0]:.1f}; medians of {args.repeat} interleaved rounds\n"
    )
    print(
        "| case | median s | MB/s | × DuckDB's rate | CPU s (DuckDB's: all its threads) |\n| --- "
        "| ---: | ---: | ---: | ---: |"
    )
    for name, samples in times.items():
        median = statistics.median(samples)
        print(
            f"| {name} | {median:.3f} | {size / 1e6 / median:,.0f} | {base / median:.2f} | "
            f"{statistics.median(cpu[name]):.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

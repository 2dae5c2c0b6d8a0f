"""Native Perfetto trace vs the JSON trace of the same run: size, size gzipped, and time per span.

    .venv/bin/python benchmarks/perfetto_size.py                   # 100 MB of JSONL, 8 ranks (a few
    minutes) .venv/bin/python benchmarks/perfetto_size.py --size-mb 20      # a quick look

Targets (issue 13): the native trace at least 5x smaller than the JSON trace
and at least 2x smaller than the JSON trace gzipped; writing it no slower per
span than the JSON export.

The run is the one `export_throughput` generates (a real run's records as
templates, times, ids and ranks rewritten). Both exports run in this same
process kind: a fresh interpreter per conversion (`export_throughput.run_one`),
one job (``--jobs 1``, so the figures are per core and not a matter of how
work splits), a warm-up of each first, then ``--rounds`` interleaved rounds
(JSON, native, JSON, native, ...); times are the medians, of the wall clock
(the targets) and of the converting process's CPU time (steadier where other
work shares the machine). The JSON trace is
gzipped with the standard library at level 6 (gzip's default).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run as `python benchmarks/perfetto_size.py`
    sys.path.insert(0, REPO)

from benchmarks.export_throughput import capture_templates, generate_run, run_one  # noqa: E402 - after the sys.path set-up (run as a script)


def _gzip_size(path: str) -> int:
    with open(path, "rb") as source, tempfile.TemporaryFile() as target:
        with gzip.GzipFile(fileobj=target, mode="wb", compresslevel=6) as packed:
            shutil.copyfileobj(source, packed, 4 << 20)
        return target.tell()


def _spans(run_dir: str) -> int:
    from otel_titan.analysis import generate_gantt_trace

    with tempfile.TemporaryDirectory() as folder:
        return generate_gantt_trace(
            run_dir, os.path.join(folder, "t.pftrace"), jobs=1, log_skipped=False
        ).spans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size-mb",
        type=float,
        default=100.0,
        help="size of the generated run in MB of JSONL (default 100)",
    )
    parser.add_argument(
        "--ranks", type=int, default=8, help="ranks in the generated run (default 8)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved measured rounds; medians reported (default 3)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="otel-titan-perfetto-size-")
    try:
        templates = capture_templates(workdir)
        run_dir = generate_run(workdir, templates, int(args.size_mb * 1e6), args.ranks, 32 << 20)
        outputs = {
            "json": os.path.join(workdir, "trace.json"),
            "native": os.path.join(workdir, "trace.pftrace"),
        }
        for path in outputs.values():  # warm-up (page cache, imports)
            run_one("ours", run_dir, path, jobs=1)
        times: dict[str, list[float]] = {"json": [], "native": []}
        cpu: dict[str, list[float]] = {"json": [], "native": []}
        for round_ in range(args.rounds):
            for which, path in outputs.items():
                result = run_one("ours", run_dir, path, jobs=1)
                times[which].append(result["seconds"])
                cpu[which].append(result["cpu_seconds"])
                if sys.stderr.isatty():
                    sys.stderr.write(
                        f"\rround {round_ + 1}/{args.rounds}: {which} {result['seconds']:.2f} "
                        "s\x1b[K"
                    )
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[K")
        spans = _spans(run_dir)
        sizes = {which: os.path.getsize(path) for which, path in outputs.items()}
        json_gz = _gzip_size(outputs["json"])
        median = {which: statistics.median(values) for which, values in times.items()}
        median_cpu = {which: statistics.median(values) for which, values in cpu.items()}
        report = {
            "input_bytes": sum(
                os.path.getsize(os.path.join(run_dir, "structured_logs", f))
                for f in os.listdir(os.path.join(run_dir, "structured_logs"))
            ),
            "ranks": args.ranks,
            "spans": spans,
            "json_bytes": sizes["json"],
            "json_gzip_bytes": json_gz,
            "native_bytes": sizes["native"],
            "json_over_native": sizes["json"] / sizes["native"],
            "json_gzip_over_native": json_gz / sizes["native"],
            "json_seconds": median["json"],
            "native_seconds": median["native"],
            "json_us_per_span": median["json"] / spans * 1e6,
            "native_us_per_span": median["native"] / spans * 1e6,
            "native_over_json_time": median["native"] / median["json"],
            "json_cpu_seconds": median_cpu["json"],
            "native_cpu_seconds": median_cpu["native"],
            "native_over_json_cpu": median_cpu["native"] / median_cpu["json"],
            "rounds": times,
            "cpu_rounds": cpu,
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ok = lambda good: "met" if good else "NOT MET"  # noqa: E731 - a one-line local helper
    print(
        f"run: {report['input_bytes'] / 1e6:,.1f} MB of JSONL, {args.ranks} ranks, {spans:,} "
        f"spans; one job; medians of {args.rounds} interleaved rounds"
    )
    print(
        f"  JSON trace        {sizes['json'] / 1e6:10,.1f} MB   {median['json']:6.2f} s   "
        f"{report['json_us_per_span']:6.2f} µs/span"
    )
    print(f"  JSON trace, gzip  {json_gz / 1e6:10,.1f} MB")
    print(
        f"  native trace      {sizes['native'] / 1e6:10,.1f} MB   {median['native']:6.2f} s   "
        f"{report['native_us_per_span']:6.2f} µs/span"
    )
    print(
        f"  native is {report['json_over_native']:.2f}x smaller than JSON (target >= 5x: "
        f"{ok(report['json_over_native'] >= 5)}), "
        f"{report['json_gzip_over_native']:.2f}x smaller than JSON gzipped (target >= 2x: "
        f"{ok(report['json_gzip_over_native'] >= 2)})"
    )
    print(
        f"  native takes {report['native_over_json_time']:.2f}x the JSON export's time per span "
        f"(target <= 1x: {ok(report['native_over_json_time'] <= 1)})"
    )
    print(
        f"  CPU time (steadier on a shared machine): JSON {median_cpu['json']:.2f} s, native "
        f"{median_cpu['native']:.2f} s, {report['native_over_json_cpu']:.2f}x"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`otel-titan sql` against `otel-titan summarize` on one big generated run: the per-phase, per-rank
p50/p99 query.

Why: issue 15 asks that the per-phase, per-rank p50/p99 query over the 2 GB
generated 1,024-rank run take at most 30 s on this 2-core machine, measured
side by side with summarize, which computes the same kind of aggregation
(per-phase percentiles, per-rank step medians) in its own full pass. Each
measurement is a fresh process (imports, reading, aligning clocks, the
query, printing), the two commands are interleaved round by round after a
warm-up of each (page cache warm for both), and the medians and their
ratio are reported with the peak memory of each.

Usage::

    python benchmarks/sql_scale.py /tmp/run --ranks 1024 --steps 200   # generates the run when
    missing (about 2 GB) python benchmarks/sql_scale.py /tmp/run --rounds 3 --keep          # keep
    the run afterwards
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

QUERY = (
    "SELECT name, rank, count(*) AS n, quantile_cont(duration_ms, 0.5) AS p50_ms, "
    "quantile_cont(duration_ms, 0.99) AS p99_ms "
    "FROM spans WHERE NOT incomplete GROUP BY name, rank ORDER BY name, rank"
)


def _measure(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one fresh process; its output goes to /dev/null."""
    env = {**os.environ, "PYTHONPATH": REPO}
    started = time.monotonic()
    with open(os.devnull, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.PIPE, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr = process.stderr.read().decode() if process.stderr else ""
    seconds = time.monotonic() - started
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}): {stderr[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time `otel-titan sql` (per-phase, per-rank p50/p99) against `otel-titan summarize` on a generated run."
    )
    parser.add_argument(
        "run_dir", help="the run (generated there first when it has no structured_logs/)"
    )
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep a run this script generated")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args(argv)
    generated = False
    if not os.path.isdir(os.path.join(args.run_dir, "structured_logs")):
        from benchmarks.generate_run import RunSpec, generate_run

        print(
            f"generating {args.ranks} ranks x {args.steps} steps in {args.run_dir} ...", flush=True
        )
        generate_run(
            args.run_dir,
            RunSpec(
                ranks=args.ranks,
                steps=args.steps,
                seed=15,
                straggler=(min(300, args.ranks - 1), "fwd", 20.0),
            ),
            progress=True,
        )
        generated = True
    size = sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(os.path.join(args.run_dir, "structured_logs"))
        for f in files
    )
    sql = [
        sys.executable,
        "-m",
        "otel_titan.cli",
        "sql",
        args.run_dir,
        QUERY,
        "--format",
        "csv",
        "--no-cache",
    ]
    summarize = [
        sys.executable,
        "-m",
        "otel_titan.cli",
        "summarize",
        args.run_dir,
        "--json",
        "--no-cache",
    ]
    try:
        print(f"run: {size / 1e9:.2f} GB; warm-up ...", flush=True)
        _measure(sql)
        _measure(summarize)
        times: dict[str, list[float]] = {"sql": [], "summarize": []}
        memory: dict[str, float] = {"sql": 0.0, "summarize": 0.0}
        for round_number in range(args.rounds):
            for name, command in (("sql", sql), ("summarize", summarize)):
                seconds, rss = _measure(command)
                times[name].append(seconds)
                memory[name] = max(memory[name], rss)
                print(
                    f"round {round_number + 1}: {name} {seconds:.1f} s, {rss:,.0f} MB", flush=True
                )
        load = os.getloadavg()[0]
    finally:
        if generated and not args.keep:
            shutil.rmtree(args.run_dir, ignore_errors=True)
    result = {
        "bytes": size,
        "rounds": args.rounds,
        "sql_median_s": statistics.median(times["sql"]),
        "summarize_median_s": statistics.median(times["summarize"]),
        "sql_peak_rss_mb": memory["sql"],
        "summarize_peak_rss_mb": memory["summarize"],
        "times": times,
        "load_average_1min_at_end": load,
        "cpus": os.cpu_count(),
    }
    result["ratio_sql_to_summarize"] = result["sql_median_s"] / result["summarize_median_s"]
    print(
        f"sql p50/p99 per phase and rank: {result['sql_median_s']:.1f} s (median of "
        f"{args.rounds}), peak {memory['sql']:,.0f} MB; "
        f"summarize: {result['summarize_median_s']:.1f} s, peak {memory['summarize']:,.0f} MB; "
        f"sql/summarize = {result['ratio_sql_to_summarize']:.2f}; {size / 1e9:.2f} GB, "
        f"{os.cpu_count()} CPUs, load {load:.1f}"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A second question is free: `summarize`, `sql` and `report` with the analysis cache, against a
full read, and a run that grew.

Why: the issue's target is a second ``summarize``, ``report`` or ``sql`` on an
unchanged 1,024-rank run in at most 1 s on local disk, and a run that grew
read only from where it was. Measured on a run written by
`benchmarks/generate_run.py` (default 1,024 ranks × 50 steps, about 470 MB),
each command a fresh ``otel-titan`` process (interpreter start and imports
included: what a user waits for), wall time, the files in the page cache
(read once first). Per round, in this order:

* ``full``: the command with ``--no-cache`` (every byte read, as before the cache);
* ``second``: the command again with the cache, which the round's first cached
  run filled (that run is not timed);
* ``grown``: every file cut at ``--grown-from`` (95 %) of its lines, the cache
  filled from that (not timed), the rest appended, then the command timed:
  it reads the appended 5 % only (summarize; sql and report load again).

The figures are medians over ``--repeat`` rounds, and each command's CPU
time (user + system) beside them: on a busy machine (the load is printed)
every wall time is slower, the CPU time much less so; compare within one run.

Usage::

    python benchmarks/cache_speed.py                       # 1,024 ranks × 50 steps, 3 rounds;
    deleted after python benchmarks/cache_speed.py --run /tmp/run --repeat 1 --commands summarize
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.generate_run import RunSpec, generate_run  # noqa: E402 - after the sys.path set-up (run as a script)

QUERY = (
    "SELECT name, count(*), quantile_cont(duration_ms, 0.99) FROM spans GROUP BY name ORDER BY name"
)


def _command(name: str, run: str, out: str) -> list[str]:
    base = [sys.executable, "-m", "otel_titan.cli"]
    if name == "summarize":
        return [*base, "summarize", run, "--no-progress"]
    if name == "sql":
        return [*base, "sql", run, QUERY, "--format", "csv", "--no-progress"]
    if name == "report":
        return [*base, "report", run, "-o", os.path.join(out, "report.html"), "--no-progress"]
    raise ValueError(name)


# (what, user + system seconds of the command): less bent by other work on the machine than wall
# time
CPU: list[tuple[str, float]] = []


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], what: str = "") -> float:
    env = {**os.environ, "PYTHONPATH": REPO}
    cpu = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, env=env, timeout=1800)
    elapsed = time.perf_counter() - started
    # 1: the summary found something to look at (a hang, a straggler)
    if done.returncode not in (
        0,
        1,
    ):
        raise RuntimeError(
            f"{command}: exit {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}"
        )
    if what:
        CPU.append((what, _children_cpu() - cpu))
    return elapsed


def _cut_points(files: list[str], fraction: float) -> dict[str, int]:
    points = {}
    for path in files:
        with open(path, "rb") as handle:
            data = handle.read()
        points[path] = data.rindex(b"\n", 0, int(len(data) * fraction)) + 1
    return points


def measure(
    run: str, commands: list[str], repeat: int, grown_from: float
) -> dict[str, dict[str, float]]:
    files = sorted(glob.glob(os.path.join(run, "structured_logs", "*.jsonl")))
    cuts = _cut_points(files, grown_from)
    tails = {}
    for path in files:
        with open(path, "rb") as handle:
            handle.seek(cuts[path])
            tails[path] = handle.read()
    times: dict[str, dict[str, list[float]]] = {
        name: {"full": [], "second": [], "grown": []} for name in commands
    }
    with tempfile.TemporaryDirectory(prefix="otel-titan-cache-bench-") as out:
        for path in files:  # into the page cache
            with open(path, "rb") as handle:
                while handle.read(1 << 24):
                    pass
        for _ in range(repeat):
            for name in commands:
                command = _command(name, run, out)
                times[name]["full"].append(_timed([*command, "--no-cache"], f"{name} full"))
                _timed(command)  # fills the cache (not timed)
                times[name]["second"].append(_timed(command, f"{name} second"))
                for path in files:  # the run as it was at `grown_from` ...
                    os.truncate(path, cuts[path])
                _timed(command)  # ... cached (not timed) ...
                for path in files:  # ... and grown since
                    with open(path, "ab") as handle:
                        handle.write(tails[path])
                times[name]["grown"].append(_timed(command, f"{name} grown"))
    return {
        name: {kind: statistics.median(values) for kind, values in kinds.items()}
        for name, kinds in times.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run",
        help="an existing run to measure (default: generate one in a temporary folder, deleted after)",
    )
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--grown-from",
        type=float,
        default=0.95,
        help="the grown run was cached at this fraction of its bytes (default 0.95)",
    )
    parser.add_argument(
        "--commands", default="summarize,sql,report", help="comma-separated: summarize, sql, report"
    )
    args = parser.parse_args()
    commands = [name for name in args.commands.split(",") if name]
    folder = None
    run = args.run
    if run is None:
        folder = tempfile.mkdtemp(prefix="otel-titan-cache-run-")
        run = os.path.join(folder, "run")
        generate_run(
            run,
            RunSpec(
                ranks=args.ranks,
                steps=args.steps,
                seed=1,
                straggler=(min(7, args.ranks - 1), "bwd", 20.0),
            ),
        )
    else:
        shutil.rmtree(os.path.join(run, "analysis", "cache"), ignore_errors=True)
    try:
        size = sum(
            os.path.getsize(p) for p in glob.glob(os.path.join(run, "structured_logs", "*.jsonl"))
        )
        load = os.getloadavg()[0]
        result = measure(run, commands, args.repeat, args.grown_from)
        print(
            json.dumps(
                {
                    "ranks": args.ranks,
                    "steps": args.steps,
                    "bytes": size,
                    "load_before": load,
                    "load_after": os.getloadavg()[0],
                    "median_s": result,
                },
                indent=2,
            )
        )
        print(
            f"\n{size / 1e6:,.0f} MB; load average {load:.1f} before, {os.getloadavg()[0]:.1f} "
            f"after ({os.cpu_count()} CPUs); medians of {args.repeat}, wall time of a fresh "
            "otel-titan process:"
        )
        print(
            f"{'command':<10} {'--no-cache':>11} {'second':>8} "
            f"{f'grown ({100 - 100 * args.grown_from:.0f} % appended)':>22}"
        )
        for name, kinds in result.items():
            print(
                f"{name:<10} {kinds['full']:>10.2f}s {kinds['second']:>7.2f}s "
                f"{kinds['grown']:>21.2f}s"
            )
        cpu: dict[str, list[float]] = {}
        for what, seconds in CPU:
            cpu.setdefault(what, []).append(seconds)
        print(
            "CPU time (user + system, median; DuckDB's threads add up):",
            ", ".join(f"{what} {statistics.median(v):.2f}s" for what, v in cpu.items()),
        )
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

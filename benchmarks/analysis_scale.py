"""The analysis commands against DuckDB's JSON reader, side by side: 64, 256 and 1,024 ranks (`make
bench-analysis`).

Why: issue 19 sets the analysis' speed relative to the parser a user could
reach for instead: DuckDB's ``read_ndjson`` reading the same files' columns
that summarize uses (kind, name, time, step, span and parent ids, rank,
source, host, thread, run, attempt, value, caller) and grouping them. A full
`summarize` should read at ≥ 0.5× that rate, `export` at ≥ 0.3×. This
measures where each command stands, in one run, on the same machine:

* ``duckdb``: ``read_ndjson`` of those columns, grouped per file and record kind;
* ``summarize``: `summarize_run` + the text (one process, the default);
* ``summarize --jobs 2``: the same on two local worker interpreters;
* ``export``: `generate_gantt_trace` (default jobs: one per CPU for 64 MB or more);
* ``export --jobs 1``: the same in one process;
* ``report``: `write_report` (the HTML report);
* ``sql``: `open_run` + `RunDatabase.load` (DuckDB reads every column the
  views use) + one query over the ``spans`` view.

Runs are written by `benchmarks/generate_run.py` (a hung rank at 3/4 of the
steps, a 20 % straggler, host clock offsets), read once first so that every
command reads from the page cache, measured, then deleted. Each command runs
in a fresh interpreter, the order rotating every round (interleaved), and
the figure is the median over ``--repeat`` rounds. The time is the child's
own around the work (imports excluded), beside its CPU time (its own and
its waited-for workers': steadier than the wall clock on a shared machine,
but DuckDB's threads add up); peak memory is the child's
``ru_maxrss`` from ``wait4`` (its ``getrusage``), or for a command with
worker processes the sum of each process's peak over its tree.

Usage::

    python benchmarks/analysis_scale.py                # 64, 256, 1,024 ranks x 40 steps, 3 rounds
    (about 8 min on 2 cores) python benchmarks/analysis_scale.py --quick        # a CI-size smoke
    run (figures mean nothing) python benchmarks/analysis_scale.py --ranks 256 --baseline /tmp/base
    # before/after: also each command from another checkout
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.export_throughput import _TreeMemory  # noqa: E402 - after the sys.path set-up (run as a script)
from benchmarks.generate_run import RunSpec, generate_run  # noqa: E402 - after the sys.path set-up (run as a script)
from tests.helpers import processes  # noqa: E402 - kills a measured command's whole tree on an interruption

#: The fields summarize reads from a record (docs/schema.md), as DuckDB reads them.
SUMMARY_COLUMNS = {
    "time_us": "BIGINT",
    "log_type": "VARCHAR",
    "log_type_name": "VARCHAR",
    "event_name": "VARCHAR",
    "step": "BIGINT",
    "span_id": "VARCHAR",
    "parent_span_id": "VARCHAR",
    "rank": "BIGINT",
    "source": "VARCHAR",
    "host_name": "VARCHAR",
    "tid": "BIGINT",
    "run_id": "VARCHAR",
    "attempt": "BIGINT",
    "value": "VARCHAR",
    "caller": "VARCHAR",
}

_DUCKDB = f"""
import duckdb, glob, os
COLUMNS = {SUMMARY_COLUMNS!r}
def work(run, out):
    files = sorted(glob.glob(os.path.join(run, "structured_logs", "*.jsonl*")))
    columns = "{{" + ", ".join(f"'{{k}}': '{{v}}'" for k, v in COLUMNS.items()) + "}}"
    listed = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
    rows = duckdb.connect().execute(
        f"SELECT filename, log_type, log_type_name, count(*), min(time_us), max(time_us), max(step), count(DISTINCT span_id), "
        f"count(parent_span_id), any_value(rank), any_value(source), any_value(host_name), any_value(tid), any_value(run_id), "
        f"max(attempt), count(value), count(caller), count(event_name) "
        f"FROM read_ndjson({{listed}}, columns = {{columns}}, ignore_errors = true, filename = true, maximum_object_size = 67108864) GROUP BY ALL"
    ).fetchall()
    return len(rows)
"""

#: What each command's child runs: ``work(run, out)`` returns something of the result (so that
#: nothing is skipped).
CHILDREN = {
    "duckdb": _DUCKDB,
    "summarize": "from otel_titan.analysis import summarize_run, format_summary\ndef work(run, out): return len(format_summary(summarize_run(run, log_skipped=False, cache=False)))",
    "summarize --jobs 2": "from otel_titan.analysis import summarize_run, format_summary\ndef work(run, out): return len(format_summary(summarize_run(run, log_skipped=False, jobs=2, cache=False)))",
    "export": "from otel_titan.analysis import generate_gantt_trace\ndef work(run, out): return generate_gantt_trace(run, out + '.json', log_skipped=False, max_output_bytes=None).events",
    "export --jobs 1": "from otel_titan.analysis import generate_gantt_trace\ndef work(run, out): return generate_gantt_trace(run, out + '.json', log_skipped=False, max_output_bytes=None, jobs=1).events",
    "report": "from otel_titan.analysis.report import write_report\ndef work(run, out): write_report(run, out + '.html', cache=False); return os.path.getsize(out + '.html')\nimport os",
    "sql": "from otel_titan.analysis.query.sql import open_run\ndef work(run, out):\n    db = open_run(run, cache=False); db.load()\n    return db.con.execute('SELECT name, count(*), quantile_cont(duration_ms, 0.99) FROM spans GROUP BY name').fetchall()",
}
COMMANDS = list(CHILDREN)


#: What a measured child runs: the command's snippet (argv[1]) on the run (argv[2]), timed around
#: `work` only. Run with ``-c`` from the checkout measured (its folder first on the path): nothing
#: of this script is imported, so a ``--baseline`` checkout's own otel_titan is what runs.
_CHILD = """import json, resource, sys, time
namespace = {}
exec(sys.argv[1], namespace)
def cpu():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
started, cpu_started = time.perf_counter(), cpu()
result = namespace["work"](sys.argv[2], sys.argv[3])
print(json.dumps({"seconds": time.perf_counter() - started, "cpu_seconds": cpu() - cpu_started, "size": len(result) if isinstance(result, list) else result}))
"""


#: A measured command run from another checkout (``--baseline DIR``) is named with this suffix.
BASELINE = " (baseline)"


def measure(which: str, run: str, out: str, baseline: str | None = None) -> dict[str, Any]:
    """One command in a fresh interpreter: its own time, and its peak memory (``ru_maxrss``; the
    tree's sum when it has workers).

    `baseline`: run it from that checkout of otel-titan instead (its own copy of this script and
    package).
    """
    repo = REPO
    if which.endswith(BASELINE):
        which, repo = which[: -len(BASELINE)], baseline or REPO
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, CHILDREN[which], run, out],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": repo},
        cwd=repo,
    )
    sampler = _TreeMemory(child.pid)
    sampler.start()
    try:
        output = child.stdout.read()  # type: ignore[union-attr]
        _, status, usage = os.wait4(child.pid, 0)
    except BaseException:
        processes.kill_tree(child)
        raise
    finally:
        sampler.stop()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{which} failed on {run}")
    # The figures are the child's last line (a worker or library that also writes to stdout must not
    # break it).
    result = json.loads(output.strip().splitlines()[-1])
    own = usage.ru_maxrss * 1024
    result["peak_rss_bytes"] = (
        max(sum(sampler.peaks.values()), own) if len(sampler.peaks) > 1 else own
    )
    for suffix in (".json", ".html"):
        if os.path.exists(out + suffix):
            os.unlink(out + suffix)
    return result


def _read_once(run: str) -> int:
    total = 0
    for root, _, files in os.walk(run):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                while chunk := handle.read(1 << 24):
                    total += len(chunk)
    return total


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of docs/performance.md: per size and command, median time, MB/s, the rate
    as a fraction of DuckDB's, peak memory."""
    lines = [
        "| ranks | MB | command | median s | MB/s | × DuckDB's rate | CPU s | peak MB |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        base = row["commands"]["duckdb"]["median_s"]
        for which, figures in row["commands"].items():
            rate = row["bytes"] / 1e6 / figures["median_s"] if figures["median_s"] > 0 else 0.0
            ratio = base / figures["median_s"] if figures["median_s"] > 0 else 0.0
            lines.append(
                f"| {row['ranks']:,} | {row['bytes'] / 1e6:,.0f} | {which} | "
                f"{figures['median_s']:.2f} | {rate:,.0f} | {ratio:.2f} | "
                f"{figures.get('median_cpu_s', 0.0):.2f} | {figures['peak_mb']:,.0f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="otel-titan summarize, --jobs 2, export, report and sql against DuckDB's read_ndjson, side by side (64, 256, 1,024 ranks)."
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--commands",
        nargs="+",
        choices=COMMANDS,
        default=COMMANDS,
        help="a subset of the commands (duckdb is always measured: it is the reference)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 8 and 16 ranks, 4 steps, one round (for CI; the figures mean nothing)",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        help="where to generate the runs (default: a temporary folder, deleted after)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also measure the commands from this checkout of otel-titan (e.g. a `git worktree` of the commit before a change), "
        "interleaved with this one's, named '<command> (baseline)': a before/after in one run",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.ranks, args.steps, args.repeat = [8, 16], 4, 1
    commands = ["duckdb", *[c for c in args.commands if c != "duckdb"]]
    if args.baseline:
        commands += [c + BASELINE for c in commands[1:]]
    work = tempfile.mkdtemp(prefix="otel-titan-analysis-bench-", dir=args.workdir)
    rows = []
    try:
        for ranks in args.ranks:
            run = os.path.join(work, f"run-{ranks}")
            started = time.monotonic()
            generate_run(
                run,
                RunSpec(
                    ranks=ranks,
                    steps=args.steps,
                    seed=ranks,
                    hung=(ranks // 2 + 1, max(1, args.steps * 3 // 4)),
                    straggler=(ranks // 4, "fwd", 20.0),
                ),
            )
            size = _read_once(run)
            print(
                f"{ranks} ranks x {args.steps} steps: {size / 1e6:,.0f} MB (generated in "
                f"{time.monotonic() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            results: dict[str, list[dict[str, Any]]] = {c: [] for c in commands}
            for round_ in range(args.repeat):
                order = commands[round_ % len(commands) :] + commands[: round_ % len(commands)]
                for which in order:
                    result = measure(which, run, os.path.join(work, "out"), args.baseline)
                    results[which].append(result)
                    print(
                        f"  {which}: {result['seconds']:.2f} s ({result['cpu_seconds']:.2f} s "
                        f"CPU), {result['peak_rss_bytes'] / 1e6:.0f} MB",
                        file=sys.stderr,
                        flush=True,
                    )
            rows.append(
                {
                    "ranks": ranks,
                    "steps": args.steps,
                    "bytes": size,
                    "commands": {
                        c: {
                            "median_s": statistics.median(r["seconds"] for r in results[c]),
                            "median_cpu_s": statistics.median(r["cpu_seconds"] for r in results[c]),
                            "peak_mb": statistics.median(r["peak_rss_bytes"] for r in results[c])
                            / 1e6,
                            "rounds_s": [r["seconds"] for r in results[c]],
                        }
                        for c in commands
                    },
                }
            )
            shutil.rmtree(run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"\n{cpus} CPUs, load average {os.getloadavg()[0]:.1f} at the end; medians of "
        f"{args.repeat} interleaved rounds, fresh interpreters\n"
    )
    print(table(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"cpus": cpus, "repeat": args.repeat, "rows": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The step table (`RunAnalysis.steps()`) from the writer's rollups against from the spans: time and
bytes parsed.

Why: the point of the rollups (issue 19, "The writer helps") is that a
step-level question reads a few percent of the bytes. Two runs are generated
from one spec (benchmarks/generate_run.py: a 20 % straggler, hosts' clocks
±5 ms), one with rollups (as the library writes by default) and one
without (as ``step_rollups=False``, torchtitan's files, older ones): the
same spans line for line. `RunAnalysis(run).steps()` is asked of each in a
fresh interpreter, interleaved (the order alternates every round), each
input read once first so that both read from the page cache; the figures
are medians over ``--repeat`` rounds. Time is measured by the child around
the work (imports excluded); peak RSS is the child's.

The tables are checked equal (the same rows) before anything is timed.

Usage::

    python benchmarks/step_table.py                     # 256 ranks × 100 steps, --repeat 5
    python benchmarks/step_table.py --ranks 16 --steps 10 --repeat 1    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from benchmarks.generate_run import RunSpec, generate_run  # noqa: E402 - after the sys.path set-up (run as a script)


def _child(run: str, rows_out: str | None) -> None:
    from otel_titan.analysis import RunAnalysis  # imports are not timed

    started = time.perf_counter()
    table = RunAnalysis(run, log_skipped=False).steps()
    seconds = time.perf_counter() - started
    if rows_out:
        with open(rows_out, "w", encoding="utf-8") as handle:
            json.dump(
                [
                    [
                        r.source,
                        r.attempt,
                        r.rank,
                        r.step,
                        r.step_ms,
                        r.phases,
                        r.closing,
                        r.closing_enter_us,
                        r.closing_exit_us,
                    ]
                    for r in table.rows
                ],
                handle,
            )
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "seconds": seconds,
                "source": table.source,
                "rows": len(table.rows),
                "parsed_bytes": table.parsed_bytes,
                "total_bytes": table.total_bytes,
                "peak_mb": peak_kb / 1024,
            }
        )
    )


def measure(run: str, rows_out: str | None = None) -> dict[str, Any]:
    """`steps()` of `run` in a fresh interpreter."""
    result = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", run, rows_out or ""],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _read_all(run: str) -> None:
    for folder, _, names in os.walk(run):
        for name in names:
            with open(os.path.join(folder, name), "rb") as handle:
                while handle.read(1 << 24):
                    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--workdir",
        default=None,
        help="where the two runs are written (deleted after); default: a temporary folder",
    )
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1] or None)
        return 0
    work = tempfile.mkdtemp(prefix="step-table-", dir=args.workdir)
    try:
        runs = {}
        for rollups in (True, False):
            runs[rollups] = os.path.join(work, "rollups" if rollups else "spans")
            generate_run(
                runs[rollups],
                RunSpec(
                    ranks=args.ranks,
                    steps=args.steps,
                    seed=7,
                    straggler=(args.ranks // 3, "fwd", 20.0),
                    start_us=1_796_000_000_000_000,
                    rollups=rollups,
                ),
                jobs=2,
            )
        with_rows, without_rows = os.path.join(work, "a.json"), os.path.join(work, "b.json")
        first = {True: measure(runs[True], with_rows), False: measure(runs[False], without_rows)}
        if first[True]["source"] != "rollups" or first[False]["source"] != "spans":
            raise SystemExit(f"not the paths measured: {first}")
        with open(with_rows, encoding="utf-8") as a, open(without_rows, encoding="utf-8") as b:
            mine, theirs = json.load(a), json.load(b)
        if [row[1:] for row in mine] != [row[1:] for row in theirs]:
            raise SystemExit("the two tables differ: nothing timed")
        figures: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for round_ in range(args.repeat):
            for rollups in (True, False) if round_ % 2 == 0 else (False, True):
                _read_all(runs[rollups])
                figures[rollups].append(measure(runs[rollups]))
        load = os.getloadavg()[0]
        out = {
            "ranks": args.ranks,
            "steps": args.steps,
            "repeat": args.repeat,
            "rows": first[True]["rows"],
            "load_1min": round(load, 2),
        }
        for rollups, name in ((True, "rollups"), (False, "spans")):
            runs_of = figures[rollups]
            out[name] = {
                "seconds": round(statistics.median(f["seconds"] for f in runs_of), 3),
                "parsed_mb": round(runs_of[0]["parsed_bytes"] / 1e6, 2),
                "total_mb": round(runs_of[0]["total_bytes"] / 1e6, 1),
                "peak_mb": round(statistics.median(f["peak_mb"] for f in runs_of), 1),
            }
        out["speedup"] = round(out["spans"]["seconds"] / out["rollups"]["seconds"], 1)
        out["parsed_share"] = round(out["rollups"]["parsed_mb"] / out["spans"]["total_mb"], 4)
        print(
            f"{args.ranks} ranks × {args.steps} steps, {out['rows']} rows, median of "
            f"{args.repeat} (load {load:.1f}):"
        )
        for name in ("rollups", "spans"):
            f = out[name]
            print(
                f"  from {name:8s} {f['seconds']:7.3f} s  parsed {f['parsed_mb']:8.2f} MB of "
                f"{f['total_mb']:7.1f} MB  peak {f['peak_mb']:6.1f} MB"
            )
        print(
            f"  rollups: {out['speedup']}x faster, {out['parsed_share'] * 100:.1f} % of the bytes "
            "parsed"
        )
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(out, handle, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

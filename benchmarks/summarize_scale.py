"""How `otel-titan summarize` scales with ranks: 64, 256, 1,024 ranks × 200 steps (about 2 GB at
1,024), side by side with baselines.

Why: users run on thousands of GPUs; the summary must read the run at least
as fast per byte as the export does, in bounded memory, and "where did every
rank stop" (`summarize --tail`) in seconds whatever the file sizes. Runs are
written by `benchmarks/generate_run.py` (a hung rank at 3/4 of the steps, a
20% straggler, ±5 ms host clocks), measured, then deleted.

Measured per run size, each in a fresh interpreter, interleaved (the order
rotates every round), the input read once first so that every command reads
from the page cache; the figure is the median over ``--repeat`` rounds:

* ``summarize``: `summarize_run` + the text, this code (default jobs);
* ``summarize --tail``: `summarize_tails` + the text;
* ``export``: `generate_gantt_trace` (default jobs), the baseline the issue set
  ("at least as fast per byte as the export");
* ``summarize@REF``: the summary of another revision (``--baseline-ref``,
  default the commit before this work), extracted with ``git archive``;
  skipped when git cannot find it.

Time is measured by the child around the work (imports excluded); peak memory
is the sum over the process tree of each process's peak (`export_throughput._TreeMemory`).

Usage::

    python benchmarks/summarize_scale.py                      # 64, 256, 1024 ranks; --repeat 3
    python benchmarks/summarize_scale.py --ranks 64 --steps 50 --repeat 1   # a quick look
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

DEFAULT_BASELINE_REF = "e580921"

_CHILD = {
    "summarize": "from otel_titan.analysis import summarize_run, format_summary\ndef work(run, out): return len(format_summary(summarize_run(run, log_skipped=False, cache=False)))",
    "tail": "from otel_titan.analysis.model.collect import summarize_tails\nfrom otel_titan.analysis import format_summary\ndef work(run, out): return len(format_summary(summarize_tails(run, log_skipped=False)))",
    "export": "from otel_titan.analysis import generate_gantt_trace\ndef work(run, out): return generate_gantt_trace(run, out, log_skipped=False, max_output_bytes=None).events",
    "baseline": "from otel_titan.analysis import summarize_run, format_summary\ndef work(run, out): return len(format_summary(summarize_run(run, log_skipped=False)))",
}


def _child(which: str, run: str, out: str) -> None:
    namespace: dict[str, Any] = {}
    exec(_CHILD[which], namespace)  # our own fixed snippets
    started = time.perf_counter()
    size = namespace["work"](run, out)
    print(json.dumps({"seconds": time.perf_counter() - started, "size": size}))


def measure(which: str, run: str, out: str, pythonpath: str) -> dict[str, Any]:
    """One command in a fresh interpreter: its own time, and the peak memory of its process tree."""
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", which, run, out],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": pythonpath},
        cwd=REPO,
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
    result = json.loads(output)
    largest = usage.ru_maxrss * 1024
    result["peak_rss_bytes"] = (
        max(sum(sampler.peaks.values()), largest) if len(sampler.peaks) > 1 else largest
    )
    if os.path.exists(out):
        os.unlink(out)
    return result


def _baseline_tree(ref: str, work: str) -> str | None:
    """The package as it was at `ref`, extracted into `work`; None when git cannot find it."""
    target = os.path.join(work, "baseline")
    os.makedirs(target)
    archive = subprocess.run(["git", "-C", REPO, "archive", ref, "otel_titan"], capture_output=True)
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", target], input=archive.stdout, check=True)
    return target


def _read_once(run: str) -> int:
    total = 0
    for root, _, files in os.walk(run):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                while chunk := handle.read(1 << 24):
                    total += len(chunk)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Scaling of otel-titan summarize (64, 256, 1,024 ranks) against the export and an earlier summarize, in the same run."
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--baseline-ref",
        default=DEFAULT_BASELINE_REF,
        help=f"git revision whose summarize is the baseline (default {DEFAULT_BASELINE_REF}, before this work); '' to skip",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        help="where to generate the runs (default: a temporary folder, deleted after)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="otel-titan-scale-", dir=args.workdir)
    rows = []
    try:
        baseline = _baseline_tree(args.baseline_ref, work) if args.baseline_ref else None
        commands = ["summarize", "tail", "export"] + (["baseline"] if baseline else [])
        for ranks in args.ranks:
            run = os.path.join(work, f"run-{ranks}")
            started = time.monotonic()
            truth = generate_run(
                run,
                RunSpec(
                    ranks=ranks,
                    steps=args.steps,
                    seed=ranks,
                    hung=(ranks // 2 + 1, args.steps * 3 // 4),
                    straggler=(ranks // 4, "fwd", 20.0),
                ),
                progress=True,
            )
            size = _read_once(run)
            print(
                f"{ranks} ranks: {size / 1e6:,.0f} MB, {truth['files']} files (generated in "
                f"{time.monotonic() - started:.0f} s)",
                file=sys.stderr,
            )
            results: dict[str, list[dict[str, Any]]] = {c: [] for c in commands}
            for round_ in range(args.repeat):
                order = commands[round_ % len(commands) :] + commands[: round_ % len(commands)]
                for which in order:
                    path = baseline if which == "baseline" else REPO
                    result = measure(which, run, os.path.join(work, "trace.json"), path)  # type: ignore[arg-type]
                    results[which].append(result)
                    print(
                        f"  {which}: {result['seconds']:.2f} s, "
                        f"{result['peak_rss_bytes'] / 1e6:.0f} MB",
                        file=sys.stderr,
                    )
            row = {"ranks": ranks, "steps": args.steps, "bytes": size}
            for which, runs in results.items():
                seconds = statistics.median(r["seconds"] for r in runs)
                row[which] = {
                    "seconds": round(seconds, 3),
                    "mb_per_s": round(size / 1e6 / seconds, 1),
                    "peak_mb": round(max(r["peak_rss_bytes"] for r in runs) / 1e6, 1),
                    "runs": [round(r["seconds"], 3) for r in runs],
                }
            rows.append(row)
            shutil.rmtree(run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    names = {
        "summarize": "summarize",
        "tail": "summarize --tail",
        "export": "export (baseline)",
        "baseline": f"summarize @{args.baseline_ref} (baseline)",
    }
    print("| ranks | JSONL | " + " | ".join(names[c] for c in commands) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in commands) + " |")
    for row in rows:
        cells = [
            f"{row[c]['seconds']:.2f} s, {row[c]['mb_per_s']:,.0f} MB/s, {row[c]['peak_mb']:.0f} MB"
            for c in commands
        ]
        print(f"| {row['ranks']:,} | {row['bytes'] / 1e6:,.0f} MB | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"rows": rows, "repeat": args.repeat, "nproc": os.cpu_count()}, handle, indent=2
            )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:5])
        sys.exit(0)
    sys.exit(main())

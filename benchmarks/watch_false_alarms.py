"""False alarms of `otel-titan watch` over one long healthy job, replayed: toward a simulated
job-day at 1,024 ranks.

Why a benchmark of its own: the issue's target is at most one false alarm per
simulated job-day at 1,024 ranks, and a job-day does not fit on a disk at
once (at 2 s steps, 43,200 steps × 1,024 ranks: about 400 GB of records). So
the job is generated in chunks of `--chunk-steps` steps
(`benchmarks/generate_run.py`: each chunk continues the steps, the clock
offsets, the drift and every rank's own speed of the one before, with fresh
noise), and every chunk is streamed into *one* detector
(`watch.replay.Replayer`) before it is deleted: the detector sees one job,
its baselines, learned durations and alerts carried from chunk to chunk, as
`watch` would over a day. Frames are not built (they change no alert).

The job has every nuisance the issue names: noise (3 % a phase), host clock
offsets (±5 ms) and drift (±3 ms over the job), 4 pipeline stages of
different cost (peers are the ranks of one stage), step lengths that vary
together with a token count, and a long pause every rank shares (a 60 s
checkpoint every `--pause-every` steps).

Every alert is a false alarm here (the job is healthy). It prints the
exposure reached (simulated hours, rank-hours, rank-steps, refreshes), the
alerts, and the CPU it took; `--budget-s` stops it early (a job-day at 1,024
ranks costs hours of CPU), and the figures say how far it got.

Usage::

    python benchmarks/watch_false_alarms.py --ranks 1024 --hours 24 --budget-s 1800
    python benchmarks/watch_false_alarms.py --ranks 64 --hours 2      # a quick one
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.generate_run import GAP_MS, RunSpec, generate_run
from otel_titan.analysis.watch.replay import Replayer

#: The job's start (true time, µs): any fixed moment; the replay's clock is the records'.
START_US = 1_790_000_000_000_000


def rank_key(process) -> str:  # a read.records ProcessLog
    """The detector's key for a process across chunks: its file changes name with each chunk, its
    rank does not."""
    return f"{process.run_id}|{process.source}|{process.attempt}|{process.rank}"


def run(
    ranks: int,
    hours: float,
    step_ms: float,
    chunk_steps: int,
    interval: float,
    pause_every: int,
    budget_s: float,
    seed: int,
    work: str,
    progress: bool = True,
) -> dict:
    """Generate and replay the job chunk by chunk until `hours` are simulated or `budget_s` of wall
    time is spent."""
    total_steps = max(chunk_steps, int(hours * 3600 * 1000 / step_ms))
    replayer = Replayer(interval=interval, key=rank_key, frames=False)
    started, cpu = time.monotonic(), time.process_time()
    t, first, chunks, gen_cpu = float(START_US), 1, 0, 0.0
    while first <= total_steps:
        steps = min(chunk_steps, total_steps - first + 1)
        last = first + steps - 1 >= total_steps
        out = os.path.join(work, f"chunk-{chunks}")
        spec = RunSpec(
            ranks=ranks,
            steps=steps,
            seed=seed,
            noise_seed=seed * 100_003 + chunks,
            step_ms=step_ms,
            start_us=int(t),
            first_step=first,
            opened=first == 1,
            closed=last,
            host_drift_ms=3.0,
            drift_steps=total_steps,
            clock_origin_us=START_US - 2000.0,
            pp=4,
            stage_pct=15.0,
            variable=0.1,
            pause_every=pause_every,
            pause_ms=60_000.0,
            run_id="healthy-day",
        )
        g = time.process_time()
        truth = generate_run(out, spec, jobs=1)
        gen_cpu += time.process_time() - g
        replayer.feed(out)
        shutil.rmtree(out)
        t = truth["end_us"] + GAP_MS * 1000.0
        first += steps
        chunks += 1
        if progress:
            r = replayer.result
            print(
                f"  chunk {chunks}: to step {first - 1} of {total_steps}, "
                f"{r.simulated_s / 3600:.2f} simulated h, {len(r.alerts())} alerts, "
                f"{time.monotonic() - started:.0f} s",
                flush=True,
            )
        if time.monotonic() - started > budget_s:
            break
    result = replayer.finish(0.0)
    simulated_h = result.simulated_s / 3600
    steps_done = first - 1
    return {
        "ranks": ranks,
        "step_ms": step_ms,
        "interval_s": interval,
        "chunks": chunks,
        "steps": steps_done,
        "planned_steps": total_steps,
        "simulated_h": round(simulated_h, 3),
        "rank_hours": round(simulated_h * ranks, 1),
        "rank_steps": steps_done * ranks,
        "job_day_share": round(simulated_h / 24, 4),
        "refreshes": result.refreshes,
        "records": result.records,
        "alerts": len(result.alerts()),
        "alert_messages": [a["message"] for a in result.alerts()][:10],
        "replay_cpu_s": round(result.cpu_s, 1),
        "generate_cpu_s": round(gen_cpu, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "load_average": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ranks",
        type=int,
        default=1024,
        help="ranks of the job (default 1024; a multiple of 4 stages × 8 ranks a host)",
    )
    parser.add_argument(
        "--hours",
        type=float,
        default=24.0,
        help="simulated hours of the job (default 24: a job-day)",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=2000.0,
        help="median step time in ms (default 2000: a 1,024-GPU job's step is seconds)",
    )
    parser.add_argument(
        "--chunk-steps",
        type=int,
        default=100,
        help="steps generated (and on disk) at a time (default 100)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=4.0,
        help="simulated seconds between refreshes (default 4: about 2 steps a read, tens of MB at 1,024 ranks)",
    )
    parser.add_argument(
        "--pause-every",
        type=int,
        default=300,
        help="every N steps a 60 s checkpoint every rank shares (default 300)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=1800.0,
        help="stop after this many seconds of wall time, and say how far it got (default 1800)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args(argv)
    if args.ranks % 32:
        parser.error(
            f"--ranks: a multiple of 32 (4 pipeline stages of whole 8-rank hosts), got {args.ranks}"
        )
    if args.chunk_steps < 1 or args.hours <= 0 or args.step_ms <= 0 or args.interval <= 0:
        parser.error("--chunk-steps, --hours, --step-ms and --interval must be positive")
    work = tempfile.mkdtemp(prefix="otel-titan-false-alarms-")
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; a healthy "
        f"{args.ranks}-rank job, {args.step_ms:g} ms steps, "
        f"refresh every {args.interval:g} s, {args.hours:g} h planned, {args.budget_s:g} s budget",
        flush=True,
    )
    try:
        figures = run(
            args.ranks,
            args.hours,
            args.step_ms,
            args.chunk_steps,
            args.interval,
            args.pause_every,
            args.budget_s,
            args.seed,
            work,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per_day = figures["alerts"] / figures["job_day_share"] if figures["job_day_share"] else None
    print(
        f"\n{figures['alerts']} false alarms in {figures['simulated_h']:.2f} simulated h at "
        f"{figures['ranks']} ranks "
        f"({figures['rank_hours']:,.0f} rank-hours, {figures['rank_steps']:,} rank-steps, "
        f"{figures['refreshes']:,} refreshes; "
        f"{100 * figures['job_day_share']:.1f} % of a job-day)"
        + (f": {per_day:.1f} a job-day at this rate" if figures["alerts"] else "")
    )
    for message in figures["alert_messages"]:
        print(f"  {message}")
    print(
        f"CPU {figures['cpu_s']:.0f} s (replay {figures['replay_cpu_s']:.0f} s, generation "
        f"{figures['generate_cpu_s']:.0f} s) in {figures['wall_s']:.0f} s; "
        f"load average now {os.getloadavg()[0]:.1f}"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

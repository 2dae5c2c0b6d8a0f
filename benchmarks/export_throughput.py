"""Export throughput and peak memory: `otel-titan export` against a straightforward `json`-module
converter.

    .venv/bin/python benchmarks/export_throughput.py                 # 1 GB, 16 ranks (several
    minutes) .venv/bin/python benchmarks/export_throughput.py --size-gb 0.05  # a quick look

How the run is generated: generating 1 GB with the real library in 16
processes would take far longer than the conversion being measured, so a
real run is *captured* first (the library itself, in a subprocess: one
training rank doing the toy trainer's phases — ``data_fetch``,
``fwd_bwd`` > ``forward``/``backward``, ``optimizer``, three scalars, a
``gc`` tag every 10 steps, checkpoints with an instant), and one of its steps
is used as a template. Every generated record is a copy of a real record
with the fields that vary rewritten: times (µs/ms/s, with per-rank jitter and
a straggler rank), ``value`` (duration), ``delta_ms``, step, relative step,
step tags, ``seq_id``, span / parent / trace ids, rank, pid, tid and the
message. Files are rotated like the library rotates them (``--segment-mb``),
each starts with the ``structured_logger_opened`` record and ends with
``structured_logger_closed``.

How it is measured: the input is read once (warm page cache for both), a
small warm-up conversion runs for each, then each converter runs
``--repeat`` times in a fresh subprocess. Time is the child's own wall time
around the conversion (not the interpreter start); peak memory is the
child's maximum resident set size from ``os.wait4`` (the whole process,
interpreter and imports included). Throughput = input bytes / time.

The baseline is how torchtitan's generator works, written plainly: every
line through ``json.loads`` into a list per file, ``_start``/``_end`` paired
LIFO per (file, task_name), one event dict per span/instant/scalar with the
same args as ours, everything in one list, and ``json.dump`` at the end.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import defaultdict
from typing import Any

import orjson

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run as `python benchmarks/export_throughput.py`
    sys.path.insert(0, REPO)

from tests.helpers import processes  # noqa: E402 - kills a conversion's whole tree (its worker processes) on an interruption

# -- capture --------------------------------------------------------------------------------------
_CAPTURE = """
import gc, sys, time
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=16, run_id="bench-run")
sl.log_trace_instant("training_start")
for step in range(1, 6):
    sl.set_step(step, relative_step=step)
    if step == 2:
        sl.add_step_tag("gc")
        with sl.log_trace_span("gc_collect"):
            gc.collect()
    with sl.log_trace_span("data_fetch"):
        time.sleep(0.001)
    with sl.log_trace_span("fwd_bwd"):
        with sl.log_trace_span("forward"):
            time.sleep(0.001)
        with sl.log_trace_span("backward"):
            time.sleep(0.001)
    with sl.log_trace_span("optimizer"):
        time.sleep(0.001)
    sl.log_trace_scalar({"loss": 2.5 / step, "num_tokens": 2048, "lr": 1e-3})
    if step == 3:
        with sl.log_trace_span("checkpoint"):
            time.sleep(0.001)
        sl.log_trace_instant("checkpoint_saved")
sl.log_trace_instant("training_end")
sl.shutdown_structured_logger()
"""


def capture_templates(workdir: str) -> dict[str, Any]:
    """Run the real library once and return its records: opened, closed, and steps 2 and 3 as
    templates."""
    out = os.path.join(workdir, "capture")
    env = {**os.environ, "PYTHONPATH": REPO}
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CAPTURE), out], check=True, env=env, cwd=REPO
    )
    (path,) = glob.glob(os.path.join(out, "structured_logs", "*.jsonl"))
    with open(path, "rb") as handle:
        records = [orjson.loads(line) for line in handle]
    shutil.rmtree(out)
    return {
        "opened": records[0],
        "closed": records[-1],
        # data_fetch, fwd_bwd > forward, backward; optimizer; 3 scalars
        "plain_step": [r for r in records if r.get("step") == 4],
        "gc_step": [r for r in records if r.get("step") == 2],  # with the gc tag and span
        "checkpoint_step": [r for r in records if r.get("step") == 3],
    }


# -- generation -----------------------------------------------------------------------------------
def _hex(rng: random.Random, digits: int) -> str:
    return f"{rng.getrandbits(digits * 4):0{digits}x}"


def generate_run(
    workdir: str,
    templates: dict[str, Any],
    size_bytes: int,
    ranks: int,
    segment_bytes: int,
    seed: int = 0,
) -> str:
    """Write a `ranks`-rank run of about `size_bytes` under `workdir`/run; returns the run
    directory."""
    run_dir = os.path.join(workdir, "run")
    logs = os.path.join(run_dir, "structured_logs")
    shutil.rmtree(run_dir, ignore_errors=True)  # segments of an earlier run would be rotated along
    os.makedirs(logs, exist_ok=True)
    for rank in range(ranks):
        _generate_rank(
            logs,
            templates,
            rank,
            size_bytes // ranks,
            segment_bytes,
            random.Random(seed * 1000 + rank),
        )
    return run_dir


class _RankFile:
    """One generated rank: its identity, its sequence numbers, its (rotating) file."""

    def __init__(self, logs: str, rank: int, segment_bytes: int, rng: random.Random) -> None:
        self.rank, self.pid = rank, 40_000 + rank
        self.writer = _SegmentWriter(
            os.path.join(
                logs, f"training.global_rank_{rank}.20261130-000000-{_hex(rng, 6)[:6]}.jsonl"
            ),
            segment_bytes,
        )
        self.seq = 0

    def emit(self, record: dict[str, Any], time_us: int) -> None:
        self.seq += 1
        record["seq_id"] = self.seq
        record["time_us"], record["time_ms"], record["time"] = (
            time_us,
            time_us // 1000,
            time_us // 1_000_000,
        )
        record["rank"] = record["global_rank"] = record["local_rank"] = self.rank
        record["pid"] = self.pid
        if "tid" in record:
            record["tid"] = self.pid
        self.writer.write(orjson.dumps(record) + b"\n")


def _generate_rank(
    logs: str,
    templates: dict[str, Any],
    rank: int,
    size_bytes: int,
    segment_bytes: int,
    rng: random.Random,
) -> None:
    out = _RankFile(logs, rank, segment_bytes, rng)
    now = 1_796_000_000_000_000
    out.emit(dict(templates["opened"]), now)
    step = 0
    while out.writer.total < size_bytes:
        step += 1
        kind = (
            "checkpoint_step"
            if step % 500 == 0
            else ("gc_step" if step % 10 == 0 else "plain_step")
        )
        trace_id = hashlib.sha256(f"bench|{step}".encode()).hexdigest()[:32]
        ids: dict[str, str] = {}
        starts: dict[str, int] = {}
        last_us = now
        for template in templates[kind]:
            record = dict(template)
            name = record["log_type_name"]
            # Durations: ~0.2-5 ms per phase with jitter; rank 5 is a data_fetch straggler.
            now += rng.randint(200, 5000) + (
                20_000 if rank == 5 and name == "data_fetch_end" else 0
            )
            record["delta_ms"] = round((now - last_us) / 1000, 3)
            last_us = now
            record["step"] = record["relative_step"] = step
            if step % 10 == 0:
                record["step_tags"] = ["gc"]
            else:
                record.pop("step_tags", None)
            record["trace_id"] = trace_id
            old_id, old_parent = template.get("span_id"), template.get("parent_span_id")
            if old_id is not None:
                record["span_id"] = ids.setdefault(old_id, _hex(rng, 16))
            if old_parent is not None:
                record["parent_span_id"] = ids.setdefault(old_parent, _hex(rng, 16))
            if name.endswith("_start"):
                starts[record["span_id"]] = now
                record["message"] = f"[step {step}] {name[:-6]} {name}"
            elif name.endswith("_end"):
                value = (now - starts.pop(record["span_id"], now)) / 1000
                record["value"] = value
                record["message"] = f"[step {step}] {name[:-4]} {name} took {value:.3f} ms"
            elif name == "metric_value":
                if record["event_name"] == "loss":
                    record["value"] = round(5.0 / (1 + step) + rng.random() * 0.01, 6)
                record["message"] = f"[step {step}] {record['event_name']}={record['value']}"
            out.emit(record, now)
        now += rng.randint(100, 1000)
    out.emit(dict(templates["closed"], written_records=out.seq - 1), now)
    out.writer.close()


class _SegmentWriter:
    """Rotates like the library: `X.jsonl` active, `X.jsonl.1` newest older … (lines never
    split)."""

    def __init__(self, base: str, segment_bytes: int) -> None:
        self.base, self.segment_bytes = base, segment_bytes
        self.segments: list[str] = []
        self.total = 0
        self._open()

    def _open(self) -> None:
        self.handle = open(self.base, "wb", buffering=1 << 20)
        self.size = 0

    def write(self, line: bytes) -> None:
        if self.size + len(line) > self.segment_bytes and self.size:
            self.handle.close()
            existing = sorted(
                (p for p in glob.glob(self.base + ".*")), key=lambda p: -int(p.rsplit(".", 1)[1])
            )
            for path in existing:
                number = int(path.rsplit(".", 1)[1])
                os.replace(path, f"{self.base}.{number + 1}")
            os.replace(self.base, self.base + ".1")
            self._open()
        self.handle.write(line)
        self.size += len(line)
        self.total += len(line)

    def close(self) -> None:
        self.handle.close()


# -- the two converters ---------------------------------------------------------------------------
_ARGS = (
    "step",
    "relative_step",
    "step_tags",
    "caller",
    "task_name",
    "description",
    "span_id",
    "parent_span_id",
    "trace_id",
    "tid",
)


def baseline_convert(input_dir: str, output_path: str) -> int:
    """The straightforward converter (torchtitan's approach): json.loads everything, pair,
    json.dump. Returns the event count."""
    log_dir = os.path.join(input_dir, "structured_logs")
    files: dict[str, list[str]] = defaultdict(list)
    for path in glob.glob(os.path.join(log_dir, "*.jsonl*")):
        base = path[: path.index(".jsonl") + 6]
        files[base].append(path)
    events: list[dict[str, Any]] = []
    for pid, base in enumerate(sorted(files), start=1):
        segments = sorted(
            files[base], key=lambda p: -int(p.rsplit(".", 1)[1]) if not p.endswith(".jsonl") else 1
        )
        records = []
        for path in segments:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
        name = os.path.basename(base).split(".")
        events.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"{name[0]} {name[1]}"},
            }
        )
        stacks: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for record in records:
            event_name = record["log_type_name"]
            tid = record.get("tid", 0)
            if record["log_type"] == "instant":
                if event_name == "metric_value":
                    events.append(
                        {
                            "name": record["event_name"],
                            "ph": "C",
                            "ts": record["time_us"],
                            "pid": pid,
                            "tid": 0,
                            "args": {"value": record["value"]},
                        }
                    )
                else:
                    events.append(
                        {
                            "name": event_name,
                            "ph": "i",
                            "s": "t",
                            "ts": record["time_us"],
                            "pid": pid,
                            "tid": tid,
                            "args": {k: record[k] for k in _ARGS if k in record},
                        }
                    )
            elif event_name.endswith("_start"):
                stacks[record.get("task_name")].append(record)
            elif event_name.endswith("_end"):
                stack = stacks[record.get("task_name")]
                start = stack.pop() if stack else None
                begin = start["time_us"] if start else record["time_us"] - record["value"] * 1000
                source = start or record
                events.append(
                    {
                        "name": event_name[:-4],
                        "ph": "X",
                        "ts": begin,
                        "dur": record["value"] * 1000,
                        "pid": pid,
                        "tid": tid,
                        "args": {k: source[k] for k in _ARGS if k in source},
                    }
                )
            elif event_name.endswith("_error"):
                events.append(
                    {
                        "name": f"ERROR: {event_name[:-6]}",
                        "ph": "i",
                        "s": "t",
                        "ts": record["time_us"],
                        "pid": pid,
                        "tid": tid,
                        "args": {"message": record.get("message")},
                    }
                )
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    with open(output_path, "w", encoding="utf-8") as handle:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, handle)
    return len(events)


def ours_convert(input_dir: str, output_path: str, jobs: int | None = None) -> int:
    """`otel-titan export`, as the command runs it (`jobs`: its default unless given). Returns the
    event count."""
    from otel_titan.analysis import generate_gantt_trace

    return generate_gantt_trace(input_dir, output_path, jobs=jobs).events


# -- measuring ------------------------------------------------------------------------------------
def run_one(
    which: str, input_dir: str, output_path: str, jobs: int | None = None
) -> dict[str, Any]:
    """Measure one conversion in a fresh interpreter: wall time (child-side) and peak memory.

    Peak memory: ``os.wait4``'s ``ru_maxrss`` is exact but per process (for a
    tree it is the largest process, not the sum), so the process tree is also
    sampled every 50 ms from /proc: the reported figure is the sum over every
    process of its own peak (VmHWM, a high-water mark, so a late sample still
    sees the peak), an upper bound of the tree's peak. Sampling more often
    would steal CPU from a converter that uses both cores.
    """
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", which, input_dir, output_path],
        stdout=subprocess.PIPE,
        env={
            **os.environ,
            "PYTHONPATH": REPO,
            "BENCH_EXPORT_JOBS": "" if jobs is None else str(jobs),
        },
        cwd=REPO,
    )
    assert child.stdout is not None
    sampler = _TreeMemory(child.pid)
    sampler.start()
    try:
        output = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
    # Ctrl-C, or the sampler failing: leave no converter (nor its workers) running
    except BaseException:
        processes.kill_tree(child)
        raise
    finally:
        sampler.stop()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{which} conversion failed with exit status {child.returncode}")
    result = json.loads(output)
    largest = usage.ru_maxrss * 1024  # kilobytes on Linux: the largest process of the tree
    if len(sampler.peaks) <= 1:
        sampler.peaks = {child.pid: largest}  # a single process: wait4's figure is exact
    result["peak_rss_bytes"] = max(sum(sampler.peaks.values()), largest)
    result["processes"] = len(sampler.peaks)
    result["sampled_peak_sum_bytes"] = sampler.peak_sum
    result["output_bytes"] = os.path.getsize(output_path)
    return result


class _TreeMemory(threading.Thread):
    """Samples the RSS of a process and its descendants from /proc."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peaks: dict[int, int] = {}
        self.peak_sum = 0
        self._done = threading.Event()

    def _tree(self) -> list[int]:
        pids, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            try:
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children") as handle:
                        todo.extend(int(c) for c in handle.read().split())
            except OSError:
                continue
        return pids

    def run(self) -> None:
        while not self._done.is_set():
            total = 0
            for pid in self._tree():
                try:
                    with open(f"/proc/{pid}/status") as handle:
                        fields = dict(
                            line.split(":", 1)
                            for line in handle
                            if line.startswith(("VmRSS", "VmHWM"))
                        )
                except (OSError, ValueError):
                    continue
                if "VmHWM" in fields:
                    self.peaks[pid] = max(
                        self.peaks.get(pid, 0), int(fields["VmHWM"].split()[0]) * 1024
                    )
                if "VmRSS" in fields:
                    total += int(fields["VmRSS"].split()[0]) * 1024
            self.peak_sum = max(self.peak_sum, total)
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()


def _child(which: str, input_dir: str, output_path: str) -> None:
    jobs = os.environ.get("BENCH_EXPORT_JOBS")
    started, cpu_started = time.perf_counter(), time.process_time()
    events = (
        ours_convert(input_dir, output_path, int(jobs) if jobs else None)
        if which == "ours"
        else baseline_convert(input_dir, output_path)
    )
    # CPU time of this process (its workers not included): on a shared machine, steadier than the
    # wall clock.
    print(
        json.dumps(
            {
                "seconds": time.perf_counter() - started,
                "cpu_seconds": time.process_time() - cpu_started,
                "events": events,
            }
        )
    )


def _input_bytes(run_dir: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(run_dir, "structured_logs", "*")))


def _machine() -> dict[str, Any]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": sys.version.split()[0],
        "orjson": orjson.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size-gb", type=float, default=1.0, help="size of the generated run in GB (default 1.0)"
    )
    parser.add_argument(
        "--ranks", type=int, default=16, help="ranks (files) in the generated run (default 16)"
    )
    parser.add_argument(
        "--segment-mb",
        type=float,
        default=32.0,
        help="rotate each rank's file at this size (default 32)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measured runs per converter; the median is reported (default 1)",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        help="where to generate (default: a new folder under /tmp); deleted afterwards unless --keep",
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated run and outputs")
    parser.add_argument(
        "--skip-baseline", action="store_true", help="measure only otel-titan export"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="worker processes for otel-titan export (default: its own default, one per CPU)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--child", nargs=3, metavar=("WHICH", "INPUT", "OUTPUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0

    workdir = args.workdir or tempfile.mkdtemp(prefix="otel-titan-bench-", dir="/tmp")
    os.makedirs(workdir, exist_ok=True)
    try:
        started = time.perf_counter()
        templates = capture_templates(workdir)
        run_dir = generate_run(
            workdir, templates, int(args.size_gb * 1e9), args.ranks, int(args.segment_mb * 1e6)
        )
        size = _input_bytes(run_dir)
        files = len(glob.glob(os.path.join(run_dir, "structured_logs", "*")))
        print(
            f"generated {size / 1e6:,.0f} MB, {args.ranks} ranks, {files} files in "
            f"{time.perf_counter() - started:.0f} s under {workdir}",
            flush=True,
        )
        small = generate_run(
            os.path.join(workdir, "warmup"), templates, 2_000_000, 2, int(args.segment_mb * 1e6)
        )
        os.sync()
        for path in glob.glob(os.path.join(run_dir, "structured_logs", "*")):
            # warm the page cache: both converters read from memory
            with open(path, "rb") as handle:
                while handle.read(1 << 24):
                    pass
        which_list = ["ours"] if args.skip_baseline else ["ours", "baseline"]
        for which in which_list:
            run_one(which, small, os.path.join(workdir, f"warmup-{which}.json"), args.jobs)
        results: dict[str, list[dict[str, Any]]] = {}
        for attempt in range(args.repeat):
            # Interleaved, so that slow phases of a shared machine hit both alike.
            for which in which_list if attempt % 2 == 0 else which_list[::-1]:
                output = os.path.join(workdir, f"trace-{which}.json")
                if os.path.exists(output):
                    os.unlink(output)
                os.sync()  # no write-back of earlier files competing with the measured run
                result = run_one(which, run_dir, output, args.jobs)
                results.setdefault(which, []).append(result)
                print(
                    f"  {which} run {attempt + 1}: {result['seconds']:.1f} s, peak RSS "
                    f"{result['peak_rss_bytes'] / 1e6:,.0f} MB over {result['processes']} "
                    f"processes, {result['events']:,} events",
                    flush=True,
                )
        report = _report(size, args, results)
        print(report["table"])
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({k: v for k, v in report.items() if k != "table"}, handle, indent=2)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _report(
    size: int, args: argparse.Namespace, results: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    rows = {}
    for which, runs in results.items():
        seconds = sorted(r["seconds"] for r in runs)[len(runs) // 2]
        rss = max(r["peak_rss_bytes"] for r in runs)
        rows[which] = {
            "seconds": seconds,
            "all_seconds": [r["seconds"] for r in runs],
            "mb_per_s": size / 1e6 / seconds,
            "peak_rss_mb": rss / 1e6,
            "rss_over_input": rss / size,
            "processes": max(r["processes"] for r in runs),
            "sampled_peak_sum_mb": max(r["sampled_peak_sum_bytes"] for r in runs) / 1e6,
            "events": runs[0]["events"],
            "output_mb": runs[0]["output_bytes"] / 1e6,
            "runs": len(runs),
        }
    lines = [f"input: {size / 1e6:,.0f} MB of JSONL, {args.ranks} ranks; machine: {_machine()}", ""]
    lines.append(
        f"{'converter':<22}{'time s':>9}{'MB/s':>9}{'peak RSS MB':>13}{'RSS/input':>11}{'procs':>7}{'events':>12}{'output MB':>11}"
    )
    names = {"ours": "otel-titan export", "baseline": "json + json.dump"}
    for which, row in rows.items():
        lines.append(
            f"{names[which]:<22}{row['seconds']:>9.1f}{row['mb_per_s']:>9.1f}{row['peak_rss_mb']:>13,.0f}{row['rss_over_input']:>11.3f}{row['processes']:>7}{row['events']:>12,}{row['output_mb']:>11,.0f}"
        )
    ratios = {}
    if "ours" in rows and "baseline" in rows:
        ratios = {
            "throughput_ratio": rows["ours"]["mb_per_s"] / rows["baseline"]["mb_per_s"],
            "memory_ratio": rows["baseline"]["peak_rss_mb"] / rows["ours"]["peak_rss_mb"],
        }
        lines.append("")
        lines.append(
            f"throughput: {ratios['throughput_ratio']:.1f}× the baseline (target ≥ 5×); peak "
            f"memory: {rows['ours']['rss_over_input']:.3f} of the input (target < 0.25), baseline "
            f"{rows['baseline']['rss_over_input']:.2f}"
        )
    return {
        "input_bytes": size,
        "ranks": args.ranks,
        "machine": _machine(),
        "results": rows,
        **ratios,
        "table": "\n".join(lines),
    }


if __name__ == "__main__":
    sys.exit(main())

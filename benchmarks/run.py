"""otel-titan against the alternatives, in one run on one machine: `make bench`.

    python -m benchmarks.run [--rounds 5] [--spans 20000] [--quick] [--json OUT]

1. Span cost, for each implementation of `benchmarks/cases.py`: the calling
   thread's time per span (enter + exit) and the whole process's CPU time per
   span, background threads included, measured after a flush. Every case runs
   in a fresh process; the cases are interleaved round by round (so a noisy
   moment hits all of them), each round a warm-up then 3 timed repetitions;
   the figure is the median over all timed repetitions.
2. Training-step overhead: a small torch model, 20 spans and a scalar dict per
   ~10 ms step, without instrumentation, with no-op calls, and with JSONL.
3. Throughput: 8 threads emitting as fast as they can for 10 s at the default
   queue size: spans/s written and records dropped.
4. `_start` latency (`benchmarks/start_latency.py`): how long a span's
   `_start` record takes to reach the file, read by another process, in an
   idle interpreter and with 4 threads spinning for the interpreter lock;
   fresh processes, median, p95 and max.
5. The write path side by side with a previous revision (``--baseline-ref``,
   default 93dec39; ``make bench BENCH_BASELINE_REF=<ref>``): that revision's
   tree, extracted with ``git archive`` into a temporary folder, runs its own
   ``benchmarks.span_cost otel_titan`` in the same interpreter and packages
   (only otel-titan's own code differs), as one more case of the interleaved
   rounds of 1., so that a regression shows as a row of the table and a ratio
   among the targets. Skipped, and said so, where git cannot find the ref.

Then a table with ratios to each peer and the targets of the performance
issue, each marked met or not with the measured figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python benchmarks/run.py` as well as `python -m benchmarks.run`
    sys.path.insert(0, str(REPO))

from tests.helpers import processes  # noqa: E402 - kills whole process trees on a timeout or an interruption

CASE_ORDER = [
    "floor",
    "logging_queue",
    "logging_sync",
    "otel_sdk",
    "otel_sdk_jsonl",
    "otel_titan",
    "otel_titan_otlp",
    "otel_titan_otlp_sdk",
]
LABELS = {
    "floor": "(1) floor: 2 timestamps + 2 deque appends",
    "logging_queue": "(2) logging QueueHandler, JSON on caller",
    "logging_sync": "(3) logging FileHandler, sync flush",
    "otel_sdk": "(4) OTel SDK span, BatchSpanProcessor no-op",
    "otel_sdk_jsonl": "(5) OTel SDK span → to_json JSONL",
    "otel_titan": "(6) otel-titan, JSONL",
    "otel_titan_otlp": "(6) otel-titan, JSONL + OTLP",
    "otel_titan_otlp_sdk": "(6) otel-titan, JSONL + OTLP, SDK's encoder (before)",
}


#: The revision whose write path every run is compared with (the main of two landings before issue
#: 30's).
DEFAULT_BASELINE_REF = os.environ.get("BENCH_BASELINE_REF") or "93dec39"
BASELINE_CASE = "otel_titan@baseline"


def _python(
    module: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 900,
    tree: Path | None = None,
) -> dict:
    """Run ``python -m module`` from `tree` (default this checkout), its own code first on the path;
    its last JSON line."""
    tree = tree or REPO
    result = processes.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        cwd=tree,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(tree)},
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for package in (
        "otel-titan",
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp",
        "orjson",
        "torch",
        "grpcio",
    ):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "python": platform.python_version(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "versions": versions,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def start_sink() -> tuple[subprocess.Popen, str]:
    with tempfile.TemporaryDirectory(prefix="otlp-sink-") as directory:
        port_file = os.path.join(directory, "port")
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.otlp_sink", port_file],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.monotonic() > deadline or process.poll() is not None:
                processes.kill_tree(process)
                raise RuntimeError("the OTLP sink did not start")
            time.sleep(0.05)
        return process, f"http://127.0.0.1:{open(port_file).read().strip()}"


def extract_ref(ref: str, into: str) -> Path | None:
    """`ref`'s tree of this repository written into the folder `into` (``git archive``); None when
    git cannot (no git, no such ref, no history)."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", ref],
            capture_output=True,
            timeout=120,
        )
        if archive.returncode != 0:
            return None
        unpacked = subprocess.run(
            ["tar", "-x", "-C", into], input=archive.stdout, capture_output=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    tree = Path(into)
    return (
        tree
        if unpacked.returncode == 0
        and (tree / "benchmarks" / "span_cost.py").is_file()
        and (tree / "otel_titan").is_dir()
        else None
    )


def span_costs(rounds: int, spans: int, sink: str, baseline: Path | None = None) -> dict:
    """Every case of `CASE_ORDER`, and with `baseline` (another revision's tree) its ``otel_titan``
    case as `BASELINE_CASE`: interleaved, medians."""
    otlp_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    metrics = ("caller_us", "caller_cpu_us", "cpu_us", "otlp_thread_cpu_us")
    order = CASE_ORDER + ([BASELINE_CASE] if baseline is not None else [])
    results: dict[str, dict[str, list[float]]] = {case: {m: [] for m in metrics} for case in order}
    for round_index in range(rounds):
        for case in order:
            _progress(f"span cost: round {round_index + 1}/{rounds}, {case}")
            if case == BASELINE_CASE:
                measured = _python(
                    "benchmarks.span_cost",
                    "otel_titan",
                    "--spans",
                    str(spans),
                    "--reps",
                    "3",
                    tree=baseline,
                )
            else:
                measured = _python(
                    "benchmarks.span_cost",
                    case,
                    "--spans",
                    str(spans),
                    "--reps",
                    "3",
                    env=otlp_env if "otlp" in case else None,
                )
            for metric in metrics:
                results[case][metric].extend(
                    measured.get(metric) or [0.0] * len(measured["caller_us"])
                )
    return {
        case: {**{m: statistics.median(v[m]) for m in metrics}, "samples": len(v["caller_us"])}
        for case, v in results.items()
    }


def training_steps(rounds: int, steps: int, sink: str) -> dict:
    """Median step time per mode, and the overhead of each mode as the median of per-round ratios.

    Step times drift by several percent between runs on a shared machine, more
    than the effect measured; comparing each mode with the bare run of the same
    round (run right before it) cancels most of the drift.
    """
    modes = ("bare", "disabled", "jsonl", "jsonl_otlp")
    otlp_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    ratios: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_index in range(rounds):
        this_round = {}
        for mode in modes:
            _progress(f"training step: round {round_index + 1}/{rounds}, {mode}")
            measured = _python(
                "benchmarks.training_step", mode, "--steps", str(steps), "--reps", "3", env=otlp_env
            )["step_ms"]
            samples[mode].extend(measured)
            this_round[mode] = statistics.median(measured)
        for mode in modes:
            ratios[mode].append(this_round[mode] / this_round["bare"])
    result: dict = {mode: statistics.median(values) for mode, values in samples.items()}
    result["overhead_pct"] = {mode: (statistics.median(r) - 1) * 100 for mode, r in ratios.items()}
    result["overhead_range_pct"] = {
        mode: [(min(r) - 1) * 100, (max(r) - 1) * 100] for mode, r in ratios.items()
    }
    return result


def table(
    costs: dict, steps: dict, throughput: dict, latency: dict, baseline_ref: str | None = None
) -> tuple[str, list[tuple[str, bool | None, str]]]:
    floor, queue, sdk = costs["floor"], costs["logging_queue"], costs["otel_sdk"]
    lines = [
        "| implementation | caller µs/span (wall) | × floor | × (2) logging queue | × (4) OTel "
        "SDK | caller CPU µs/span | total CPU µs/span | CPU × (2) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for case in CASE_ORDER:
        c = costs[case]
        lines.append(
            f"| {LABELS[case]} | {c['caller_us']:.2f} | {c['caller_us'] / floor['caller_us']:.2f} "
            f"| {c['caller_us'] / queue['caller_us']:.3f} | "
            f"{c['caller_us'] / sdk['caller_us']:.3f} | {c['caller_cpu_us']:.2f} | "
            f"{c['cpu_us']:.2f} | {c['cpu_us'] / queue['cpu_us']:.3f} |"
        )
    ours, ours_otlp = costs["otel_titan"], costs["otel_titan_otlp"]
    before = costs.get(BASELINE_CASE)
    if before is not None:
        lines.append(
            f"| (6) otel-titan, JSONL, at {baseline_ref} (before) | {before['caller_us']:.2f} | "
            f"{before['caller_us'] / floor['caller_us']:.2f} | "
            f"{before['caller_us'] / queue['caller_us']:.3f} | "
            f"{before['caller_us'] / sdk['caller_us']:.3f} | {before['caller_cpu_us']:.2f} | "
            f"{before['cpu_us']:.2f} | "
            f"{before['cpu_us'] / queue['cpu_us']:.3f} |"
        )
    else:
        lines.append(
            f"| (6) otel-titan, JSONL, at {baseline_ref or 'a previous revision'} (before) | not "
            "measured: git could not extract it | | | | | | |"
        )
    overhead = steps["overhead_pct"]["jsonl"]
    spread = steps["overhead_range_pct"]
    lines += [
        "",
        "| training step (20 spans + 4 scalars per step) | median step ms | overhead: median of "
        "per-round ratios (range) |",
        "| --- | ---: | ---: |",
        f"| no instrumentation | {steps['bare']:.3f} | |",
    ]
    for mode, label in (
        ("disabled", "sl.* calls, logger not initialised (no-ops)"),
        ("jsonl", "sl.* calls, JSONL"),
        ("jsonl_otlp", "sl.* calls, JSONL + OTLP"),
    ):
        lines.append(
            f"| {label} | {steps[mode]:.3f} | {steps['overhead_pct'][mode]:+.2f} % "
            f"({spread[mode][0]:+.1f} … {spread[mode][1]:+.1f} %) |"
        )
    lines += [
        "",
        f"Throughput, {throughput['threads']} threads for {throughput['seconds']:.1f} s, default "
        "queue: "
        f"{throughput['spans_written_per_s']:,.0f} spans/s written, "
        f"{throughput['records_dropped']:,} records dropped "
        f"({throughput['spans_emitted']:,} spans emitted, {throughput['drain_s']:.2f} s final "
        "drain).",
        "",
        f"`_start` record in the file after the span starts ({latency['rounds']} fresh processes "
        f"× {latency['probes_per_process']} spans per case):",
        "",
        "| interpreter | median ms | p95 ms | max ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for case in latency["cases"].values():
        label = (
            "idle"
            if case["spinning_threads"] == 0
            else f"{case['spinning_threads']} threads spinning for the interpreter lock"
        )
        lines.append(
            f"| {label} | {case['median_ms']:.1f} | {case['p95_ms']:.1f} | {case['max_ms']:.1f} |"
        )
    targets = [
        (
            "caller time ≤ 0.15 × (2) logging queue",
            ours["caller_us"] / queue["caller_us"] <= 0.15,
            f"{ours['caller_us'] / queue['caller_us']:.3f}×",
        ),
        (
            "caller time ≤ 0.15 × (4) OTel SDK span",
            ours["caller_us"] / sdk["caller_us"] <= 0.15,
            f"{ours['caller_us'] / sdk['caller_us']:.3f}×",
        ),
        (
            "caller time ≤ 5 × floor",
            ours["caller_us"] / floor["caller_us"] <= 5,
            f"{ours['caller_us'] / floor['caller_us']:.2f}×",
        ),
        (
            "total CPU (JSONL) ≤ 0.35 × (2)",
            ours["cpu_us"] / queue["cpu_us"] <= 0.35,
            f"{ours['cpu_us'] / queue['cpu_us']:.3f}×",
        ),
        (
            "OTLP's own CPU ≤ 5 µs per span",
            ours_otlp["otlp_thread_cpu_us"] <= 5.0,
            f"{ours_otlp['otlp_thread_cpu_us']:.2f} µs on the OTLP exporter's thread (the SDK's "
            f"encoder: {costs['otel_titan_otlp_sdk']['otlp_thread_cpu_us']:.2f} µs);"
            f" total CPU with OTLP − JSONL alone: {ours_otlp['cpu_us'] - ours['cpu_us']:+.2f} µs "
            f"(SDK's encoder: {costs['otel_titan_otlp_sdk']['cpu_us'] - ours['cpu_us']:+.2f} µs)",
        ),
        (
            "adding OTLP raises caller time ≤ 10 %",
            ours_otlp["caller_us"] <= ours["caller_us"] * 1.10,
            f"{(ours_otlp['caller_us'] / ours['caller_us'] - 1) * 100:+.1f} % wall "
            f"({(ours_otlp['caller_cpu_us'] / ours['caller_cpu_us'] - 1) * 100:+.1f} % of the "
            "caller's own CPU;"
            " SDK's encoder: "
            f"{(costs['otel_titan_otlp_sdk']['caller_us'] / ours['caller_us'] - 1) * 100:+.1f} % "
            "wall)",
        ),
        (
            "total CPU with OTLP ≤ 2 × JSONL alone",
            ours_otlp["cpu_us"] <= 2 * ours["cpu_us"],
            f"{ours_otlp['cpu_us'] / ours['cpu_us']:.2f}× (SDK's encoder: "
            f"{costs['otel_titan_otlp_sdk']['cpu_us'] / ours['cpu_us']:.2f}×)",
        ),
        (
            "≥ 50,000 spans/s from 8 threads, zero drops",
            throughput["spans_written_per_s"] >= 50_000 and throughput["records_dropped"] == 0,
            f"{throughput['spans_written_per_s']:,.0f} spans/s, {throughput['records_dropped']} "
            "dropped",
        ),
        _training_target(overhead, spread["jsonl"], spread["disabled"]),
        *_baseline_targets(ours, before, baseline_ref),
    ]
    lines += ["", "| target | met | measured |", "| --- | --- | --- |"] + [
        f"| {name} | {'?' if ok is None else 'yes' if ok else 'NO'} | {figure} |"
        for name, ok, figure in targets
    ]
    return "\n".join(lines), targets


def _baseline_targets(
    ours: dict, before: dict | None, ref: str | None
) -> list[tuple[str, bool | None, str]]:
    """Issue 30's target 1: this revision's caller time ≤ 0.8 × the baseline's and process CPU ≤ 0.9
    ×, measured side by side ("?" when not)."""
    if before is None:
        return [
            (f"caller time ≤ 0.8 × {ref}'s", None, "not measured"),
            (f"total CPU ≤ 0.9 × {ref}'s", None, "not measured"),
        ]
    caller, cpu = ours["caller_us"] / before["caller_us"], ours["cpu_us"] / before["cpu_us"]
    return [
        (
            f"caller time ≤ 0.8 × {ref}'s",
            caller <= 0.8,
            f"{caller:.3f}× ({ours['caller_us']:.2f} against {before['caller_us']:.2f} µs)",
        ),
        (
            f"total CPU ≤ 0.9 × {ref}'s",
            cpu <= 0.9,
            f"{cpu:.3f}× ({ours['cpu_us']:.2f} against {before['cpu_us']:.2f} µs)",
        ),
    ]


def _training_target(
    overhead: float, spread: list[float], noop_spread: list[float]
) -> tuple[str, bool | None, str]:
    """The training-step target, or "inconclusive" when the rounds disagree by more than the target.

    The no-op mode (which costs a few hundred nanoseconds a step) shows the
    noise floor: when it moves by percents, so can everything else.
    """
    noise = max(spread[1] - spread[0], noop_spread[1] - noop_spread[0])
    figure = f"{overhead:+.2f} % (rounds from {spread[0]:+.1f} to {spread[1]:+.1f} %; no-op calls {noop_spread[0]:+.1f} to {noop_spread[1]:+.1f} %)"
    if noise > 4.0:
        return ("training-step overhead < 1 %", None, "inconclusive on this machine: " + figure)
    return ("training-step overhead < 1 %", overhead < 1.0, figure)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds of every case (default 5)"
    )
    parser.add_argument(
        "--spans", type=int, default=20000, help="spans per timed repetition (default 20000)"
    )
    parser.add_argument(
        "--steps", type=int, default=200, help="training steps per timed repetition (default 200)"
    )
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="throughput test duration (default 10)"
    )
    parser.add_argument(
        "--latency-rounds",
        type=int,
        default=10,
        help="fresh processes per case of the _start latency test, 5 spans each (default 10)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short smoke run (1 round, small sizes): figures are not meaningful",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="also write the results to this JSON file"
    )
    parser.add_argument(
        "--baseline-ref",
        default=DEFAULT_BASELINE_REF,
        help=f"the git revision whose write path is measured side by side (default {DEFAULT_BASELINE_REF}, or $BENCH_BASELINE_REF); '' for none",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.spans, args.steps, args.seconds = 1, 2000, 20, 1.0

    info = machine()
    with tempfile.TemporaryDirectory(prefix="otel-titan-bench-baseline-") as folder:
        baseline = extract_ref(args.baseline_ref, folder) if args.baseline_ref else None
        if args.baseline_ref and baseline is None:
            _progress(
                f"baseline {args.baseline_ref}: git could not extract it; its row is not measured"
            )
        sink, endpoint = start_sink()
        try:
            costs = span_costs(args.rounds, args.spans, endpoint, baseline)
            steps = training_steps(args.rounds, args.steps, endpoint)
        finally:
            sink.terminate()
            try:
                sink.wait(10)
            except subprocess.TimeoutExpired:
                processes.kill_tree(sink)
    _progress(f"throughput: 8 threads for {args.seconds} s")
    throughput = _python("benchmarks.throughput", "--threads", "8", "--seconds", str(args.seconds))
    _progress("start latency: idle and with 4 spinning threads, fresh processes")
    latency = _python(
        "benchmarks.start_latency",
        *(["--quick"] if args.quick else ["--rounds", str(args.latency_rounds)]),
        "--spinners",
        "0,4",
    )
    report, targets = table(costs, steps, throughput, latency, args.baseline_ref or None)
    header = (
        f"otel-titan benchmark, {info['date']}: Python {info['python']}, {info['cores']} cores "
        f"({info['cpu']}), "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items())
        + f". {args.rounds} interleaved rounds, {args.spans} spans × 3 repetitions per round and case, medians."
    )
    print(header)
    print()
    print(report)
    results = {
        "machine": info,
        "settings": vars(args) | {"json": str(args.json) if args.json else None},
        "span_cost": {k: v for k, v in costs.items() if k != BASELINE_CASE},
        "span_cost_baseline": {
            "ref": args.baseline_ref or None,
            "otel_titan": costs.get(BASELINE_CASE),
        },
        "training_step_ms": steps,
        "throughput": throughput,
        "start_latency": latency,
        "targets": [{"target": n, "met": ok, "measured": f} for n, ok, f in targets],
    }
    out = (
        args.json
        or REPO / "benchmarks" / "results" / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nresults: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

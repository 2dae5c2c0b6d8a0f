"""Helpers for the analysis tests: real runs (made once per session), hand-written lines, trace
checks."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.helpers import processes

# -- runs made by the real toy trainer under torchrun (shared by several test modules) -------------
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="otel-titan-analysis-tests-"))
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)

#: The toy runs' straggler: rank 1's data_fetch sleeps this long on every step.
SLOW_MS = 40
TOY_STEPS = 8
HANG_STEP = 5


def _torchrun_command(output: Path, *args: str, ranks: int = 2) -> tuple[list[str], dict[str, str]]:
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return [
        launcher,
        f"--nproc_per_node={ranks}",
        "examples/train_toy.py",
        "--output-dir",
        str(output),
        *args,
    ], env


@functools.cache
def toy_run() -> Path:
    """A finished 2-rank torchrun toy run, 8 steps, rank 1 a data_fetch straggler (+40 ms), gc and
    checkpoints every 4 steps."""
    output = _SESSION_DIR / "toy"
    command, env = _torchrun_command(
        output,
        "--steps",
        str(TOY_STEPS),
        "--slow-rank",
        "1",
        "--slow-ms",
        str(SLOW_MS),
        "--gc-every",
        "4",
        "--checkpoint-every",
        "4",
    )
    result = processes.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return output


@functools.cache
def healthy_toy_run() -> Path:
    """What `make train` runs (scripts/train.sh): 2 ranks, no fault, 50 steps."""
    output = _SESSION_DIR / "healthy"
    command, env = _torchrun_command(output, "--steps", "50")
    result = processes.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return output


@functools.cache
def three_rank_toy_run() -> Path:
    """A finished 3-rank torchrun toy run, 12 steps, rank 1 a data_fetch straggler (+40 ms)."""
    output = _SESSION_DIR / "three"
    command, env = _torchrun_command(
        output, "--steps", "12", "--slow-rank", "1", "--slow-ms", str(SLOW_MS), ranks=3
    )
    result = processes.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return output


@functools.cache
def hung_toy_run() -> Path:
    """A 2-rank torchrun toy run where rank 1 hangs in data_fetch at step 5, then everything gets
    SIGKILL.

    Rank 0 is then blocked in backward's all-reduce, waiting for rank 1. The
    run is killed as soon as both records are on disk, as an operator or a
    scheduler would: the whole process tree, since torchrun starts each worker
    in its own session (killing the launcher's process group left both workers
    hanging forever).
    """
    output = _SESSION_DIR / "hung"
    command, env = _torchrun_command(
        output, "--steps", str(TOY_STEPS), "--hang-rank", "1", "--hang-step", str(HANG_STEP)
    )
    # a file, not a pipe: nobody reads while it runs, and a full pipe would stall the ranks
    log = _SESSION_DIR / "hung.log"
    with open(log, "wb") as stderr:
        launcher = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=REPO
        )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if _has_record(output, 1, "data_fetch_start", HANG_STEP) and _has_record(
                output, 0, "backward_start", HANG_STEP
            ):
                break
            if launcher.poll() is not None:
                raise AssertionError(
                    f"the hung run exited by itself ({launcher.returncode}): "
                    f"{log.read_text()[-3000:]}"
                )
            time.sleep(0.1)
        else:
            raise AssertionError(
                "rank 1 never reached data_fetch at the hang step, or rank 0 never blocked in "
                f"backward: {log.read_text()[-3000:]}"
            )
    finally:
        processes.kill_tree(launcher, timeout=60)
    return output


def _has_record(output: Path, rank: int, name: str, step: int) -> bool:
    for path in (output / "structured_logs").glob(f"training.global_rank_{rank}.*.jsonl"):
        needle = f'"log_type_name":"{name}"'.encode()
        for line in path.read_bytes().splitlines():
            if needle in line and json.loads(line).get("step") == step:
                return True
    return False


# -- hand-written lines ----------------------------------------------------------------------------
T0 = 1_796_015_820_000_000  # µs, a fixed wall-clock origin for hand-written records


def titan_record(
    name: str,
    t_ms: float,
    *,
    log_type: str = "event",
    rank: int = 0,
    source: str = "training",
    **fields: Any,
) -> dict[str, Any]:
    """A record exactly as torchtitan writes it (no span ids), at `t_ms` after `T0`."""
    time_us = T0 + int(round(t_ms * 1000))
    record: dict[str, Any] = {
        "delta_ms": 0.0,
        "tid": 6161,
        "rank": rank,
        "global_rank": rank,
        "local_rank": rank,
        "source": source,
        "host_name": "vm",
        "pid": 6161,
        "time": time_us // 1_000_000,
        "time_ms": time_us // 1000,
        "time_us": time_us,
        "log_type": log_type,
        "log_type_name": name,
        "event_name": None,
        "caller": "train.py:8:main",
        "log_file": "train.py",
        "log_function": "main",
        "log_level": "INFO",
        "logger_name": "torchtitan.structured_logger",
        "message": name,
    }
    record.update(fields)
    return record


def titan_span(name: str, start_ms: float, end_ms: float, **fields: Any) -> list[dict[str, Any]]:
    """The `_start` and `_end` records of one span."""
    return [
        titan_record(f"{name}_start", start_ms, **fields),
        titan_record(f"{name}_end", end_ms, value=end_ms - start_ms, **fields),
    ]


def write_jsonl(path: Path, records: Iterable[dict[str, Any] | str | bytes]) -> Path:
    """Write records (dicts as JSON lines; str/bytes as given, newline added)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        for record in records:
            if isinstance(record, dict):
                handle.write(json.dumps(record).encode() + b"\n")
            else:
                handle.write((record.encode() if isinstance(record, str) else record) + b"\n")
    return path


def titan_file(
    run_dir: Path, rank: int = 0, source: str = "training", suffix: str = "abc123"
) -> Path:
    """Path of a torchtitan-named file in `run_dir`/structured_logs."""
    return (
        run_dir / "structured_logs" / f"{source}.global_rank_{rank}.20260101-000000-{suffix}.jsonl"
    )


# -- reading traces back ---------------------------------------------------------------------------
def validate_event(event: dict[str, Any]) -> None:
    """Fail unless `event` has what the Chrome Trace Event format requires for its phase."""
    assert isinstance(event, dict), event
    phase = event.get("ph")
    assert isinstance(event.get("name"), str) and event["name"], event
    assert type(event.get("pid")) is int, event
    if phase == "M":
        assert event["name"] in (
            "process_name",
            "process_sort_index",
            "thread_name",
            "thread_sort_index",
        ), event
        assert isinstance(event.get("args"), dict), event
        if event["name"].endswith("_name"):
            assert isinstance(event["args"].get("name"), str) and event["args"]["name"], event
        else:
            assert type(event["args"].get("sort_index")) is int, event
        if event["name"].startswith("thread_"):
            assert type(event.get("tid")) is int, event
        return
    assert type(event.get("ts")) in (int, float) and event["ts"] >= 0, event
    if phase == "X":
        assert type(event.get("tid")) is int, event
        assert type(event.get("dur")) in (int, float) and event["dur"] >= 0, event
    elif phase == "i":
        assert type(event.get("tid")) is int, event
        assert event.get("s") in ("t", "p", "g"), event
    elif phase == "C":
        args = event.get("args")
        assert isinstance(args, dict) and args, event
        assert all(
            type(v) in (int, float) and v == v and abs(v) != float("inf") for v in args.values()
        ), event
    else:
        raise AssertionError(f"unexpected phase {phase!r}: {event}")
    if "args" in event:
        assert isinstance(event["args"], dict), event


def _reject_constant(token: str) -> None:
    raise AssertionError(f"non-standard JSON constant {token} in the trace")


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a trace file strictly (standard JSON: no NaN) and validate every event."""
    with open(path, "rb") as handle:
        data = handle.read()
    trace = json.loads(data, parse_constant=_reject_constant)
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}, set(trace)
    assert trace["displayTimeUnit"] == "ms"
    for event in trace["traceEvents"]:
        validate_event(event)
    return trace


def process_pids(trace: dict[str, Any]) -> dict[str, int]:
    """Process name as Perfetto shows it (its name, then its pid, unless the name ends in ``#``) →
    trace pid."""
    names = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            name = e["args"]["name"]
            names[name[:-2] if name.endswith(" #") else f"{name} {e['pid']}"] = e["pid"]
    return names


def thread_names(trace: dict[str, Any], pid: int) -> dict[int, str]:
    """Track id → track name within one trace process."""
    return {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid
    }


def bars(
    trace: dict[str, Any], pid: int | None = None, name: str | None = None
) -> list[dict[str, Any]]:
    """Span bars (X events that are not step bars), in start order."""
    found = [
        e
        for e in trace["traceEvents"]
        if e["ph"] == "X"
        and e.get("cat") == "span"
        and (pid is None or e["pid"] == pid)
        and (name is None or e["name"] == name)
    ]
    return sorted(found, key=lambda e: (e["pid"], e["ts"], -e["dur"]))


def assert_properly_nested(events: list[dict[str, Any]]) -> None:
    """On every track, two bars are either disjoint or one contains the other (what Perfetto
    needs)."""
    by_track: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            by_track[(event["pid"], event["tid"])].append(event)
    for track, track_events in by_track.items():
        stack: list[float] = []
        for event in sorted(track_events, key=lambda e: (e["ts"], -e["dur"])):
            start, end = event["ts"], event["ts"] + event["dur"]
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, (
                f"{event['name']} at {start} overlaps its neighbour on track {track} without "
                "nesting"
            )
            stack.append(end)

"""Chrome trace export on runs written by the real library (in-process, killed, rotated, torchrun)
and by torchtitan."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys

import pytest

from otel_titan import structured_logger as sl
from otel_titan.analysis import NoRecordsError, StepRange, generate_gantt_trace
from otel_titan.analysis.export.chrome_events import ALIVE_EVIDENCE_US, SLOT_TID_BASE, STEP_TID
from tests.conftest import REPO, jsonl_files, read_records
from tests.helpers.analysis import (
    SLOW_MS,
    T0,
    TOY_STEPS,
    assert_properly_nested,
    bars,
    load_trace,
    process_pids,
    thread_names,
    titan_file,
    titan_record,
    titan_span,
    toy_run,
    write_jsonl,
)


def export(run_dir, **kwargs):
    output = run_dir / "analysis" / "trace.json"
    stats = generate_gantt_trace(run_dir, output, **kwargs)
    return load_trace(output), stats


def by_name(trace, ph, name=None):
    return [
        e for e in trace["traceEvents"] if e["ph"] == ph and (name is None or e["name"] == name)
    ]


# -- a real process, in-process ------------------------------------------------------------------
def test_bars_tracks_args_counters_and_steps_of_a_real_run(logged, run_dir):
    logged()
    sl.log_trace_instant("training_start")
    for step in (1, 2):
        sl.set_step(step, relative_step=step)
        if step == 2:
            sl.add_step_tag("gc")
        with sl.log_trace_span("fwd_bwd"):
            with sl.log_trace_span("forward"):
                pass
            with sl.log_trace_span("backward"):
                pass
        sl.log_trace_scalar({"loss": 1.0 / step, "lr": float("nan")})
    with pytest.raises(ValueError):
        with sl.log_trace_span("optimizer"):
            raise ValueError("boom")
    sl.shutdown_structured_logger()
    records = read_records(jsonl_files(run_dir)[0])
    trace, stats = export(run_dir)

    pid = process_pids(trace)["training rank 0"]
    os_pid = records[0]["pid"]
    assert thread_names(trace, pid) == {STEP_TID: "steps", os_pid: "main thread"}
    assert [
        (e["name"], e["args"]["sort_index"])
        for e in by_name(trace, "M")
        if e["name"] == "process_sort_index"
    ] == [("process_sort_index", 0)]  # pid = rank

    starts = {
        r["span_id"]: r
        for r in records
        if r["log_type"] == "event" and r["log_type_name"].endswith("_start")
    }
    ends = {
        r["span_id"]: r
        for r in records
        if r["log_type"] == "event" and r["log_type_name"].endswith("_end")
    }
    spans = bars(trace)
    assert len(spans) == len(starts) == 7
    for bar in spans:
        start, end = starts[bar["args"]["span_id"]], ends[bar["args"]["span_id"]]
        # A parent whose last child ends in the same µs is drawn 1 µs longer, to contain it strictly
        # (chrome_events).
        same_us = any(
            ends[c]["time_us"] >= end["time_us"]
            for c, s in starts.items()
            if s.get("parent_span_id") == bar["args"]["span_id"]
        )
        assert (bar["name"], bar["ts"], bar["dur"], bar["tid"]) == (
            start["log_type_name"][:-6],
            start["time_us"],
            end["time_us"] - start["time_us"] + same_us,
            os_pid,
        )
        # the monotonic duration, to the µs
        assert bar["dur"] == pytest.approx(end["value"] * 1000, abs=1.0 + same_us)
        for key in ("step", "caller", "trace_id", "parent_span_id"):
            assert bar["args"].get(key) == start.get(key), key
    assert_properly_nested(spans)
    fwd_bwd = {b["args"]["step"]: b for b in spans if b["name"] == "fwd_bwd"}
    assert all(
        b["args"]["parent_span_id"] == fwd_bwd[b["args"]["step"]]["args"]["span_id"]
        for b in spans
        if b["name"] in ("forward", "backward")
    )
    assert fwd_bwd[2]["args"]["step_tags"] == ["gc"] and "step_tags" not in fwd_bwd[1]["args"]

    (failed,) = [b for b in spans if b["name"] == "optimizer"]
    assert (
        failed["args"]["status"] == "error"
        and failed["args"]["error_type"] == "ValueError"
        and failed["args"]["error_message"] == "boom"
        and failed["cname"] == "terrible"
    )
    (marker,) = by_name(trace, "i", "ERROR: optimizer")
    assert marker["args"]["error_message"] == "boom" and marker["tid"] == os_pid

    assert [(c["args"]["value"], c["pid"]) for c in by_name(trace, "C", "loss")] == [
        (1.0, pid),
        (0.5, pid),
    ]
    # not plottable: a marker
    assert [e["args"]["value"] for e in by_name(trace, "i", "lr=NaN")] == [
        "NaN",
        "NaN",
    ]
    assert by_name(trace, "C", "lr") == []
    (start_instant,) = by_name(trace, "i", "training_start")
    assert start_instant["s"] == "t" and start_instant["tid"] == os_pid
    # opened, closed
    assert [e["s"] for e in by_name(trace, "i") if e.get("cat") == "logger"] == [
        "p",
        "p",
    ]
    assert [(e["name"], e["tid"]) for e in by_name(trace, "X") if e["cat"] == "step"] == [
        ("step 1", STEP_TID),
        ("step 2 [gc]", STEP_TID),
    ]
    assert (
        stats.spans == 7
        and stats.failed_spans == 1
        and stats.counters == 2
        and stats.steps == 2
        and stats.incomplete_spans == 0
    )
    assert trace["otherData"]["stats"]["records"] == len(records) == stats.records


def test_trace_is_compact_json_and_written_atomically(logged, run_dir):
    logged()
    for step in range(1, 30):
        sl.set_step(step)
        with sl.log_trace_span("work"):
            sl.log_trace_scalar({"x": step})
    sl.shutdown_structured_logger()
    trace, stats = export(run_dir)
    output = run_dir / "analysis" / "trace.json"
    compact = len(json.dumps(trace, separators=(",", ":"), ensure_ascii=False).encode())
    # one newline per batch at most
    assert stats.output_bytes == output.stat().st_size <= compact + len(trace["traceEvents"]) + 10
    assert os.listdir(run_dir / "analysis") == ["trace.json"]


def test_default_output_is_the_runs_analysis_folder_from_either_path(logged, run_dir):
    logged()
    with sl.log_trace_span("x"):
        pass
    sl.shutdown_structured_logger()
    assert generate_gantt_trace(run_dir / "structured_logs").output_path == str(
        run_dir / "analysis" / "trace.json"
    )
    assert generate_gantt_trace(run_dir).output_path == os.path.join(
        str(run_dir), "analysis", "trace.json"
    )
    load_trace(run_dir / "analysis" / "trace.json")


# -- the output file: created exclusively, removed on failure, never another run's -----------------
def _small_run(run_dir):
    for rank in (0, 1):
        write_jsonl(
            titan_file(run_dir, rank=rank),
            titan_span("fwd", 0, 1, step=1, rank=rank) + titan_span("opt", 2, 3, step=1, rank=rank),
        )


def test_the_export_never_opens_a_file_planted_in_the_output_folder(run_dir, tmp_path):
    """Whoever can write a shared run's analysis/ must not make the exporting user overwrite a
    file."""
    _small_run(run_dir)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    analysis = run_dir / "analysis"
    analysis.mkdir()
    os.symlink(victim, analysis / "trace.json.tmp")  # the old fixed temporary name
    for jobs in (1, 2):
        export(run_dir, jobs=jobs)
        assert victim.read_text() == "precious" and os.readlink(analysis / "trace.json.tmp") == str(
            victim
        )
        assert sorted(os.listdir(analysis)) == ["trace.json", "trace.json.tmp"]
    umask = os.umask(0o022)
    os.umask(umask)
    # as a plain open() would have made it
    assert (analysis / "trace.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_export_leaves_no_file_behind(run_dir, tmp_path):
    _small_run(run_dir)
    out = tmp_path / "out"
    out.mkdir()

    def interrupted(done, total):
        raise KeyboardInterrupt  # the user's ^C, half-way through

    with pytest.raises(KeyboardInterrupt):
        generate_gantt_trace(run_dir, out / "t.json", progress=interrupted)
    with pytest.raises(NoRecordsError):
        generate_gantt_trace(run_dir, out / "t.json", steps="50:60")
    with pytest.raises(IsADirectoryError) as error:
        # an existing directory: refused before any work, naming it
        generate_gantt_trace(run_dir, out)
    assert error.value.filename == str(out)
    assert os.listdir(out) == [] and sorted(os.listdir(tmp_path)) == ["out", "run"]


def test_the_export_of_one_file_never_replaces_the_runs_trace(run_dir):
    _small_run(run_dir)
    whole = generate_gantt_trace(run_dir)
    assert whole.output_path == str(run_dir / "analysis" / "trace.json") and not whole.replaced
    before = (run_dir / "analysis" / "trace.json").read_bytes()
    one_file = titan_file(run_dir, rank=1)
    single = generate_gantt_trace(one_file)
    assert (
        single.output_path
        == str(run_dir / "analysis" / (one_file.name[: -len(".jsonl")] + ".trace.json"))
        and not single.replaced
    )
    assert list(process_pids(load_trace(single.output_path))) == ["training rank 1"]
    assert (run_dir / "analysis" / "trace.json").read_bytes() == before
    assert generate_gantt_trace(run_dir).replaced  # said, when it does replace a file


# -- asyncio: slot packing -------------------------------------------------------------------------
def test_concurrent_tasks_are_slot_packed_to_the_peak_concurrency(logged, run_dir):
    logged()
    sl.set_step(1)
    limit = asyncio.Semaphore(6)

    async def rollout(i):
        async with limit:
            with sl.log_trace_span("rollout"):
                await asyncio.sleep(0.002 * (1 + i % 3))
                with sl.log_trace_span("generate"):
                    await asyncio.sleep(0.001)

    async def main():
        with sl.log_trace_span("gather"):
            await asyncio.gather(*(rollout(i) for i in range(40)))

    asyncio.run(main())
    records = logged.finish()
    trace, stats = export(run_dir)

    # The peak, computed independently from the records: tasks with an open span at once.
    depth, busy, peak = {}, 0, 0
    for record in records:
        task = record.get("task_name")
        if record["log_type_name"].endswith("_start"):
            depth[task] = depth.get(task, 0) + 1
            busy += depth[task] == 1
        elif record["log_type_name"].endswith("_end"):
            depth[task] -= 1
            busy -= depth[task] == 0
        peak = max(peak, busy)
    assert peak == 7  # the gathering task and six rollouts
    assert stats.max_async_slots == peak
    pid = process_pids(trace)["training rank 0"]
    slots = {tid: name for tid, name in thread_names(trace, pid).items() if tid >= SLOT_TID_BASE}
    assert slots == {SLOT_TID_BASE + k: f"async slot {k}" for k in range(peak)}
    spans = bars(trace)
    assert len(spans) == 81 and all(b["tid"] in slots for b in spans)
    assert_properly_nested(spans)
    track_of_span = {b["args"]["span_id"]: b["tid"] for b in spans}
    # nested spans share their task's track
    assert all(
        track_of_span[b["args"]["span_id"]] == track_of_span[b["args"]["parent_span_id"]]
        for b in spans
        if b["name"] == "generate"
    )
    tasks_per_slot = {}
    for bar in spans:
        tasks_per_slot.setdefault(bar["tid"], set()).add(bar["args"]["task_name"])
    # sequential tasks reuse slots
    assert (
        sum(len(t) for t in tasks_per_slot.values()) == 41
        and max(len(t) for t in tasks_per_slot.values()) > 1
    )


# -- a process killed mid-span ---------------------------------------------------------------------
_KILLED = """
import sys, time
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1, run_id="k")
for step in range(1, 4):
    sl.set_step(step)
    with sl.log_trace_span("fwd_bwd"):
        with sl.log_trace_span("forward"):
            pass
sl.set_step(4)
with sl.log_trace_span("fwd_bwd"):
    with sl.log_trace_span("backward"):
        sl.log_trace_instant("waiting")
        sl.flush_structured_logger()
        print("ready", flush=True)
        time.sleep(120)
"""


def alive_until(path, last_us: int) -> int:
    """Where an incomplete span ends: the process's last record, or its file's last write when that
    is later (and not much later)."""
    modified_us = os.stat(path).st_mtime_ns // 1000
    return modified_us if last_us < modified_us <= last_us + ALIVE_EVIDENCE_US else last_us


def test_spans_of_a_process_killed_with_sigkill_are_kept_as_incomplete(run_dir):
    process = subprocess.Popen(
        [sys.executable, "-c", _KILLED, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert process.stdout.readline().strip() == "ready"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    records = read_records(jsonl_files(run_dir)[0])
    assert records[-1]["log_type_name"] == "waiting"  # no closing record: it was killed
    alive_us = alive_until(jsonl_files(run_dir)[0], records[-1]["time_us"])
    trace, stats = export(run_dir)
    open_bars = [b for b in bars(trace) if b["args"].get("incomplete")]
    starts = {
        r["log_type_name"]: r["time_us"]
        for r in records
        if r.get("step") == 4 and r["log_type_name"].endswith("_start")
    }
    assert [(b["name"], b["ts"], b["dur"], b["args"]["step"], b["cname"]) for b in open_bars] == [
        ("fwd_bwd", starts["fwd_bwd_start"], alive_us - starts["fwd_bwd_start"], 4, "yellow"),
        ("backward", starts["backward_start"], alive_us - starts["backward_start"], 4, "yellow"),
    ]
    assert stats.incomplete_spans == 2 and len(bars(trace)) == 8
    assert_properly_nested(bars(trace))
    assert [e["name"] for e in by_name(trace, "X") if e["cat"] == "step"][-1] == "step 4"


_KILLED_IN_ITS_FIRST_SPAN = """
import sys, time
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1, run_id="k", heartbeat_interval_s=0)
sl.set_step(1)
with sl.log_trace_span("train"):
    time.sleep(0.2)  # the _start is written by the background thread meanwhile
    sl.flush_structured_logger()
    print("ready", flush=True)
    time.sleep(120)
"""


def test_a_span_killed_before_any_later_record_lasts_until_the_files_last_write(run_dir):
    """No record after the _start (no heartbeat yet): the bar still covers the time the process is
    known to have lived."""
    process = subprocess.Popen(
        [sys.executable, "-c", _KILLED_IN_ITS_FIRST_SPAN, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert process.stdout.readline().strip() == "ready"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    (path,) = jsonl_files(run_dir)
    records = read_records(path)
    assert records[-1]["log_type_name"] == "train_start"  # killed: nothing after it
    start_us = records[-1]["time_us"]
    trace, _ = export(run_dir)
    (bar,) = bars(trace)
    assert bar["args"]["incomplete"] and (bar["ts"], bar["dur"]) == (
        start_us,
        alive_until(path, start_us) - start_us,
    )

    # The rule, with a last write 2.5 s after the _start (a flush delayed by a busy interpreter, a
    # slow disk):
    os.utime(path, ns=(os.stat(path).st_atime_ns, (start_us + 2_500_000) * 1000))
    (bar,) = bars(export(run_dir)[0])
    assert bar["dur"] == 2_500_000
    for jobs in (1, 2):  # the export workers see the same (a second process makes two groups)
        write_jsonl(titan_file(run_dir, rank=1), [titan_record("x_start", 0)])
        trace, _ = export(run_dir, jobs=jobs)
        assert [b["dur"] for b in bars(trace) if b["name"] == "train"] == [2_500_000]
    # A file modified a day after its last record was copied or touched since: that time says
    # nothing about the process.
    os.utime(path, ns=(os.stat(path).st_atime_ns, (start_us + 86_400_000_000) * 1000))
    assert [b["dur"] for b in bars(export(run_dir)[0]) if b["name"] == "train"] == [0]


# -- rotation: starts rotated away -----------------------------------------------------------------
def test_rotated_away_start_gives_a_bar_that_ends_where_it_ended(run_dir):
    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, max_file_size_mb=0.01, backup_count=1
    )
    with sl.log_trace_span("train"):
        for step in range(1, 80):
            sl.set_step(step)
            with sl.log_trace_span("fwd_bwd"):
                pass
    sl.shutdown_structured_logger()
    segments = sorted(os.listdir(run_dir / "structured_logs"))
    assert len(segments) == 2  # older segments were deleted, with train_start in them
    trace, stats = export(run_dir)
    (train,) = bars(trace, name="train")
    records = [r for name in segments for r in read_records(run_dir / "structured_logs" / name)]
    (end,) = [r for r in records if r["log_type_name"] == "train_end"]
    assert train["args"]["start_missing"] is True and train["ts"] + train["dur"] == pytest.approx(
        end["time_us"], abs=1
    )
    assert train["dur"] == round(end["value"] * 1000, 3)
    fwd = bars(trace, name="fwd_bwd")
    assert 0 < len(fwd) < 79 and stats.skipped_lines == 0


# -- torchtitan's files -------------------------------------------------------------------------
def torchtitan_run(run_dir):
    """Two ranks written by torchtitan's formatter: no span ids, LIFO pairs, a message-only error,
    bare NaN, tasks."""
    rank0 = [
        titan_record("training_start", 0, log_type="instant"),
        *[dict(r, step=1) for r in titan_span("fwd_bwd", 10, 30)[:1]],
        *[dict(r, step=1) for r in titan_span("forward", 11, 15)],
        *[dict(r, step=1) for r in titan_span("fwd_bwd", 10, 30)[1:]],
        titan_record("optim_start", 31, step=1),
        titan_record(
            "optim_error",
            33,
            step=1,
            log_level="ERROR",
            message="[step 1] optim_error: RuntimeError: CUDA error: out of memory",
        ),
        titan_record("optim_end", 33, step=1, value=2.0),
        titan_record("fetch_start", 40, step=2, task_name="Task-1"),
        titan_record("fetch_start", 41, step=2, task_name="Task-2"),
        titan_record("fetch_end", 45, step=2, task_name="Task-1", value=5.0),
        titan_record("fetch_end", 49, step=2, task_name="Task-2", value=8.0),
        titan_record("ckpt_end", 60, step=2, value=7.0),  # its _start is not in the file
    ]
    lines = [json.dumps(r) for r in rank0] + [
        '{"log_type": "instant", "log_type_name": "metric_value", "event_name": "loss", "value": NaN, "time_us": '
        + str(T0 + 61_000)
        + ', "step": 2, "tid": 6161}'
    ]
    write_jsonl(titan_file(run_dir, rank=0), lines)
    pimm = dict(
        schema_version=1,
        world_size=2,
        attempt=0,
        job_id="123",
        trace_id="run-abc",
        epoch=0,
        iteration=5,
    )
    write_jsonl(
        titan_file(run_dir, rank=1, suffix="def456"),
        [
            *[dict(r, step=1, rank=1, **pimm) for r in titan_span("fwd_bwd", 12, 40)],
            titan_record(
                "metric_value", 41, log_type="instant", event_name="loss", value=2.5, rank=1, step=1
            ),
        ],
    )


def test_torchtitan_and_pimm_files_convert_with_exact_bars(run_dir):
    torchtitan_run(run_dir)
    trace, stats = export(run_dir)
    pids = process_pids(trace)
    assert list(pids) == ["training rank 0", "training rank 1"]
    got = [(b["pid"], b["name"], b["ts"] - T0, b["dur"], b["tid"]) for b in bars(trace)]
    slot0, slot1 = SLOT_TID_BASE, SLOT_TID_BASE + 1
    assert got == [
        (0, "fwd_bwd", 10_000, 20_000.0, 6161),
        (0, "forward", 11_000, 4_000.0, 6161),
        (0, "optim", 31_000, 2_000.0, 6161),
        (0, "fetch", 40_000, 5_000.0, slot0),
        (0, "fetch", 41_000, 8_000.0, slot1),
        (0, "ckpt", 53_000, 7_000.0, 6161),
        (1, "fwd_bwd", 12_000, 28_000.0, 6161),
    ]
    (optim,) = bars(trace, name="optim")
    assert (optim["args"]["error_type"], optim["args"]["error_message"]) == (
        "RuntimeError",
        "CUDA error: out of memory",
    )
    (ckpt,) = bars(trace, name="ckpt")
    assert ckpt["args"]["start_missing"] is True
    (pimm_bar,) = bars(trace, pid=1)
    assert (
        pimm_bar["args"]["epoch"] == 0
        and pimm_bar["args"]["iteration"] == 5
        and pimm_bar["args"]["trace_id"] == "run-abc"
    )
    assert [e["args"]["value"] for e in by_name(trace, "C", "loss")] == [2.5]
    # rank 0; torchtitan's bare NaN: read, shown as a marker
    assert [e["pid"] for e in by_name(trace, "i", "loss=nan")] == [0]
    assert stats.skipped_lines == 0 and stats.max_async_slots == 2


# -- filters ---------------------------------------------------------------------------------------
def multi_source_run(run_dir):
    for source, rank in [("training", 0), ("training", 1), ("rollouter", 0), ("reward", 0)]:
        sl.init_structured_logger(source, run_dir, rank=rank, world_size=2, run_id="multi")
        for step in range(1, 7):
            sl.set_step(step)
            with sl.log_trace_span(f"{source}_work"):
                sl.log_trace_scalar({"x": float(step)})
        sl.shutdown_structured_logger()


def test_processes_are_named_and_sorted_by_source_then_rank(run_dir):
    multi_source_run(run_dir)
    trace, _ = export(run_dir)
    pids = process_pids(trace)
    assert list(pids) == ["reward rank 0", "rollouter rank 0", "training rank 0", "training rank 1"]
    sort_index = {
        e["pid"]: e["args"]["sort_index"]
        for e in by_name(trace, "M")
        if e["name"] == "process_sort_index"
    }
    assert [sort_index[pids[name]] for name in pids] == [1, 2, 3, 4]


def test_step_rank_and_source_filters_keep_exactly_their_slice(run_dir):
    multi_source_run(run_dir)
    trace, stats = export(run_dir, steps=StepRange(3, 4), ranks=[1], sources=["training"])
    assert list(process_pids(trace)) == ["training rank 1"]
    assert [(b["name"], b["args"]["step"]) for b in bars(trace)] == [
        ("training_work", 3),
        ("training_work", 4),
    ]
    assert [e["name"] for e in by_name(trace, "X") if e["cat"] == "step"] == ["step 3", "step 4"]
    assert [e["args"]["value"] for e in by_name(trace, "C")] == [3.0, 4.0]
    assert by_name(trace, "i") == []  # the logger's own records carry no step
    assert trace["otherData"]["filters"] == {"steps": "3:4", "ranks": [1], "sources": ["training"]}
    trace, _ = export(run_dir, steps="5:")
    assert (
        sorted({b["args"]["step"] for b in bars(trace)}) == [5, 6] and len(process_pids(trace)) == 4
    )


def test_filters_that_match_nothing_raise_and_write_nothing(run_dir):
    multi_source_run(run_dir)
    with pytest.raises(NoRecordsError, match="no records match the filters"):
        generate_gantt_trace(run_dir, run_dir / "out.json", steps="100:200")
    assert not (run_dir / "out.json").exists() and not [
        name for name in os.listdir(run_dir) if name.endswith(".tmp")
    ]


def test_a_run_without_readable_records_raises(run_dir, caplog):
    write_jsonl(titan_file(run_dir), ["garbage", '{"torn'])
    with (
        caplog.at_level(logging.WARNING, logger="otel_titan.analysis"),
        pytest.raises(NoRecordsError, match="2 unreadable lines skipped"),
    ):
        generate_gantt_trace(run_dir)
    assert not (run_dir / "analysis" / "trace.json").exists()


def test_skipped_lines_are_warned_counted_and_the_rest_converted(run_dir, caplog):
    torchtitan_run(run_dir)
    path = titan_file(run_dir, rank=1, suffix="def456")
    with open(path, "ab") as handle:
        handle.write(b'{"log_type": "event", "log_type_name": "fwd_b')  # a crash mid-write
    with caplog.at_level(logging.WARNING, logger="otel_titan.analysis"):
        trace, stats = export(run_dir)
    assert stats.skipped_lines == 1 and trace["otherData"]["stats"]["skipped_lines"] == 1
    assert f"{path}:4: truncated last line" in caplog.text and stats.skipped_examples == [
        caplog.records[0].getMessage()
    ]
    assert len(bars(trace)) == 7


# -- the real 2-rank torchrun toy run --------------------------------------------------------------
@pytest.mark.slow
def test_two_rank_torchrun_run_converts_with_one_process_and_track_per_rank():
    run = toy_run()
    output = run / "analysis" / "check.json"
    stats = generate_gantt_trace(run, output)
    trace = load_trace(output)
    pids = process_pids(trace)
    assert list(pids) == ["training rank 0", "training rank 1"]
    for rank, pid in enumerate(pids.values()):
        names = [b["name"] for b in bars(trace, pid=pid)]
        for phase in ("data_fetch", "fwd_bwd", "forward", "backward", "optimizer"):
            assert names.count(phase) == TOY_STEPS, (rank, phase)
        assert names.count("gc_collect") == names.count("checkpoint") == TOY_STEPS // 4
        assert [
            e["name"] for e in by_name(trace, "X") if e["cat"] == "step" and e["pid"] == pid
        ] == [f"step {s}" + (" [gc]" if s % 4 == 0 else "") for s in range(1, TOY_STEPS + 1)]
        assert {c["name"] for c in by_name(trace, "C") if c["pid"] == pid} == {
            "loss",
            "num_tokens",
            "lr",
        }
        assert len(thread_names(trace, pid)) == 2  # steps + the main thread
    slow = [b["dur"] for b in bars(trace, pid=pids["training rank 1"], name="data_fetch")]
    assert min(slow) >= SLOW_MS * 1000  # the straggler's sleep is inside its bars
    assert_properly_nested(bars(trace))
    assert stats.incomplete_spans == 0 and stats.skipped_lines == 0


# -- the straightforward baseline of the benchmark agrees with us ----------------------------------
def test_benchmark_baseline_and_export_agree_on_every_bar(tmp_path):
    from benchmarks import export_throughput as bench

    templates = bench.capture_templates(str(tmp_path))
    run = bench.generate_run(str(tmp_path), templates, 300_000, 3, 60_000)
    assert len(os.listdir(os.path.join(run, "structured_logs"))) > 3  # rotated like the library
    bench.baseline_convert(run, str(tmp_path / "baseline.json"))
    bench.ours_convert(run, str(tmp_path / "ours.json"))
    with open(tmp_path / "baseline.json") as handle:
        baseline = json.load(handle)
    ours = load_trace(tmp_path / "ours.json")

    def spans(trace):
        return sorted(
            (e["name"], e["ts"], round(e["dur"], 3), e["args"]["span_id"])
            for e in trace["traceEvents"]
            if e["ph"] == "X" and e.get("cat", "span") == "span"
        )

    assert spans(baseline) == spans(ours) and len(spans(ours)) > 100
    counters = [
        (e["name"], e["ts"], e["args"]["value"]) for e in ours["traceEvents"] if e["ph"] == "C"
    ]
    assert sorted(counters) == sorted(
        (e["name"], e["ts"], e["args"]["value"]) for e in baseline["traceEvents"] if e["ph"] == "C"
    )


# -- what Perfetto showed wrong (issue 13) ---------------------------------------------------------
def test_parents_strictly_contain_children_that_end_where_they_end(run_dir):
    """Perfetto draws a zero-length child at its parent's last µs outside it (depth 0), and of a
    child and a parent with the same ts and dur, the one written first (the child) as the parent."""
    write_jsonl(
        titan_file(run_dir),
        [
            *titan_span("outer", 10, 20)[:1],
            titan_record("tick_start", 20),
            titan_record("tick_end", 20, value=0.0),
            titan_span("outer", 10, 20)[1],
            *titan_span("same", 30, 40)[:1],
            *titan_span("inner", 30, 40),
            titan_span("same", 30, 40)[1],
            *titan_span("after", 40, 45),
        ],
    )
    trace, _ = export(run_dir)
    bar = {b["name"]: b for b in bars(trace)}
    for parent, child in (("outer", "tick"), ("same", "inner")):
        p, c = bar[parent], bar[child]
        assert p["ts"] <= c["ts"] < p["ts"] + p["dur"], (p, c)  # the child begins inside
        # sorted by (ts, -dur), the parent comes first
        assert (p["ts"], -p["dur"]) < (c["ts"], -c["dur"]), (
            p,
            c,
        )
        assert c["ts"] + c["dur"] < p["ts"] + p["dur"] or c["ts"] > p["ts"]
    # widened by 1 µs, no more
    assert bar["outer"]["dur"] == 10_001 and bar["same"]["dur"] == 10_001
    # children and later spans as they were
    assert bar["inner"]["dur"] == 10_000 and bar["after"]["ts"] - T0 == 40_000


def test_steps_track_is_no_thread_id_and_processes_read_plainly(run_dir):
    """Perfetto shows tid 0 as the main thread, and a process as its name followed by its pid."""
    write_jsonl(titan_file(run_dir, rank=3), [*titan_span("fwd", 10, 20, rank=3, step=1)])
    trace, _ = export(run_dir)
    (name,) = [e for e in by_name(trace, "M") if e["name"] == "process_name"]
    assert (name["args"]["name"], name["pid"]) == ("training rank", 3)  # shown: "training rank 3"
    (step,) = [e for e in by_name(trace, "X") if e["cat"] == "step"]
    assert step["tid"] == STEP_TID and STEP_TID not in (0, 3) and STEP_TID > 1 << 22

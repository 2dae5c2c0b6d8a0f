"""Export on several cores gives the same trace as one process, and reports what its workers
skipped."""

from __future__ import annotations

import json
import sys

import pytest

from otel_titan import structured_logger as sl
from otel_titan.analysis import generate_gantt_trace
from otel_titan.analysis.export import parallel as export_parallel
from tests.helpers.analysis import load_trace


def real_run(run_dir, ranks=4):
    for rank in range(ranks):
        sl.init_structured_logger("training", run_dir, rank=rank, world_size=ranks, run_id="par")
        for step in range(1, 25):
            sl.set_step(step)
            with sl.log_trace_span("fwd_bwd"):
                with sl.log_trace_span("forward"):
                    pass
            sl.log_trace_scalar({"loss": 1.0 / step})
        if rank == 2:
            sl.set_step(25)
            with pytest.raises(KeyError):
                with sl.log_trace_span("optimizer"):
                    raise KeyError("lr")
        sl.shutdown_structured_logger()


def canonical(trace):
    return sorted(json.dumps(e, sort_keys=True) for e in trace["traceEvents"])


def test_workers_write_exactly_the_events_of_a_single_process_export(run_dir):
    real_run(run_dir)
    serial = generate_gantt_trace(run_dir, run_dir / "serial.json", jobs=1)
    parallel = generate_gantt_trace(run_dir, run_dir / "parallel.json", jobs=3)
    one, many = load_trace(run_dir / "serial.json"), load_trace(run_dir / "parallel.json")
    assert canonical(one) == canonical(many)
    assert one["otherData"] == many["otherData"]
    assert (
        (serial.spans, serial.failed_spans, serial.counters, serial.processes, serial.records)
        == (
            parallel.spans,
            parallel.failed_spans,
            parallel.counters,
            parallel.processes,
            parallel.records,
        )
        == (193, 1, 96, 4, serial.records)
    )


def test_workers_warn_about_and_count_skipped_lines(run_dir, capfd, caplog):
    real_run(run_dir, ranks=2)
    (path,) = [p for p in (run_dir / "structured_logs").iterdir() if "global_rank_1" in p.name]
    with open(path, "ab") as handle:
        handle.write(b"garbage\n")
    stats = generate_gantt_trace(run_dir, run_dir / "t.json", jobs=2)
    assert stats.skipped_lines == 1 and stats.skipped_examples[0].startswith(f"{path}:")
    # The worker's warning is logged here, in the parent, on the analysis logger: the one path of
    # every warning (the CLI escapes and prints it); the worker itself writes nothing to the
    # terminal.
    assert [
        r.getMessage()
        for r in caplog.records
        if r.name == "otel_titan.analysis" and f"{path}:" in r.getMessage()
    ]
    assert capfd.readouterr().err == ""


def test_steps_filter_applies_in_workers(run_dir):
    real_run(run_dir, ranks=2)
    trace_stats = generate_gantt_trace(run_dir, run_dir / "t.json", jobs=2, steps="3:4")
    trace = load_trace(run_dir / "t.json")
    assert {e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X"} == {
        3,
        4,
    } and trace_stats.spans == 8


def test_progress_is_reported_up_to_the_total(run_dir):
    real_run(run_dir, ranks=2)
    seen = []
    generate_gantt_trace(
        run_dir, run_dir / "t.json", jobs=2, progress=lambda done, total: seen.append((done, total))
    )
    assert seen and seen[-1][0] == seen[-1][1] > 0


def test_a_worker_that_dies_is_an_error_and_leaves_no_trace(run_dir, monkeypatch):
    real_run(run_dir, ranks=2)
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match=r"export worker \d failed"):
        generate_gantt_trace(run_dir, run_dir / "t.json", jobs=2)
    assert not (run_dir / "t.json").exists() and [p.name for p in run_dir.iterdir()] == [
        "structured_logs"
    ]


def test_small_runs_convert_in_process(monkeypatch):
    assert export_parallel.default_jobs(1 << 20, 16) == 1
    assert export_parallel.default_jobs(1 << 30, 1) == 1
    monkeypatch.setattr(
        export_parallel.os, "sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False
    )
    assert (
        export_parallel.default_jobs(1 << 30, 16) == 4
        and export_parallel.default_jobs(1 << 30, 3) == 3
    )


def test_balance_spreads_bytes_and_keeps_every_process_once(tmp_path):
    from otel_titan.analysis.read.records import ProcessLog

    groups = [
        (
            pid,
            [
                ProcessLog(
                    base=str(tmp_path / f"{pid}"),
                    segments=[],
                    source="training",
                    rank=pid,
                    size=size,
                )
            ],
        )
        for pid, size in enumerate([90, 10, 50, 50, 10, 5], start=1)
    ]
    from otel_titan.analysis.workers import balance

    buckets = [
        [groups[i] for i in share]
        for share in balance(groups, 2, lambda g: sum(p.size for p in g[1]))
    ]
    assert sorted(pid for bucket in buckets for pid, _ in bucket) == [1, 2, 3, 4, 5, 6]
    loads = sorted(sum(p.size for _, ps in bucket for p in ps) for bucket in buckets)
    assert loads == [105, 110]

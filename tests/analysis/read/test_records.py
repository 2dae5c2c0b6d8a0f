"""Run → processes → records: which paths are runs, rotated segments in order, who wrote each file,
filters."""

from __future__ import annotations

import os

import pytest

from otel_titan import structured_logger as sl
from otel_titan.analysis import NoRecordsError, NotARunError, find_log_dir, read_run
from tests.helpers.analysis import titan_file, titan_record, write_jsonl


def write_process(run_dir, source, rank, steps=2, **options):
    """A real process's file: init as `source` rank `rank`, a few steps, clean shutdown."""
    sl.init_structured_logger(source, run_dir, rank=rank, world_size=16, run_id="r", **options)
    for step in range(1, steps + 1):
        sl.set_step(step)
        with sl.log_trace_span("work"):
            pass
    sl.shutdown_structured_logger()


def test_run_dir_its_structured_logs_and_one_file_are_all_accepted(run_dir):
    write_process(run_dir, "training", 0)
    write_process(run_dir, "training", 1)
    logs = run_dir / "structured_logs"
    assert find_log_dir(run_dir) == (str(run_dir), str(logs), None)
    assert find_log_dir(logs)[:2] == (str(run_dir), str(logs))
    one = sorted(logs.iterdir())[1]
    assert [p.rank for p in read_run(one).processes] == [1]
    assert [p.rank for p in read_run(logs).processes] == [0, 1]


@pytest.mark.parametrize("make", ["missing", "empty_dir", "dir_of_other_files", "other_file"])
def test_paths_that_are_not_runs_are_refused_with_the_reason(tmp_path, make):
    path = tmp_path / "x"
    if make == "empty_dir":
        path.mkdir()
    elif make == "dir_of_other_files":
        path.mkdir()
        (path / "train.log").write_text("hello")
    elif make == "other_file":
        path.write_text("hello")
    with pytest.raises(NotARunError, match=str(path)):
        read_run(path)


def test_empty_structured_logs_folder_is_not_a_run(run_dir):
    (run_dir / "structured_logs").mkdir(parents=True)
    with pytest.raises(NotARunError, match="no structured-log files"):
        read_run(run_dir)


def test_real_rotation_is_read_oldest_segment_first_without_a_gap(run_dir):
    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, max_file_size_mb=0.02, backup_count=20
    )
    for step in range(1, 61):
        sl.set_step(step)
        with sl.log_trace_span("fwd_bwd"):
            sl.log_trace_scalar({"loss": 1.0 / step})
    sl.shutdown_structured_logger()
    run = read_run(run_dir)
    (process,) = run.processes
    assert len(process.segments) >= 4, process.segments
    assert [os.path.basename(p).rsplit(".", 1)[-1] for p in process.segments[:-1]] == [
        str(n) for n in range(len(process.segments) - 1, 0, -1)
    ]
    seq = [r["seq_id"] for r in process.records(run.skipped)]
    assert seq == list(range(1, len(seq) + 1)) and run.skipped.count == 0
    assert process.size == sum(os.path.getsize(p) for p in process.segments)


def test_processes_sorted_by_source_then_rank_numerically(run_dir):
    for source, rank in [
        ("training", 10),
        ("training", 2),
        ("rollouter", 0),
        ("reward", 1),
        ("training", 0),
    ]:
        write_process(run_dir, source, rank, steps=1)
    run = read_run(run_dir)
    assert [p.label for p in run.processes] == [
        "reward rank 1",
        "rollouter rank 0",
        "training rank 0",
        "training rank 2",
        "training rank 10",
    ]
    assert (
        {p.attempt for p in run.processes} == {0}
        and {p.world_size for p in run.processes} == {16}
        and {p.run_id for p in run.processes} == {"r"}
    )


def test_filters_leave_other_processes_unread(run_dir):
    for source, rank in [("training", 0), ("training", 1), ("training", 2), ("rollouter", 0)]:
        write_process(run_dir, source, rank, steps=1)
    assert [p.label for p in read_run(run_dir, ranks=[0, 2]).processes] == [
        "rollouter rank 0",
        "training rank 0",
        "training rank 2",
    ]
    assert [p.label for p in read_run(run_dir, sources=["rollouter"]).processes] == [
        "rollouter rank 0"
    ]
    assert [p.label for p in read_run(run_dir, ranks=[1], sources=["training"]).processes] == [
        "training rank 1"
    ]
    with pytest.raises(
        NoRecordsError,
        match=r"no process matches the filters \(ranks \[7\], sources \['training'\]\)",
    ):
        read_run(run_dir, ranks=[7], sources=["training"])


def test_identity_of_a_file_with_another_name_comes_from_its_records(run_dir):
    write_jsonl(
        run_dir / "structured_logs" / "rank3.jsonl",
        ["garbage first line", titan_record("a_start", 0, rank=3, source="rollouter")],
    )
    (process,) = read_run(run_dir).processes
    assert (process.source, process.rank, process.pid, process.host_name) == (
        "rollouter",
        3,
        6161,
        "vm",
    )


def test_restarts_of_one_rank_are_separate_processes_in_start_order(run_dir):
    late = titan_file(run_dir, rank=0, suffix="bbbbbb").with_name(
        "training.global_rank_0.20260101-010000-bbbbbb.jsonl"
    )
    write_jsonl(late, [titan_record("a_start", 0, attempt=1)])
    write_jsonl(
        titan_file(run_dir, rank=0, suffix="aaaaaa"), [titan_record("a_start", 0, attempt=0)]
    )
    run = read_run(run_dir)
    assert [p.attempt for p in run.processes] == [0, 1]
    assert [p.stamp for p in run.processes] == ["20260101-000000", "20260101-010000"]


def test_a_lone_rotated_segment_without_its_active_file_is_still_read(run_dir):
    path = titan_file(run_dir)
    write_jsonl(path.with_name(path.name + ".2"), [titan_record("a_start", 0)])
    write_jsonl(path.with_name(path.name + ".1"), [titan_record("a_end", 1, value=1.0)])
    run = read_run(run_dir)
    (process,) = run.processes
    assert [r["log_type_name"] for r in process.records(run.skipped)] == ["a_start", "a_end"]


def test_a_file_name_with_undecodable_bytes_is_read_and_labelled_printably(run_dir):
    path = write_jsonl(
        titan_file(run_dir, rank=2, source="train\udcffing"), [titan_record("a_start", 0, rank=2)]
    )
    assert b"\xff" in os.fsencode(path)  # the byte on disk; Python names it with a surrogate
    (process,) = read_run(run_dir).processes
    assert process.label == "train\\udcffing rank 2"
    process.label.encode("utf-8")
    # the real path still opens
    assert [r["log_type_name"] for r in process.records(read_run(run_dir).skipped)] == ["a_start"]


def test_a_process_knows_when_its_files_were_last_written(run_dir):
    old = write_jsonl(
        titan_file(run_dir).with_name(titan_file(run_dir).name + ".1"), [titan_record("a_start", 0)]
    )
    new = write_jsonl(titan_file(run_dir), [titan_record("a_end", 1, value=1.0)])
    os.utime(old, ns=(0, 3_000_000_000_000_000_000))
    os.utime(new, ns=(0, 2_000_000_000_000_000_000))
    (process,) = read_run(run_dir).processes
    assert process.modified_us == 3_000_000_000_000_000  # the newest write of any segment


def test_one_file_given_is_remembered(run_dir):
    write_jsonl(titan_file(run_dir, rank=0), [titan_record("a_start", 0)])
    one = write_jsonl(titan_file(run_dir, rank=1), [titan_record("a_start", 0, rank=1)])
    assert read_run(run_dir).only_base is None
    assert read_run(one).only_base == str(one)

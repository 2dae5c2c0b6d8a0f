"""read/rollups.py: the writer's rollup lines, found in the raw bytes, parsed into per (rank, step)
totals."""

from __future__ import annotations

import json
import statistics

import pytest

from otel_titan import structured_logger as sl
from otel_titan.analysis.read import lines as read_lines
from otel_titan.analysis.read.records import read_run
from otel_titan.analysis.read.rollups import (
    StepRollup,
    parse_rollup,
    process_rollups,
    read_rollups,
    scan_rollups,
)
from otel_titan.schema import ROLLUP_VERSION, rollup_fields
from tests.conftest import read_records
from tests.helpers.analysis import TOY_STEPS, titan_file, titan_span, write_jsonl
from tests.helpers.rollups import closing_of, rollups_by_step, spans_by_step, toy_run_with_rollups


def _rollup_line(step: int, begin_us: int, **extra: object) -> dict:
    fields = rollup_fields(
        step,
        begin_us,
        begin_us + 2000,
        {"fwd": [1, 1500]},
        ("all_reduce", begin_us + 1600, begin_us + 1900),
        complete=True,
        ended_by="next_step",
    )
    return {
        "time_us": begin_us + 2100,
        "log_type": "instant",
        "log_type_name": "step_rollup",
        **fields,
        "rank": 0,
        "source": "training",
        "attempt": 0,
        **extra,
    }


def test_a_real_run_gives_one_rollup_per_rank_and_step_equal_to_its_spans():
    run = read_run(toy_run_with_rollups(), log_skipped=False)
    found = read_rollups(run)
    assert sorted(found) == [("training", 0, 0), ("training", 1, 0)]
    for process in run.processes:
        steps = found[(process.source, process.rank, process.attempt)]
        assert sorted(steps) == list(range(1, TOY_STEPS + 1))
        records = read_records(process.segments[0])
        truth = spans_by_step(records)
        for step, rollup in steps.items():
            assert isinstance(rollup, StepRollup)
            assert {name: list(pair) for name, pair in rollup.phases.items()} == truth[step][
                "phases"
            ]
            assert (
                rollup.closing == truth[step]["closing"]
                and rollup.begin_us == truth[step]["begin_us"]
            )
            assert rollup.complete is (step < TOY_STEPS)
        assert steps[4].step_tags == ("gc",) and "checkpoint" in steps[4].phases
        # rank 1 is the data_fetch straggler (+40 ms per step): its rollups say so without a span
        # being read.
    # (the median over the steps: on a busy machine rank 0's first data_fetch can take as long)
    assert (
        statistics.median(
            found[("training", 1, 0)][s].phases["data_fetch"][1]
            - found[("training", 0, 0)][s].phases["data_fetch"][1]
            for s in range(1, TOY_STEPS + 1)
        )
        > 30_000
    )


def test_files_without_rollups_give_none(tmp_path):
    """torchtitan's files (and ours with rollups off): nothing, so their steps come from their
    spans."""
    write_jsonl(
        titan_file(tmp_path), [*titan_span("fwd", 0, 5, step=1), *titan_span("fwd", 6, 9, step=2)]
    )
    assert read_rollups(read_run(tmp_path, log_skipped=False)) == {}


def test_the_last_rollup_of_a_step_counts_and_unusable_ones_are_left_out(tmp_path):
    path = titan_file(tmp_path)
    partial = {**_rollup_line(3, 5000), "complete": False, "ended_by": "signal"}
    write_jsonl(
        path,
        [
            _rollup_line(1, 1000),
            # a newer writer's: its fields may mean something else
            {
                **_rollup_line(2, 3000),
                "rollup_version": ROLLUP_VERSION + 1,
            },
            {**_rollup_line(2, 3000), "phases": {"fwd": "1500"}},  # wrong shape
            partial,
            *titan_span("fwd", 10, 12, step=3),
            # the process lived on after SIGTERM: the step, complete
            {
                **_rollup_line(3, 5000),
                "phases": {"fwd": [2, 3000]},
            },
            b'{"log_type_name":"step_rollup","rollup_version":1,"step":4,"beg',  # torn last line
        ],
    )
    steps = process_rollups(read_run(tmp_path, log_skipped=False).processes[0])
    assert sorted(steps) == [1, 3]
    assert steps[3].complete and steps[3].phases == {"fwd": (2, 3000)}
    assert steps[1].closing == ("all_reduce", 2600, 2900) and steps[1].duration_ms == 2.0


def test_the_clock_offset_is_taken_off_like_every_time(tmp_path):
    write_jsonl(titan_file(tmp_path), [_rollup_line(1, 10_000)])
    process = read_run(tmp_path, log_skipped=False).processes[0]
    process.clock_offset_us = 400
    rollup = process_rollups(process)[1]
    assert (rollup.begin_us, rollup.end_us, rollup.closing) == (
        9600,
        11600,
        ("all_reduce", 11200, 11500),
    )


def test_lines_across_read_blocks_and_rotated_segments(run_dir, monkeypatch):
    """Rollups found whatever the block boundaries (read in 4 KiB blocks here), oldest segment
    first, as the writer wrote them."""
    monkeypatch.setattr(read_lines, "BLOCK_BYTES", 4096)
    monkeypatch.setattr("otel_titan.analysis.read.rollups.BLOCK_BYTES", 4096)
    sl.init_structured_logger(
        "training",
        run_dir,
        rank=0,
        world_size=1,
        run_id="r",
        step_rollups=True,
        max_file_size_mb=0.02,
        backup_count=50,
    )
    for step in range(1, 101):
        sl.set_step(step)
        # lines of uneven length
        with sl.log_trace_span("fwd_bwd", description="x" * (step % 7) * 50):
            pass
    sl.shutdown_structured_logger()
    process = read_run(run_dir, log_skipped=False).processes[0]
    assert len(process.segments) > 3
    written = rollups_by_step(
        json.loads(line) for path in process.segments for line in open(path, encoding="utf-8")
    )
    steps = process_rollups(process)
    assert sorted(steps) == sorted(written) == list(range(1, 101))
    assert all(
        steps[s].phases == {name: tuple(pair) for name, pair in written[s]["phases"].items()}
        and steps[s].closing == closing_of(written[s])
        for s in steps
    )


@pytest.mark.parametrize(
    "record",
    [
        None,
        [],
        {"log_type_name": "fwd_end"},
        {"log_type_name": "step_rollup", "rollup_version": 1, "step": "5"},
    ],
)
def test_what_is_no_rollup_parses_to_none(record):
    assert parse_rollup(record) is None


def _whole_file(path, rollups, *, first_seq=1, closed=True, **closing):
    opened = {
        "time_us": 1,
        "log_type": "instant",
        "log_type_name": "structured_logger_opened",
        "seq_id": first_seq,
        "rank": 0,
        "source": "training",
        "attempt": 0,
    }
    end = {
        "time_us": 10**9,
        "log_type": "instant",
        "log_type_name": "structured_logger_closed",
        "dropped_records": 0,
        "failed_records": 0,
        **closing,
    }
    write_jsonl(path, [opened, *rollups, *([end] if closed else [])])


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({}, None),
        ({"first_seq": 40}, "do not begin with the logger's opened record"),
        ({"closed": False}, "did not close cleanly"),
        ({"dropped_records": 3}, "lost records"),
        ({"failed_records": 1}, "lost records"),
        ({"version": 1}, "version 1"),
        ({"last": "next_step"}, "stop before its end"),
        ({"late": 2}, "2 of its spans ended after"),
        ({"newer": True}, "1 line naming step_rollup could not be used"),
    ],
)
def test_whether_the_rollups_hold_every_span_is_read_from_the_file_itself(tmp_path, change, why):
    """Only a file that began with its opened record, closed cleanly, lost nothing and whose
    writer's last rollup says nothing was left out is answered from rollups."""
    version, last, late = (
        change.pop("version", ROLLUP_VERSION),
        change.pop("last", "close"),
        change.pop("late", 0),
    )
    closing = {
        key: change.pop(key) for key in ("dropped_records", "failed_records") if key in change
    }
    final = {
        **_rollup_line(3, 5000),
        "complete": False,
        "ended_by": last,
        "rollup_version": version,
        **({"late_spans": late} if late else {}),
    }
    # a newer writer's rollup of step 2, after this one
    newer = (
        [{**_rollup_line(2, 3500), "rollup_version": ROLLUP_VERSION + 1}]
        if change.pop("newer", False)
        else []
    )
    _whole_file(
        titan_file(tmp_path),
        [
            {**_rollup_line(1, 1000), "rollup_version": version},
            {**_rollup_line(2, 3000), "rollup_version": version},
            *newer,
            final,
        ],
        **change,
        **closing,
    )
    scan = scan_rollups(read_run(tmp_path, log_skipped=False).processes[0])
    assert sorted(scan.steps) == [1, 2, 3]
    assert (scan.why_not is None) if why is None else (why in scan.why_not), scan.why_not


def test_a_torn_last_line_is_no_clean_close(tmp_path):
    path = titan_file(tmp_path)
    _whole_file(
        path,
        [_rollup_line(1, 1000), {**_rollup_line(2, 3000), "complete": False, "ended_by": "close"}],
    )
    with open(path, "ab") as handle:
        handle.write(b'{"log_type_name":"fwd_start","ti')
    assert (
        "did not close cleanly"
        in scan_rollups(read_run(tmp_path, log_skipped=False).processes[0]).why_not
    )

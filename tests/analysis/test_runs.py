"""Several runs in one folder: never merged; the latest by default, said so; another on request (summary and export)."""

from __future__ import annotations

import doctest
import os
import time

import pytest

from otel_titan import structured_logger as sl
from otel_titan.analysis import format_summary, generate_gantt_trace, read_run, runs, summarize_run
from otel_titan.analysis.runs import UnknownRunError, find_run, select_run
from tests.helpers.analysis import T0, load_trace, process_pids, titan_file, titan_record, write_jsonl
from tests.analysis.runs import rank_file

SLOW_FETCH_S = 0.015


def real_run(run_dir, run_id, slow_rank, steps):
    """Two ranks of the real library (one after the other) under `run_id`; `slow_rank` sleeps in data_fetch every step."""
    for rank in (0, 1):
        sl.init_structured_logger("training", run_dir, rank=rank, world_size=2, run_id=run_id)
        for step in range(1, steps + 1):
            sl.set_step(step)
            with sl.log_trace_span("data_fetch"):
                if rank == slow_rank:
                    time.sleep(SLOW_FETCH_S)
            with sl.log_trace_span("optimizer"):
                pass
        sl.shutdown_structured_logger()


@pytest.fixture
def two_runs(run_dir):
    """Run A (rank 1 slow, 10 steps), then run B in the same folder (rank 0 slow, 8 steps)."""
    real_run(run_dir, "A", slow_rank=1, steps=10)
    real_run(run_dir, "B", slow_rank=0, steps=8)
    return run_dir


def test_the_latest_run_is_summarized_alone_and_says_so(two_runs):
    summary = summarize_run(two_runs)
    assert [(p.run_id, p.last_step) for p in summary.processes] == [("B", 8), ("B", 8)]  # A's files are not mixed in
    assert (summary.run_id, summary.run_selection, summary.run_ids) == ("B", "latest", ["B"])
    assert [(r.run_id, r.processes, r.ranks, r.selected) for r in summary.runs] == [("A", 2, [0, 1], False), ("B", 2, [0, 1], True)]
    assert summary.runs[0].start_us < summary.runs[1].start_us
    (group,) = summary.stragglers
    assert [f.rank for f in group.findings if f.kind == "step"] == [0] and len(group.steps) == 7  # B's steps only: A's step 9 is not mixed in (2 ranks: a difference, nobody blamed)
    assert {(f.what, f.rank) for f in group.findings if f.kind == "phase"} == {("data_fetch", 0)}
    assert "run B: the latest of 2 runs in this folder (others: A; pick one with --run RUN_ID)" in format_summary(summary)
    data = summary.to_dict()
    assert (data["run_id"], data["run_selection"], [(r["run_id"], r["selected"]) for r in data["runs"]]) == ("B", "latest", [("A", False), ("B", True)])
    assert data["runs"][0]["start_utc"].endswith("Z")


def test_another_run_is_summarized_on_request(two_runs):
    summary = summarize_run(two_runs, run_id="A")
    assert (summary.run_id, summary.run_selection) == ("A", "requested")
    assert [(p.run_id, p.last_step) for p in summary.processes] == [("A", 10), ("A", 10)]
    (group,) = summary.stragglers
    assert [f.rank for f in group.findings if f.kind == "step"] == [1] and len(group.steps) == 9
    assert {(f.what, f.rank) for f in group.findings if f.kind == "phase"} == {("data_fetch", 1)}
    with pytest.raises(UnknownRunError, match=r"no run 'C' here; runs found: A \(2 processes\), B \(2 processes\)"):
        summarize_run(two_runs, run_id="C")


def test_the_export_takes_one_run_too(two_runs, tmp_path):
    stats = generate_gantt_trace(two_runs, tmp_path / "b.json")
    trace = load_trace(tmp_path / "b.json")
    assert stats.processes == 2 and sorted(process_pids(trace)) == ["training rank 0", "training rank 1"]
    other = trace["otherData"]
    assert (other["run"], other["run_selection"], other["run_ids"], [r["run_id"] for r in other["runs"]]) == ("B", "latest", ["B"], ["A", "B"])
    generate_gantt_trace(two_runs, tmp_path / "a.json", run_id="A")
    a = load_trace(tmp_path / "a.json")
    assert a["otherData"]["run"] == "A" and {e["args"]["step"] for e in a["traceEvents"] if e["ph"] == "X" and e.get("cat") == "span"} == set(range(1, 11))
    with pytest.raises(UnknownRunError):
        generate_gantt_trace(two_runs, tmp_path / "c.json", run_id="C")
    assert not (tmp_path / "c.json").exists()


def test_files_that_do_not_name_their_run_join_the_run_that_had_started(run_dir):
    rank_file(run_dir, 0, [100.0] * 8, run_id="A", world_size=2)
    rank_file(run_dir, 0, [100.0] * 8, run_id="B", world_size=2, start_us=T0 + 3_600_000_000)
    empty = run_dir / "structured_logs" / "training.global_rank_1.20260101-000000-zzzzzz.jsonl"
    empty.touch()
    os.utime(empty, (T0 / 1e6 + 3601, T0 / 1e6 + 3601))  # created one second after B started: B's rank 1, hung before its first record
    titan = write_jsonl(titan_file(run_dir, rank=1, suffix="titan1"), [titan_record("a_start", 1.0, rank=1, step=1)])  # torchtitan's: no run id, during A
    run, choice = select_run(read_run(run_dir))
    assert choice.run_id == "B" and sorted((p.rank, p.run_id, p.base == str(empty)) for p in run.processes) == [(0, "B", False), (1, None, True)]
    run, _ = select_run(read_run(run_dir), "A")
    assert sorted((p.rank, p.run_id, p.base == str(titan)) for p in run.processes) == [(0, "A", False), (1, None, True)]
    summary = summarize_run(run_dir)
    assert summary.hang_suspects == ["training rank 1"] and summary.run_id == "B"
    assert summarize_run(run_dir, run_id="A").hang_suspects == []


def test_one_run_in_a_folder_is_simply_that_run(run_dir):
    rank_file(run_dir, 0, [100.0] * 8, run_id="only", world_size=2)
    write_jsonl(titan_file(run_dir, rank=1, suffix="titan1"), [titan_record("a_start", 1.0, rank=1, step=1)])
    choice = find_run(run_dir)
    assert (choice.run_id, choice.how, [(r.run_id, r.processes) for r in choice.runs]) == ("only", "only", [("only", 2)])
    assert choice.describe() == "run only"
    with pytest.raises(UnknownRunError, match="runs found: only"):
        find_run(run_dir, run_id="other")
    assert "pick one with --run" not in format_summary(summarize_run(run_dir))


def test_docstring_examples():
    failures, tried = doctest.testmod(runs, optionflags=doctest.ELLIPSIS)
    assert failures == 0 and tried > 0

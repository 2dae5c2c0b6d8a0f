"""Several runs in one folder: never merged; the latest by default, said so; another on request
(summary and export)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from otel_titan import structured_logger as sl
from otel_titan.analysis import format_summary, generate_gantt_trace, read_run, summarize_run
from otel_titan.analysis.read.runs import UnknownRunError, find_run, select_run
from tests.analysis.runs import rank_file
from tests.conftest import REPO
from tests.helpers.analysis import (
    T0,
    load_trace,
    process_pids,
    titan_file,
    titan_record,
    write_jsonl,
)

SLOW_FETCH_S = 0.015


def real_run(run_dir, run_id, slow_rank, steps):
    """Two ranks of the real library (one after the other) under `run_id`; `slow_rank` sleeps in
    data_fetch every step."""
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
    # A's files are not mixed in
    assert [(p.run_id, p.last_step) for p in summary.processes] == [
        ("B", 8),
        ("B", 8),
    ]
    assert (summary.run_id, summary.run_selection, summary.run_ids) == ("B", "latest", ["B"])
    assert [(r.run_id, r.processes, r.ranks, r.selected) for r in summary.runs] == [
        ("A", 2, [0, 1], False),
        ("B", 2, [0, 1], True),
    ]
    assert summary.runs[0].start_us < summary.runs[1].start_us
    (group,) = summary.stragglers
    # B's steps only: A's step 9 is not mixed in (2 ranks: a difference, nobody blamed)
    assert [f.rank for f in group.findings if f.kind == "step"] == [0] and len(group.steps) == 7
    assert {(f.what, f.rank) for f in group.findings if f.kind == "phase"} == {("data_fetch", 0)}
    assert (
        "run B: the latest of 2 runs in this folder (others: A; pick one with --run RUN_ID)"
        in format_summary(summary)
    )
    data = summary.to_dict()
    assert (
        data["run_id"],
        data["run_selection"],
        [(r["run_id"], r["selected"]) for r in data["runs"]],
    ) == ("B", "latest", [("A", False), ("B", True)])
    assert data["runs"][0]["start_utc"].endswith("Z")


def test_another_run_is_summarized_on_request(two_runs):
    summary = summarize_run(two_runs, run_id="A")
    assert (summary.run_id, summary.run_selection) == ("A", "requested")
    assert [(p.run_id, p.last_step) for p in summary.processes] == [("A", 10), ("A", 10)]
    (group,) = summary.stragglers
    assert [f.rank for f in group.findings if f.kind == "step"] == [1] and len(group.steps) == 9
    assert {(f.what, f.rank) for f in group.findings if f.kind == "phase"} == {("data_fetch", 1)}
    with pytest.raises(
        UnknownRunError, match=r"no run 'C' here; runs found: A \(2 processes\), B \(2 processes\)"
    ):
        summarize_run(two_runs, run_id="C")


def test_the_export_takes_one_run_too(two_runs, tmp_path):
    stats = generate_gantt_trace(two_runs, tmp_path / "b.json")
    trace = load_trace(tmp_path / "b.json")
    assert stats.processes == 2 and sorted(process_pids(trace)) == [
        "training rank 0",
        "training rank 1",
    ]
    other = trace["otherData"]
    assert (
        other["run"],
        other["run_selection"],
        other["run_ids"],
        [r["run_id"] for r in other["runs"]],
    ) == ("B", "latest", ["B"], ["A", "B"])
    generate_gantt_trace(two_runs, tmp_path / "a.json", run_id="A")
    a = load_trace(tmp_path / "a.json")
    assert a["otherData"]["run"] == "A" and {
        e["args"]["step"] for e in a["traceEvents"] if e["ph"] == "X" and e.get("cat") == "span"
    } == set(range(1, 11))
    with pytest.raises(UnknownRunError):
        generate_gantt_trace(two_runs, tmp_path / "c.json", run_id="C")
    assert not (tmp_path / "c.json").exists()


def test_files_that_do_not_name_their_run_join_the_run_that_had_started(run_dir):
    rank_file(run_dir, 0, [100.0] * 8, run_id="A", world_size=2)
    rank_file(run_dir, 0, [100.0] * 8, run_id="B", world_size=2, start_us=T0 + 3_600_000_000)
    empty = run_dir / "structured_logs" / "training.global_rank_1.20260101-000000-zzzzzz.jsonl"
    empty.touch()
    # created one second after B started: B's rank 1, hung before its first record
    os.utime(empty, (T0 / 1e6 + 3601, T0 / 1e6 + 3601))
    # torchtitan's: no run id, during A
    titan = write_jsonl(
        titan_file(run_dir, rank=1, suffix="titan1"), [titan_record("a_start", 1.0, rank=1, step=1)]
    )
    run, choice = select_run(read_run(run_dir))
    assert choice.run_id == "B" and sorted(
        (p.rank, p.run_id, p.base == str(empty)) for p in run.processes
    ) == [(0, "B", False), (1, None, True)]
    run, _ = select_run(read_run(run_dir), "A")
    assert sorted((p.rank, p.run_id, p.base == str(titan)) for p in run.processes) == [
        (0, "A", False),
        (1, None, True),
    ]
    summary = summarize_run(run_dir)
    assert summary.hang_suspects == ["training rank 1"] and summary.run_id == "B"
    assert summarize_run(run_dir, run_id="A").hang_suspects == []


def test_one_run_in_a_folder_is_simply_that_run(run_dir):
    rank_file(run_dir, 0, [100.0] * 8, run_id="only", world_size=2)
    write_jsonl(
        titan_file(run_dir, rank=1, suffix="titan1"), [titan_record("a_start", 1.0, rank=1, step=1)]
    )
    choice = find_run(run_dir)
    assert (choice.run_id, choice.how, [(r.run_id, r.processes) for r in choice.runs]) == (
        "only",
        "only",
        [("only", 2)],
    )
    assert choice.describe() == "run only"
    with pytest.raises(UnknownRunError, match="runs found: only"):
        find_run(run_dir, run_id="other")
    assert "pick one with --run" not in format_summary(summarize_run(run_dir))


# -- processes that no launcher names (issue 18 item 13) -------------------------------------------
_RL_JOB = '''
"""An RL job started by hand: a controller spawns a rollouter (subprocess) and two reward workers
(multiprocessing, spawn), none under torchrun, none given a run id."""
import multiprocessing, subprocess, sys, time
from otel_titan import structured_logger as sl

ROLLOUTER = """
import sys, time
from otel_titan import structured_logger as sl
sl.init_structured_logger("rollouter", sys.argv[1])
for step in range(1, 4):
    sl.set_step(step)
    with sl.log_trace_span("generate"):
        time.sleep(0.02)
sl.shutdown_structured_logger()
"""


def reward(output_dir, rank):
    sl.init_structured_logger("reward", output_dir, rank=rank)
    for step in range(1, 4):
        sl.set_step(step)
        with sl.log_trace_span("score"):
            time.sleep(0.02)
    sl.shutdown_structured_logger()


if __name__ == "__main__":
    out = sys.argv[1]
    sl.init_structured_logger("controller", out)
    with sl.log_trace_span("rollout_round"):
        rollouter = subprocess.Popen([sys.executable, "-c", ROLLOUTER, out])
        context = multiprocessing.get_context("spawn")
        workers = [context.Process(target=reward, args=(out, rank)) for rank in (0, 1)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        rollouter.wait(60)
    sl.shutdown_structured_logger()
    sys.exit(rollouter.returncode or max(w.exitcode or 0 for w in workers))
'''


def _no_launcher_env(**extra):
    # What a shell with no launcher gives: no torchrun, SLURM or Ray variables, no otel-titan
    # parent.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "TORCHELASTIC_", "SLURM_", "RAY_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def _rl_job(script, out, **env):
    from tests.helpers import processes

    result = processes.run(
        [sys.executable, str(script), str(out)],
        capture_output=True,
        text=True,
        env=_no_launcher_env(**env),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_processes_started_by_hand_are_one_run_and_two_such_jobs_one_after_the_other_are_two(
    tmp_path,
):
    script = tmp_path / "rl_job.py"
    script.write_text(_RL_JOB)
    out = tmp_path / "out"
    _rl_job(script, out)
    _rl_job(script, out)  # the same job again, into the same folder, after the first ended
    logs = read_run(out)
    assert len(logs.processes) == 8
    # No process was given a run id: each record says so, and which process tree it is from (the
    # controller's).
    by_tree = {}
    for process in logs.processes:
        first = json.loads(open(process.segments[0], "rb").readline())
        assert first["run_id"] is None and process.run_id is None
        by_tree.setdefault(process.process_run_id, set()).add(process.source)
    assert sorted(map(sorted, by_tree.values())) == [["controller", "reward", "rollouter"]] * 2

    summary = summarize_run(out)
    assert summary.run_selection == "latest" and len(summary.runs) == 2
    assert [(r.processes, r.named, r.sources) for r in summary.runs] == [
        (4, False, ["controller", "reward", "rollouter"])
    ] * 2
    assert len(summary.processes) == 4 and {p.source for p in summary.processes} == {
        "controller",
        "reward",
        "rollouter",
    }
    first, second = summary.runs
    assert first.end_us < second.start_us  # the gap that splits them
    assert "no run id was given: 4 processes grouped by the time they ran" in format_summary(
        summary
    )
    earlier = summarize_run(out, run_id=first.run_id)
    assert (
        len(earlier.processes) == 4 and min(p.first_us for p in earlier.processes) < second.start_us
    )

    stats = generate_gantt_trace(out, tmp_path / "t.json")
    trace = load_trace(tmp_path / "t.json")
    assert stats.processes == 4
    assert sorted(process_pids(trace)) == [
        "controller rank 0",
        "reward rank 0",
        "reward rank 1",
        "rollouter rank 0",
    ]
    assert trace["otherData"]["run"] == second.run_id


@pytest.mark.slow
def test_processes_started_side_by_side_with_no_parent_are_grouped_by_time_and_given_run_ids_still_separate(
    tmp_path,
):
    from tests.helpers import processes

    out = tmp_path / "out"
    code = (
        "import sys, time\nfrom otel_titan import structured_logger as sl\n"
        "sl.init_structured_logger(sys.argv[2], sys.argv[1])\n"
        "with sl.log_trace_span('work'):\n    time.sleep(float(sys.argv[3]))\n"
        "sl.shutdown_structured_logger()\n"
    )
    # Three processes a shell script starts with `&` (no parent shares anything), and beside them
    # two torchrun-like jobs that name their run: the three are one run, joined to none of the named
    # ones.
    started = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(out), source, "3"], env=_no_launcher_env()
        )
        for source in ("controller", "rollouter", "reward")
    ]
    named = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "named"), "training", "1"],
            env=_no_launcher_env(TORCHELASTIC_RUN_ID=rid),
        )
        for rid in ("A", "B")
    ]
    for process in started + named:
        assert process.wait(120) == 0
    # later, alone
    processes.run(
        [sys.executable, "-c", code, str(out), "controller", "0.1"],
        env=_no_launcher_env(),
        timeout=120,
        check=True,
    )
    choice = find_run(out)
    assert [(r.processes, r.named) for r in choice.runs] == [
        (3, False),
        (1, False),
    ] and choice.how == "latest"
    # any tree's id selects its run
    assert len(find_run(out, run_id=choice.runs[0].process_run_ids[-1]).runs) == 2
    (first,) = [
        r for r in find_run(out, run_id=choice.runs[0].process_run_ids[-1]).runs if r.selected
    ]
    assert first.sources == ["controller", "reward", "rollouter"]
    both = find_run(tmp_path / "named")
    assert [(r.run_id, r.processes, r.named) for r in both.runs] == [
        ("A", 1, True),
        ("B", 1, True),
    ] or [(r.run_id, r.processes, r.named) for r in both.runs] == [("B", 1, True), ("A", 1, True)]


def _unnamed_file(run_dir, source, rank, start_ms, end_ms, tree=None, suffix=None):
    """A process's file with no run id (and, if `tree`, the process tree's id), records from
    `start_ms` to `end_ms` after T0."""
    ids = {"run_id": None, **({"process_run_id": tree} if tree else {})}
    return write_jsonl(
        titan_file(
            run_dir,
            rank=rank,
            source=source,
            suffix=suffix or f"{source[:3]}{rank}{int(start_ms)}"[-6:].rjust(6, "x"),
        ),
        [
            titan_record("work_start", start_ms, rank=rank, source=source, step=1, **ids),
            titan_record(
                "work_end", end_ms, rank=rank, source=source, step=1, value=end_ms - start_ms, **ids
            ),
        ],
    )


def test_processes_with_no_run_id_group_by_tree_and_overlap_and_a_gap_splits_them(run_dir):
    # Job 1: a tree (controller + its rollouter) and, beside it, a reward process started by hand.
    _unnamed_file(run_dir, "controller", 0, 0, 10_000, tree="t1")
    # after a gap, but the controller's tree: the same run
    _unnamed_file(run_dir, "rollouter", 0, 12_000, 30_000, tree="t1")
    # no tree of its own; overlaps the rollouter
    _unnamed_file(run_dir, "reward", 0, 29_000, 31_000)
    # Job 2, after a 1 ms gap: the same shape, never chained to job 1.
    _unnamed_file(run_dir, "controller", 1, 31_001, 40_000, tree="t2")
    _unnamed_file(run_dir, "reward", 1, 35_000, 36_000)
    choice = find_run(run_dir)
    assert [(r.run_id, r.processes, r.named, r.process_run_ids) for r in choice.runs] == [
        ("t1", 3, False, ["t1"]),
        ("t2", 2, False, ["t2"]),
    ]
    assert choice.how == "latest" and choice.run_id == "t2"
    assert choice.runs[0].end_us == T0 + 31_000_000 < choice.runs[1].start_us == T0 + 31_001_000
    run, chosen = select_run(read_run(run_dir), "t1")
    assert (
        sorted(p.source for p in run.processes) == ["controller", "reward", "rollouter"]
        and chosen.how == "requested"
    )
    assert "(no run id was given: 3 processes grouped by the time they ran)" in chosen.describe()
    with pytest.raises(
        UnknownRunError, match=r"runs found: t1 \(3 processes\), t2 \(2 processes\)"
    ):
        find_run(run_dir, run_id="t3")


def test_files_that_say_no_run_and_no_tree_are_split_by_gaps_too(run_dir):
    # torchtitan's own files name no run: two jobs one after the other in one folder are two runs.
    for rank in (0, 1):
        _unnamed_file(run_dir, "training", rank, 0, 5_000, suffix=f"aaaaa{rank}")
        _unnamed_file(run_dir, "training", rank, 60_000, 65_000, suffix=f"bbbbb{rank}")
    choice = find_run(run_dir)
    assert [(r.processes, r.named) for r in choice.runs] == [(2, False), (2, False)]
    first, second = (r.run_id for r in choice.runs)
    assert (
        first.startswith("no-run-id@")
        and second.startswith("no-run-id@")
        and choice.run_id == second
    )
    assert find_run(run_dir, run_id=first).runs[0].selected


def test_named_runs_stay_apart_when_they_overlap_and_a_process_with_no_run_id_joins_the_one_it_ran_beside(
    run_dir,
):
    rank_file(run_dir, 0, [100.0] * 20, run_id="A", world_size=1)  # 2 s from T0
    # 1 s later, overlapping A
    rank_file(run_dir, 1, [100.0] * 20, run_id="B", world_size=1, start_us=T0 + 1_000_000)
    _unnamed_file(run_dir, "reward", 0, 1_500, 2_500)  # began while both ran: B had started last
    _unnamed_file(run_dir, "reward", 1, 10_000, 11_000)  # long after both: a run of its own
    choice = find_run(run_dir)
    assert [(r.run_id, r.processes, r.named) for r in choice.runs][:2] == [
        ("A", 1, True),
        ("B", 2, True),
    ]
    assert [(r.processes, r.named, r.ranks) for r in choice.runs[2:]] == [
        (1, False, [1])
    ] and choice.run_id == choice.runs[2].run_id


def test_a_long_last_record_still_gives_the_end_of_the_process(run_dir):
    # A black box (stall record) runs to hundreds of kB: the end is its time, not an earlier
    # record's.
    ids = {"run_id": None}
    write_jsonl(
        titan_file(run_dir, rank=0, suffix="aaaaaa"),
        [
            titan_record("a_start", 0, **ids),
            titan_record("stall", 50_000, log_type="instant", threads=["x" * 30_000], **ids),
        ],
    )
    # began before that record: the same run
    _unnamed_file(run_dir, "training", 1, 40_000, 41_000, suffix="bbbbbb")
    choice = find_run(run_dir)
    assert [(r.processes, r.end_us) for r in choice.runs] == [(2, T0 + 50_000_000)]

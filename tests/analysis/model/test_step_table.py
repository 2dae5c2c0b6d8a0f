"""model/step_table.py through `RunAnalysis.steps`: the step table from the writer's rollups equals
the one from the spans, and the spans answer whenever the rollups cannot promise that."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan import structured_logger as sl
from otel_titan.analysis import RunAnalysis
from otel_titan.analysis.model.step_table import StepTable, rows_from_collected, rows_from_rollups
from otel_titan.analysis.read.records import read_run
from otel_titan.analysis.read.rollups import scan_rollups
from tests.conftest import REPO
from tests.helpers import processes
from tests.helpers.analysis import TOY_STEPS, _torchrun_command
from tests.helpers.rollups import strip_rollups, toy_run_with_rollups


def _from_spans(run, **options) -> list:
    """The table from the model's accumulators, whatever the files hold: the ground truth."""
    analysis = RunAnalysis(run, log_skipped=False, **options)
    analysis.summary  # noqa: B018 - builds the model
    return rows_from_collected(analysis._collected)


def _check_rows(table: StepTable, ranks: int, steps: int, attempts: int = 1) -> None:
    """Every rank and step has a row; every step but each process's last has a time; phases and the
    closing span are there."""
    assert len(table.rows) == ranks * steps * attempts
    assert sum(row.step_ms is None for row in table.rows) == ranks * attempts
    assert all(
        row.phases and row.closing is not None and row.closing_enter_us <= row.closing_exit_us
        for row in table.rows
    )


@pytest.mark.parametrize(
    "spec",
    [
        RunSpec(ranks=8, steps=20, seed=1),
        RunSpec(ranks=8, steps=20, seed=2, noise=0.05, straggler=(5, "bwd", 25.0)),
        RunSpec(ranks=8, steps=16, seed=3, pp=2, stage_pct=10.0),
        RunSpec(
            ranks=16,
            steps=16,
            seed=4,
            ranks_per_host=4,
            host_offsets_us=[0, 30_000, -12_000, 5_000],
        ),
        RunSpec(
            ranks=8,
            steps=24,
            seed=5,
            pause_every=6,
            pause_ms=50.0,
            variable=0.2,
            job_slow=("data_fetch", 40.0, 10),
        ),
    ],
    ids=["healthy", "straggler", "pipeline", "clocks", "pauses"],
)
def test_from_rollups_the_same_table_as_from_the_spans(tmp_path, spec):
    run = str(tmp_path / "run")
    generate_run(run, spec)
    table = RunAnalysis(run, log_skipped=False).steps()
    assert table.source == "rollups" and table.why_spans == []
    assert table.rows == _from_spans(run)
    _check_rows(table, spec.ranks, spec.steps)
    # only the rollup lines (and each file's two ends) are parsed
    assert table.parsed_bytes < 0.1 * table.total_bytes
    if spec.straggler is not None:
        rank, phase, _ = spec.straggler
        by_step: dict[int, dict[int, float]] = {}
        for row in table.rows:
            by_step.setdefault(row.step, {})[row.rank] = row.phases[phase][1]
        assert all(max(times, key=times.get) == rank for times in by_step.values())


def test_a_drifting_clock_differs_only_where_the_reader_ends_a_parent_with_its_child(tmp_path):
    """A slewing clock stamps a child's end after its parent's: the reader ends the parent with it,
    the writer sums as written.

    The documented difference (docs/analysis.md, "The step table"): only the
    totals of phases that have children, and the exit of a closing span that
    has some, by at most the drift over the span; everything else exactly.
    """
    run = str(tmp_path / "run")
    generate_run(
        run,
        RunSpec(
            ranks=16,
            steps=16,
            seed=4,
            ranks_per_host=4,
            host_offsets_us=[0, 30_000, -12_000, 5_000],
            drift_hosts=(1,),
            drift_ms=3.0,
        ),
    )
    table = RunAnalysis(run, log_skipped=False).steps()
    truth = _from_spans(run)
    assert table.source == "rollups" and len(table.rows) == len(truth)
    differing = set()
    for mine, theirs in zip(table.rows, truth):
        assert (
            mine.source,
            mine.attempt,
            mine.rank,
            mine.step,
            mine.step_ms,
            mine.closing,
            mine.closing_enter_us,
        ) == (
            theirs.source,
            theirs.attempt,
            theirs.rank,
            theirs.step,
            theirs.step_ms,
            theirs.closing,
            theirs.closing_enter_us,
        )
        assert (
            mine.phases.keys() == theirs.phases.keys()
            and mine.closing_exit_us <= theirs.closing_exit_us
        )
        for name, (count, total) in mine.phases.items():
            assert (
                count == theirs.phases[name][0]
                and total <= theirs.phases[name][1] <= total * 1.002 + 0.001
            ), (mine, name)
            if total != theirs.phases[name][1]:
                differing.add((mine.rank // 4, name))
    # Only the drifting host's ranks, only the phase with children (fwd_bwd holds fwd and bwd).
    assert (
        differing
        and {host for host, _ in differing} == {1}
        and {name for _, name in differing} == {"fwd_bwd"}
    )


def test_one_run_of_several_and_a_rank_filter(tmp_path):
    """The run chosen, the ranks asked for: the same selection as every command's, from rollups."""
    run = str(tmp_path / "run")
    generate_run(
        run, RunSpec(ranks=8, steps=10, run_id="first", seed=1, start_us=1_796_000_000_000_000)
    )
    generate_run(
        run, RunSpec(ranks=8, steps=12, run_id="second", seed=2, start_us=1_796_000_100_000_000)
    )
    latest = RunAnalysis(run, log_skipped=False, ranks=[1, 6]).steps()
    first = RunAnalysis(run, log_skipped=False, run_id="first").steps()
    assert latest.source == first.source == "rollups"
    assert {row.rank for row in latest.rows} == {1, 6} and max(
        row.step for row in latest.rows
    ) == 12
    assert latest.rows == _from_spans(run, ranks=[1, 6]) and first.rows == _from_spans(
        run, run_id="first"
    )
    _check_rows(first, 8, 10)


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (RunSpec(ranks=8, steps=12, seed=1, hung=(5, 9)), "did not close cleanly"),
        (RunSpec(ranks=8, steps=12, seed=2, crashed=(3, 7)), "did not close cleanly"),
        (RunSpec(ranks=8, steps=12, seed=3, restart=(2, 6)), "did not close cleanly"),
        (RunSpec(ranks=8, steps=12, seed=4, rollups=False), "no step_rollup records"),
    ],
    ids=["hung", "crashed", "restart", "no-rollups"],
)
def test_the_spans_answer_when_a_process_has_no_rollups_for_all_it_did(tmp_path, spec, why):
    """A rank that hung or crashed has steps whose rollup was never written: the whole table comes
    from the spans, saying why."""
    run = str(tmp_path / "run")
    generate_run(run, spec)
    table = RunAnalysis(run, log_skipped=False).steps()
    assert table.source == "spans" and why in table.why_spans[0], table.why_spans
    assert table.rows == _from_spans(run) and table.rows
    if spec.restart is not None:
        assert {row.attempt for row in table.rows} == {0, 1}  # attempts kept apart, never merged


def test_a_real_torchrun_run_the_same_table_from_rollups_from_its_spans_and_without_rollups(
    tmp_path,
):
    """2 ranks, gloo: the table from the rollups alone equals the model's from the spans, and the
    one of the same files with the rollup lines removed."""
    run = toy_run_with_rollups()
    table = RunAnalysis(run, log_skipped=False).steps()
    assert table.source == "rollups", table.why_spans
    assert table.rows == _from_spans(run)
    _check_rows(table, 2, TOY_STEPS)
    stripped = RunAnalysis(strip_rollups(run, tmp_path / "stripped"), log_skipped=False).steps()
    assert stripped.source == "spans" and stripped.rows == table.rows
    # rank 1 is the data_fetch straggler (+40 ms a step), and both say so
    fetch = {(row.rank, row.step): row.phases["data_fetch"][1] for row in table.rows}
    # (a first step can be slow on a busy machine)
    assert (
        statistics.median(fetch[(1, step)] - fetch[(0, step)] for step in range(1, TOY_STEPS + 1))
        > 30
    ), fetch


def test_a_span_left_out_of_every_rollup_sends_the_table_to_the_spans(run_dir):
    """A thread with an older step of its own ends a span after that step's rollup: the rollups miss
    it, so the spans answer."""
    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, run_id="r", step_rollups=True
    )
    go = threading.Event()

    def loader() -> None:
        sl.set_step(1)
        go.wait(20)
        with sl.log_trace_span("loader"):
            pass

    thread = threading.Thread(target=loader)
    thread.start()
    for step in range(1, 6):
        sl.set_step(step)
        with sl.log_trace_span("fwd"):
            pass
        sl.flush_structured_logger()
        if step == 3:
            go.set()
            thread.join()
    sl.shutdown_structured_logger()
    table = RunAnalysis(run_dir, log_skipped=False).steps()
    assert (
        table.source == "spans"
        and "1 of its spans ended after their step's rollup" in table.why_spans[0]
    )
    assert table.rows[0].phases["loader"][0] == 1  # the spans have it in step 1 ...
    rollup_rows = rows_from_rollups(
        [scan_rollups(process) for process in read_run(run_dir, log_skipped=False).processes]
    )
    # ... the rollups do not: answering from them would have been wrong
    assert "loader" not in rollup_rows[0].phases


def test_tail_reads_no_spans(tmp_path):
    run = str(tmp_path / "run")
    generate_run(run, RunSpec(ranks=4, steps=6, seed=1))
    assert RunAnalysis(run, log_skipped=False, tail=True).steps().source == "rollups"
    generate_run(str(tmp_path / "old"), RunSpec(ranks=4, steps=6, seed=1, rollups=False))
    with pytest.raises(ValueError, match="tail=True"):
        RunAnalysis(str(tmp_path / "old"), log_skipped=False, tail=True).steps()


def test_the_spans_path_is_the_same_in_worker_processes(tmp_path):
    """The counts and totals merge across `--jobs` workers as every accumulator does: the same table
    as one process reads."""
    run = str(tmp_path / "run")
    generate_run(run, RunSpec(ranks=6, steps=8, seed=6, straggler=(2, "fwd", 30.0), rollups=False))
    serial = RunAnalysis(run, log_skipped=False).steps()
    parallel = RunAnalysis(run, log_skipped=False, jobs=2).steps()
    assert serial.source == parallel.source == "spans"
    assert parallel.rows == serial.rows and len(serial.rows) == 6 * 8
    assert {row.phases["fwd"][0] for row in serial.rows} == {1}


@pytest.mark.slow
def test_a_real_torchrun_run_with_the_default_process_figures_the_same_table(tmp_path):
    """The defaults users run with: process figures on (scalars stamped by the logger's thread), a
    checkpoint every 4 steps; rollups and spans agree."""
    output = tmp_path / "toy"
    command, env = _torchrun_command(
        output, "--steps", "12", "--slow-rank", "1", "--slow-ms", "20", "--checkpoint-every", "4"
    )
    env.update(OTEL_TITAN_PROCESS_FIGURES="1", OTEL_TITAN_STEP_ROLLUPS="1")
    result = processes.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert any(
        "memory/" in line
        for path in (output / "structured_logs").glob("*.jsonl")
        for line in path.open(encoding="utf-8")
    )
    table = RunAnalysis(output, log_skipped=False).steps()
    assert table.source == "rollups", table.why_spans
    assert table.rows == _from_spans(output)
    _check_rows(table, 2, 12)


def test_a_rank_killed_by_sigterm_mid_step_is_answered_as_its_spans_say(tmp_path):
    """The launcher's SIGTERM mid-step (torchrun tearing a job down): whatever the file's end, the
    table is the one its spans give."""
    code = textwrap.dedent(
        """
        import sys, time
        from otel_titan import structured_logger as sl
        sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1, step_rollups=True)
        for step in (1, 2, 3):
            sl.set_step(step)
            with sl.log_trace_span("fwd_bwd"):
                with sl.log_trace_span("fwd"):
                    pass
            with sl.log_trace_span("all_reduce"):
                pass
        sl.set_step(4)
        with sl.log_trace_span("all_reduce"):
            print("ready", flush=True)
            time.sleep(60)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OTEL_TITAN_STEP_ROLLUPS": "0"}
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "run")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # the _start of step 4's all_reduce is in the file
        child.send_signal(signal.SIGTERM)
        assert child.wait(30) == -signal.SIGTERM
    finally:
        processes.kill_tree(child)
    table = RunAnalysis(tmp_path / "run", log_skipped=False).steps()
    assert table.rows == _from_spans(tmp_path / "run")
    # It died of the signal, with no closing record: its rollups cannot promise every span (here
    # they would: the spans say).
    assert table.source == "spans" and "did not close cleanly" in table.why_spans[0]
    # Step 4 holds only the open all_reduce: nothing known of it (no time, no span ended), so no
    # row; step 3 ended when 4 began.
    assert [row.step for row in table.rows] == [1, 2, 3] and table.rows[-1].step_ms is not None
    assert [row.closing for row in table.rows] == ["all_reduce"] * 3 and all(
        row.phases["fwd"][0] == 1 for row in table.rows
    )
    scans = [
        scan_rollups(process) for process in read_run(tmp_path / "run", log_skipped=False).processes
    ]
    assert rows_from_rollups(scans) == table.rows  # what its rollups say agrees, as far as they go

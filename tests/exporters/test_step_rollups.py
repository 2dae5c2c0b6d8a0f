"""The writer's ``step_rollup`` records: one per step, written by the background thread, equal to
what the reader makes of the spans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from otel_titan import structured_logger as sl
from otel_titan.exporters.step_rollups import WAIT_STEPS, StepRollups
from otel_titan.schema import ROLLUP_VERSION, MetaEvent
from tests.conftest import REPO, jsonl_files, read_records
from tests.helpers import processes
from tests.helpers.analysis import TOY_STEPS
from tests.helpers.rollups import closing_of, rollups_by_step, spans_by_step, toy_run_with_rollups


def _records(run_dir) -> list[dict]:
    files = jsonl_files(run_dir)
    assert len(files) == 1, files
    return read_records(files[0])


def _assert_rollups_match_spans(records: list[dict], complete_steps: set[int]) -> dict[int, dict]:
    rollups = rollups_by_step(records)
    truth = spans_by_step(records)
    assert set(rollups) == set(truth)
    for step, rollup in rollups.items():
        expected = truth[step]
        assert rollup["rollup_version"] == ROLLUP_VERSION
        assert rollup["phases"] == expected["phases"], step
        assert rollup["begin_us"] == expected["begin_us"], step
        assert closing_of(rollup) == expected["closing"], step
        assert rollup["complete"] is (step in complete_steps), step
        if rollup["complete"]:
            assert rollup["end_us"] == expected["end_us"] and rollup["ended_by"] == "next_step", (
                step
            )
            assert rollup["duration_ms"] == round((rollup["end_us"] - rollup["begin_us"]) / 1000, 3)
    return rollups


def test_one_rollup_per_step_equal_to_the_spans_it_sums(run_dir):
    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, run_id="r", step_rollups=True
    )
    for step in range(1, 6):
        sl.set_step(step)
        if step == 3:
            sl.add_step_tag("gc")
        with sl.log_trace_span("fwd_bwd"):
            with sl.log_trace_span("forward"):
                time.sleep(0.001)
            with sl.log_trace_span("forward"):  # twice in the step: count 2, both summed
                pass
        try:
            with sl.log_trace_span("optim"):
                raise ValueError("boom")  # a failed span still took its time
        except ValueError:
            pass
        sl.log_trace_scalar({"loss": 1.0})
        with sl.log_trace_span("all_reduce"):
            time.sleep(0.002)
    sl.shutdown_structured_logger()
    records = _records(run_dir)
    rollups = _assert_rollups_match_spans(records, complete_steps={1, 2, 3, 4})
    assert [r["step"] for r in records if r["log_type_name"] == MetaEvent.STEP_ROLLUP] == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert rollups[2]["phases"]["forward"][0] == 2 and rollups[2]["phases"]["all_reduce"][1] >= 2000
    assert rollups[2]["closing"]["name"] == "all_reduce"
    assert rollups[3]["step_tags"] == ["gc"] and "step_tags" not in rollups[2]
    # The last step has no next step to end it: written at shutdown, before the closing line, not
    # complete.
    assert (
        records[-2]["log_type_name"] == MetaEvent.STEP_ROLLUP
        and records[-2]["ended_by"] == "close"
        and records[-1]["log_type_name"] == MetaEvent.CLOSED
    )
    # Numbered with the other lines (a gap would read as lost lines), never counted as written data.
    assert [r["seq_id"] for r in records] == list(range(1, len(records) + 1))
    assert records[-1]["written_records"] == len(records) - 2 - len(rollups)


def test_a_span_that_ends_after_its_step_is_summed_into_its_step(run_dir):
    """An asynchronous checkpoint started in step 1 ends in step 2: step 1's rollup waits for it."""
    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, run_id="r", step_rollups=True
    )
    sl.set_step(1)
    release = threading.Event()

    def checkpoint() -> None:
        with sl.log_trace_span("checkpoint"):
            release.wait(10)

    with sl.log_trace_span("fwd_bwd"):
        pass
    writer = threading.Thread(target=checkpoint)
    writer.start()
    time.sleep(0.2)  # started, and exported, in step 1
    sl.set_step(2)
    with sl.log_trace_span("fwd_bwd"):
        pass
    sl.flush_structured_logger()
    time.sleep(0.1)
    early = [
        r
        for r in read_records(jsonl_files(run_dir)[0])
        if r["log_type_name"] == MetaEvent.STEP_ROLLUP
    ]
    assert early == []  # step 1 is over, but its checkpoint is still running
    release.set()
    writer.join()
    sl.set_step(3)
    with sl.log_trace_span("fwd_bwd"):
        pass
    sl.shutdown_structured_logger()
    records = _records(run_dir)
    rollups = _assert_rollups_match_spans(records, complete_steps={1, 2})
    assert rollups[1]["phases"]["checkpoint"][0] == 1 and "open_spans" not in rollups[1]


def test_a_step_waits_for_an_open_span_only_so_long(run_dir):
    """A span that never ends (a stuck thread) holds its step back for WAIT_STEPS steps, then it
    goes out, saying so."""
    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, run_id="r", step_rollups=True
    )
    release = threading.Event()
    sl.set_step(1)

    def stuck() -> None:
        with sl.log_trace_span("stuck_io"):
            release.wait(20)

    thread = threading.Thread(target=stuck)
    thread.start()
    time.sleep(0.1)
    for step in range(2, 2 + WAIT_STEPS + 2):
        sl.set_step(step)
        with sl.log_trace_span("fwd_bwd"):
            pass
        sl.flush_structured_logger()
    written = [
        r
        for r in read_records(jsonl_files(run_dir)[0])
        if r["log_type_name"] == MetaEvent.STEP_ROLLUP
    ]
    # step 1 went out when step 2 + WAIT_STEPS began; 5 is under way
    assert [r["step"] for r in written] == [
        1,
        2,
        3,
        4,
    ]
    assert written[0]["open_spans"] == 1 and "stuck_io" not in written[0]["phases"]
    assert not any("late_spans" in r for r in written)
    release.set()
    thread.join()
    sl.set_step(2 + WAIT_STEPS + 2)
    sl.shutdown_structured_logger()
    later = [
        r
        for r in read_records(jsonl_files(run_dir)[0])
        if r["log_type_name"] == MetaEvent.STEP_ROLLUP
    ][len(written) :]
    # Its span ended after step 1's rollup was out: in no rollup's totals, and every later rollup
    # says so (the last one too).
    assert later and all(r["late_spans"] == 1 for r in later) and later[-1]["ended_by"] == "close"


def test_a_span_of_a_step_whose_rollup_is_out_is_counted_late(run_dir):
    """A thread with an older step of its own adds nothing to a rollup already written: later
    rollups count it in late_spans."""
    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, run_id="r", step_rollups=True
    )
    go = threading.Event()

    def loader() -> None:
        sl.set_step(1)  # a step of its own, from now on
        go.wait(20)
        with sl.log_trace_span("loader"):
            pass

    thread = threading.Thread(target=loader)
    thread.start()
    for step in range(1, 5):
        sl.set_step(step)
        with sl.log_trace_span("fwd"):
            pass
        sl.flush_structured_logger()
    go.set()
    thread.join()
    sl.set_step(5)
    with sl.log_trace_span("fwd"):
        pass
    sl.shutdown_structured_logger()
    records = read_records(jsonl_files(run_dir)[0])
    written = [r for r in records if r["log_type_name"] == MetaEvent.STEP_ROLLUP]
    assert [r["step"] for r in written] == [1, 2, 3, 4, 5]
    # the reader counts it in step 1
    assert any(r["log_type_name"] == "loader_start" and r["step"] == 1 for r in records)
    assert "loader" not in written[0]["phases"] and written[-1]["late_spans"] == 1


def test_no_rollups_when_turned_off(run_dir):
    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, run_id="r", step_rollups=False
    )
    sl.set_step(1)
    with sl.log_trace_span("fwd_bwd"):
        pass
    sl.set_step(2)
    sl.shutdown_structured_logger()
    assert not [r for r in _records(run_dir) if r["log_type_name"] == MetaEvent.STEP_ROLLUP]


def test_the_variable_turns_them_on_and_off(tmp_path):
    code = """
import sys
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1)
for step in (1, 2):
    sl.set_step(step)
    with sl.log_trace_span("fwd_bwd"):
        pass
sl.shutdown_structured_logger()
"""
    counts = {}
    for value in ("1", "0"):
        out = tmp_path / value
        env = {**os.environ, "PYTHONPATH": str(REPO), "OTEL_TITAN_STEP_ROLLUPS": value}
        result = processes.run(
            [sys.executable, "-c", code, str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        counts[value] = sum(r["log_type_name"] == MetaEvent.STEP_ROLLUP for r in _records(out))
    assert counts == {"1": 2, "0": 0}


def test_sigterm_writes_the_step_under_way_as_not_complete(tmp_path):
    """A rank killed by the launcher mid-step: its file still has the steps before, and the one
    under way so far."""
    code = textwrap.dedent(
        """
        import sys, time
        from otel_titan import structured_logger as sl
        sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1, step_rollups=True)
        for step in (1, 2, 3):
            sl.set_step(step)
            with sl.log_trace_span("fwd_bwd"):
                pass
        with sl.log_trace_span("all_reduce"):
            print("ready", flush=True)
            time.sleep(60)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OTEL_TITAN_STEP_ROLLUPS": "0"}
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # the _start of all_reduce is in the file
        child.send_signal(signal.SIGTERM)
        assert child.wait(30) == -signal.SIGTERM
    finally:
        processes.kill_tree(child)
    records = _records(tmp_path)
    rollups = [r for r in records if r["log_type_name"] == MetaEvent.STEP_ROLLUP]
    assert [(r["step"], r["complete"], r["ended_by"]) for r in rollups] == [
        (1, True, "next_step"),
        (2, True, "next_step"),
        (3, False, "signal"),
    ]
    assert rollups[-1]["open_spans"] == 1 and rollups[-1]["phases"] == {
        "fwd_bwd": [1, rollups[-1]["phases"]["fwd_bwd"][1]]
    }
    assert records.index(rollups[-1]) > [r["log_type_name"] for r in records].index(
        "signal_received"
    )


def test_spans_of_other_kinds_and_steps_are_left_alone():
    """Timelines with no step, or spans that are not the logger's own, give no rollup (nothing is
    invented)."""

    class Foreign:
        record_kind = "span"
        step = 1

    rollups = StepRollups()
    assert rollups.observe([(False, Foreign()), (True, Foreign())]) == []
    assert rollups.final("close") == [] and rollups.written == 0


@pytest.mark.slow
def test_a_real_torchrun_run_has_one_rollup_per_rank_and_step_equal_to_its_spans():
    pytest.importorskip("torch")
    run = toy_run_with_rollups()  # 2 ranks, gloo, 8 steps, rank 1 slower in data_fetch
    files = jsonl_files(run)
    assert len(files) == 2
    for path in files:
        records = read_records(path)
        rollups = [r for r in records if r["log_type_name"] == MetaEvent.STEP_ROLLUP]
        # one per step, in order
        assert [r["step"] for r in rollups] == list(range(1, TOY_STEPS + 1))
        assert {r["rank"] for r in rollups} == {records[0]["rank"]}
        by_step = _assert_rollups_match_spans(records, complete_steps=set(range(1, TOY_STEPS)))
        assert (
            by_step[TOY_STEPS]["ended_by"] == "close"
            and records[-1]["log_type_name"] == MetaEvent.CLOSED
        )
        for step, rollup in by_step.items():
            assert set(rollup["phases"]) >= {
                "data_fetch",
                "fwd_bwd",
                "forward",
                "backward",
                "optimizer",
            }
            # The step-closing span: the last top-level span of the step (the checkpoint's barrier
            # every 4 steps).
            assert rollup["closing"]["name"] == ("checkpoint" if step % 4 == 0 else "optimizer")
        # A few percent of the bytes (process figures off in tests): the spans are the bulk.
        size = os.path.getsize(path)
        rollup_bytes = sum(len(json.dumps(r, separators=(",", ":"))) + 1 for r in rollups)
        assert rollup_bytes < 0.06 * size, (rollup_bytes, size)


def test_a_failing_rollup_never_costs_a_record(run_dir, caplog):
    """Rollups are a bonus: if summing raises, the batch is written all the same, once warned, and
    rollups stop."""

    class Broken(StepRollups):
        def observe(self, timeline):
            raise RuntimeError("rollup bug")

    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, run_id="r", step_rollups=True
    )
    (exporter,) = [e for e in sl.get_exporters() if hasattr(e, "rollups")]
    exporter.rollups = Broken()
    for step in (1, 2, 3):
        sl.set_step(step)
        with sl.log_trace_span("fwd_bwd"):
            pass
    sl.shutdown_structured_logger()
    records = _records(run_dir)
    assert [r["log_type_name"] for r in records].count("fwd_bwd_end") == 3 and records[-1][
        "log_type_name"
    ] == MetaEvent.CLOSED
    assert not [r for r in records if r["log_type_name"] == MetaEvent.STEP_ROLLUP]
    assert exporter.rollups is None
    assert [r.getMessage() for r in caplog.records if "step rollups failed" in r.getMessage()] != []

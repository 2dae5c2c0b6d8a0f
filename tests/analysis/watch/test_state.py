"""One process's live state: nesting by parent ids, steps, black boxes, mesh coordinates, bounded
memory."""

from __future__ import annotations

import queue
import threading
import time

from otel_titan.analysis.watch.detect import Detector, Rules
from otel_titan.analysis.watch.state import (
    NAMES_KEPT,
    STEPS_KEPT,
    WINDOW_STEPS,
    ProcessState,
    is_collective,
    mesh_coordinates,
)
from otel_titan.core.blackbox import thread_stacks


def rec(name, t, **extra):
    return {
        "log_type_name": name,
        "log_type": "event" if name.endswith(("_start", "_end")) else "instant",
        "time_us": t,
        **extra,
    }


def test_nesting_follows_parent_ids_not_timestamps():
    p = ProcessState("k", label="r0", source="training", rank=0)
    # The child starts in the same microsecond as its parent, and its record comes first (another
    # thread wrote it).
    p.apply(rec("bwd_start", 100, span_id="c", parent_span_id="p", step=1), 1.0)
    p.apply(rec("fwd_bwd_start", 100, span_id="p", step=1), 1.0)
    assert p.innermost().name == "bwd" and p.open_names() == ["bwd", "fwd_bwd"]


def test_a_step_s_facts_phases_and_the_closing_collective_wait():
    p = ProcessState("k", label="r0", source="training", rank=0)
    for step, t in ((1, 0), (2, 100_000)):
        p.apply(rec("fwd_start", t, span_id=f"f{step}", step=step), 1.0)
        p.apply(rec("fwd_end", t + 60_000, span_id=f"f{step}", step=step, value=60.0), 1.0)
        p.apply(rec("all_reduce_start", t + 60_000, span_id=f"a{step}", step=step), 1.0)
        p.apply(rec("all_reduce_end", t + 99_000, span_id=f"a{step}", step=step, value=39.0), 1.0)
    p.apply(rec("fwd_start", 200_000, span_id="f3", step=3), 1.0)
    first, second = p.steps
    assert first.duration_ms == 100.0 and first.phases == {"fwd": 60.0, "all_reduce": 39.0}
    assert first.closing == "all_reduce" and first.closing_ms == 39.0
    # Each phase's end (own clock): wait or work is judged by the model's rule from these
    # (`model.stragglers.lateness`).
    assert first.ends == {"fwd": 60_000, "all_reduce": 99_000} and first.closing_end_us == 99_000
    assert p.span_max_ms == {"fwd": 60.0, "all_reduce": 39.0}


def test_a_black_box_gives_the_main_thread_s_innermost_frame():
    p = ProcessState("k", label="r0", source="training", rank=0)
    p.apply(
        {
            "log_type_name": "stall",
            "log_type": "instant",
            "time_us": 5,
            "reason": "trigger",
            "threads": [
                {
                    "thread_name": "loader",
                    "main": False,
                    "frames": [{"file": "x.py", "line": 1, "function": "f"}],
                },
                {
                    "thread_name": "MainThread",
                    "main": True,
                    "frames": [{"file": "train.py", "line": 42, "function": "load_batch"}],
                },
            ],
            "open_spans": [],
            "flight_recorder": None,
        },
        2.0,
    )
    assert (
        p.black_box.frame == "train.py:42 load_batch"
        and p.black_box.reason == "trigger"
        and not p.black_box.flight_recorder
    )


def test_a_black_box_names_the_program_s_line_not_the_library_frame_it_is_stuck_in():
    # A real stack: a thread blocked in queue.get (a data loader's wait), read by the writer's own
    # black box code. Its innermost frames are the standard library's (threading.py's wait); the
    # line a user must read is the program's call into it, as summarize's Hang section shows it
    # (hang.program_line).
    jobs: queue.Queue = queue.Queue()
    started = threading.Event()

    def load_batch():
        started.set()
        jobs.get(timeout=30)

    loader = threading.Thread(target=load_batch, name="stuck-loader")
    loader.start()
    try:
        started.wait(5)
        time.sleep(0.05)
        stacks = [t for t in thread_stacks() if t["thread_name"] == "stuck-loader"]
    finally:
        jobs.put(None)
        loader.join(5)
    assert stacks and "threading.py" in stacks[0]["frames"][0]["file"], stacks
    stacks[0]["main"] = True
    p = ProcessState("k", label="r0", source="training", rank=0)
    p.apply(
        {
            "log_type_name": "stall",
            "log_type": "instant",
            "time_us": 5,
            "reason": "trigger",
            "where": "between_spans",
            "threads": stacks,
            "open_spans": [],
            "flight_recorder": None,
        },
        2.0,
    )
    assert p.black_box.frame is not None and p.black_box.frame.endswith(" load_batch"), (
        p.black_box.frame
    )
    assert "test_state.py:" in p.black_box.frame and p.black_box.where == "between_spans"


def test_mesh_coordinates_and_collective_names():
    assert mesh_coordinates({"mesh": {"pp": 1, "dp": 3, "tp": 0}}) == {"pp": 1, "tp": 0, "dp": 3}
    # the field alone, every name
    assert mesh_coordinates({"mesh": {"stage": 1, "dp_shard": 3}, "tp_rank": 2}) == {
        "stage": 1,
        "dp_shard": 3,
    }
    assert [
        is_collective(n)
        for n in ("all_reduce", "barrier", "pp_recv", "grad_sync", "fwd", "optimizer", "data_fetch")
    ] == [True, True, True, True, False, False, False]


def test_memory_stays_bounded_however_long_the_job_runs():
    p = ProcessState("k", label="r0", source="training", rank=0)
    for step in range(1, 5001):
        t = step * 1000
        name = f"phase_{step}"  # a new span name every step: the worst case
        p.apply(rec(f"{name}_start", t, span_id=f"s{step}", step=step), float(step))
        p.apply(rec(f"{name}_end", t + 500, span_id=f"s{step}", step=step, value=0.5), float(step))
    assert len(p.steps) == STEPS_KEPT and len(p.span_max_ms) == NAMES_KEPT and not p.open
    # The straggler rule's window: the phases of the last WINDOW_STEPS finished steps only, sorted
    # copy included.
    assert len(p.window_times) <= WINDOW_STEPS and set(p.window_times) == set(p.window_ends) == set(
        p.window_sorted
    )
    assert all(min(times) > p.steps[-1].step - WINDOW_STEPS for times in p.window_times.values())


def feed(detector, ranks, steps, t0=0.0, step_s=0.2):
    for r in ranks:
        detector.observe(
            f"r{r}",
            {
                "label": f"rank {r}",
                "source": "training",
                "rank": r,
                "world_size": len(ranks),
                "run_id": "x",
                "attempt": 0,
            },
            [rec("structured_logger_opened", 0)],
            t0,
        )
    t = t0
    for step in range(1, steps + 1):
        for r in ranks:
            us = int(t * 1e6)
            detector.observe(
                f"r{r}",
                {},
                [
                    rec("fwd_start", us, step=step, span_id=f"f{r}{step}"),
                    rec("fwd_end", us + 100_000, step=step, span_id=f"f{r}{step}", value=100.0),
                    rec("barrier_start", us + 100_000, step=step, span_id=f"b{r}{step}"),
                    rec("barrier_end", us + 190_000, step=step, span_id=f"b{r}{step}", value=90.0),
                ],
                t + 0.2,
            )
        t += step_s
    return t


def alive(detector, ranks, now, quiet_s):
    """What the writer writes of `ranks`, alive and quiet with spans open for `quiet_s` seconds: a
    heartbeat every 10 s."""
    if quiet_s and quiet_s % 10 == 0:
        for r in ranks:
            detector.observe(f"r{r}", {}, [rec("heartbeat", int(now * 1e6), open_spans=1)], now)


def test_a_span_never_seen_to_finish_gets_time_before_its_rank_is_blamed():
    """Rank 0 alone runs a first eval while the others wait in a barrier: its own work, a pause
    (issue 26 item 14).

    Not a hang at 8 s, nor at 30 s (the wait for a span never seen to finish): only once it lasted
    longer than the user allows (``shared_pause_s``: 300 s, ``--pause-after``), and then rank 0 in
    eval is the culprit.
    """
    for limit in (None, 45.0):
        detector = Detector(Rules() if limit is None else Rules(shared_pause_s=limit))
        t = feed(detector, [0, 1, 2], 10)
        step = 11
        detector.observe("r0", {}, [rec("eval_start", int(t * 1e6), step=step, span_id="e")], t)
        for r in (1, 2):
            detector.observe(
                f"r{r}", {}, [rec("barrier_start", int(t * 1e6), step=step, span_id=f"w{r}")], t
            )
        allowed = limit or 300.0
        events, frames = [], []
        for k in range(1, int(allowed)):
            alive(detector, [0, 1, 2], t + k, k)
            frame, new = detector.evaluate(t + k)
            events += new
            frames.append(frame)
        assert [e for e in events if e["kind"] == "hang"] == [], (
            f"a first eval shorter than {allowed} s is not a hang"
        )
        assert frames[-1]["pause"].startswith("rank 0 in eval, a span only it runs"), frames[-1][
            "pause"
        ]
        for k in range(int(allowed), int(allowed) + 5):
            alive(detector, [0, 1, 2], t + k, k)
            events += detector.evaluate(t + k)[1]
        hangs = [e for e in events if e["kind"] == "hang"]
        assert len(hangs) == 1 and hangs[0]["ranks"] == [0] and hangs[0]["phase"] == "eval", (
            limit,
            hangs,
        )


def test_the_opening_record_s_heartbeat_interval_is_believed_up_to_a_cap():
    """A forged interval (the run folder is a team's) must not keep a job killed whole a hang with a
    culprit for an hour."""
    for said, kept in ((10.0, 10.0), (0, 0.0), (3600.0, 300.0), ("10", None), (-1, None)):
        p = ProcessState("r0", label="training rank 0", source="training", rank=0)
        p.apply(
            {
                "log_type_name": "structured_logger_opened",
                "log_type": "instant",
                "time_us": 1,
                "heartbeat_interval_s": said,
            },
            arrival=0.0,
        )
        assert p.heartbeat_s == kept, said


def test_spans_without_ids_pair_per_thread_as_summarize_pairs_them():
    """torchtitan's files carry no span ids: an ``_end`` closes the newest open span of its name *on
    its thread* (the model's walk, torchtitan's own Gantt rule), never another thread's."""
    p = ProcessState("x.jsonl", label="training rank 0", source="training", rank=0)
    p.apply(rec("data_fetch_start", 100, tid=1, step=1), 1.0)  # the training loop's
    p.apply(rec("data_fetch_start", 150, tid=2, step=1), 1.0)  # a loader thread's, which hangs
    p.apply(rec("data_fetch_end", 180, tid=1, step=1, value=0.08), 1.0)
    # The loader's span is the one still open, from its own start; the loop's took 80 µs.
    assert [(s.name, s.start_us) for s in p.open.values()] == [("data_fetch", 150)]
    p.apply(rec("fwd_start", 200, tid=1, step=2), 2.0)
    assert p.steps[-1].phases == {"data_fetch": 0.08}


def test_an_end_whose_start_rotated_away_is_timed_by_its_value_and_opens_nothing():
    p = ProcessState("x.jsonl", label="training rank 0", source="training", rank=0)
    p.apply(rec("fwd_start", 1_000, span_id="a", step=3), 1.0)
    p.apply(rec("bwd_end", 1_500, span_id="gone", step=3, value=2.5), 1.0)
    assert p.open_names() == ["fwd"] and p.last_end == "bwd"
    assert p.span_max_ms == {"bwd": 2.5}


def test_watch_times_each_step_s_phases_as_the_models_step_table_does(tmp_path):
    """One engine: the phase time per rank and step that watch's straggler rule reads equals the
    model's step table (`RunAnalysis.steps`, from the spans) for every finished step."""
    from benchmarks.generate_run import RunSpec, generate_run
    from otel_titan.analysis import RunAnalysis
    from otel_titan.analysis.read.lines import loads_line

    run = tmp_path / "run"
    generate_run(str(run), RunSpec(ranks=4, steps=12, seed=7, straggler=(2, "fwd", 30.0)))
    rows = {
        (row.rank, row.step): {name: ms for name, (_, ms) in row.phases.items()}
        for row in RunAnalysis(run, cache=False).steps().rows
    }
    compared = 0
    for path in sorted((run / "structured_logs").glob("*.jsonl")):
        rank = int(path.name.split("global_rank_")[1].split(".")[0])
        p = ProcessState(str(path), label=f"training rank {rank}", source="training", rank=rank)
        with open(path, "rb") as handle:
            p.apply_records((loads_line(line) for line in handle), 1.0)
        for facts in p.steps:
            assert facts.phases.keys() == rows[rank, facts.step].keys(), (rank, facts.step)
            for name, ms in facts.phases.items():
                assert abs(ms - rows[rank, facts.step][name]) < 0.0015, (rank, facts.step, name)
                compared += 1
    assert compared > 4 * 10 * 3  # every finished step of every rank, each with its phases

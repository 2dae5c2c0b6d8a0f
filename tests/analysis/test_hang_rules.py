"""The Hang section's rules on written records (tests/analysis/hang_runs.py): one test per defect of
issue 18, items 1-4, 6, 8.

The real-process versions (torchrun, gloo) are in test_hang.py; these pin
each rule down where a real job cannot be steered: two ranks at the same
µs, a pg id that means different groups on different ranks, a desync by
dtype, torch's own dump file, a hostile pickle.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest

from otel_titan.analysis import format_summary, summarize_run
from otel_titan.analysis.model.collect import summarize_tails
from otel_titan.analysis.summarize import summary_json
from tests.analysis.hang_runs import fr_entry, frames, write_hang_run, write_rank
from tests.helpers.analysis import T0


def suspects(run: Path, reader=summarize_run) -> list[int | None]:
    report = reader(run).hang
    assert report is not None
    return [s.rank for s in report.suspects]


def head(run: Path, reader=summarize_run, lines: int = 15) -> str:
    return "\n".join(format_summary(reader(run)).splitlines()[:lines])


# -- item 1: a rank stuck between spans ------------------------------------------------------------
@pytest.mark.parametrize("recorder", ["on", "off"])
@pytest.mark.parametrize("culprit_box", [True, False])
def test_a_rank_stuck_between_spans_mid_step_is_the_suspect_not_the_rank_waiting_for_it(
    tmp_path, recorder, culprit_box
):
    culprit = write_hang_run(tmp_path, "world", 2, "between", recorder, culprit_box=culprit_box)
    assert culprit == 1
    for reader in (summarize_run, summarize_tails):
        assert suspects(tmp_path, reader) == [1]
        text = head(tmp_path, reader)
        assert "rank 0 (training)" not in text.split("Suspects:")[1].split("\n\n")[0]
        assert "stalled in its own code" not in text
    if culprit_box:  # told apart from idle or dead: stuck between spans at step 6, after all_reduce; the headline says the same
        text = format_summary(summarize_run(tmp_path))
        assert (
            "between spans at step 6" in text
            and "stalled at step 6, between spans (after all_reduce_end)  (training rank 1)" in text
        )
    why = summarize_run(tmp_path).hang.suspects[0].why
    assert (
        ("never entered seq 6 all_reduce" in why)
        if recorder == "on" and culprit_box
        else ("never entered" in why or "never reached step 6" in why)
    )


# -- item 2: every process group, by membership; p2p; desync; torch's dump files -------------------
def test_a_sub_group_collective_is_compared_by_membership_not_by_pg_id(tmp_path):
    # Tensor-parallel pairs [0,1], [2,3], ...: every rank's pair is its pg 1, yet pg 1 is a
    # different group on each pair.
    culprit = write_hang_run(tmp_path, "tp", 8, "subgroup", "on", seed=0)
    report = summarize_run(tmp_path).hang
    assert [s.rank for s in report.suspects] == [culprit]
    assert (
        f"behind in pg {culprit // 2 + 1} (ranks {culprit // 2 * 2}-{culprit // 2 * 2 + 1}): "
        "never entered seq 6 all_reduce" in report.suspects[0].why
    )
    text = head(tmp_path)
    assert "wait in all_reduce (pg 0, seq 6, scheduled)" in text and "(victims)" in text


def test_a_stuck_recv_is_followed_to_the_rank_that_never_sent(tmp_path):
    culprit = write_hang_run(tmp_path, "pp", 2, "p2p", "on")
    report = summarize_run(tmp_path).hang
    assert [(s.rank, s.rule) for s in report.suspects] == [(culprit, "p2p")]
    assert (
        "never sent what rank 1 waits to recv (pg 1 (ranks 0-1), p2p seq 6)"
        in report.suspects[0].why
    )
    assert "waits in recv from rank 0 (pg 1 (ranks 0-1), p2p seq 6, scheduled)" in head(tmp_path)


def _desync_run(run: Path, odd: dict[str, object], world: int = 4) -> None:
    for rank in range(world):
        call = dict(op="all_reduce", sizes=[[16]], dtype="Float") | (odd if rank == 2 else {})
        entries = [fr_entry("0", 1), fr_entry("0", 2), fr_entry("0", 3, state="scheduled", **call)]  # type: ignore[arg-type]
        box = {
            "threads": frames("main", 80),
            "flight_recorder": {
                "entries": entries,
                "pg_config": {"0": {"ranks": list(range(world))}},
            },
        }
        write_rank(run, rank, world, [("span", "all_reduce", 3), ("stall", box)])


@pytest.mark.parametrize(
    "odd,said",
    [
        ({"op": "broadcast"}, "called broadcast"),
        (
            {"dtype": "Double"},
            "called all_reduce [[16]] Double while 3 ranks called all_reduce [[16]] Float",
        ),
        ({"sizes": [[8]]}, "called all_reduce [[8]] Float"),
    ],
)
def test_a_desync_same_seq_other_op_size_or_dtype_is_named(tmp_path, odd, said):
    _desync_run(tmp_path, odd)
    report = summarize_run(tmp_path).hang
    assert [(s.rank, s.rule) for s in report.suspects] == [(2, "desync")]
    assert report.suspects[0].why.startswith(f"desync in pg 0 seq 3: {said}")


def test_a_desync_without_a_majority_is_reported_and_nobody_is_named(tmp_path):
    for rank in range(2):
        entries = [
            fr_entry("0", 1),
            fr_entry("0", 2, state="scheduled", op="broadcast" if rank else "all_reduce"),
        ]
        write_rank(
            tmp_path,
            rank,
            2,
            [
                ("span", "sync", 2),
                ("stall", {"threads": frames("main", 80), "flight_recorder": {"entries": entries}}),
            ],
        )
    report = summarize_run(tmp_path).hang
    assert report.suspects == [] and report.verdict == "cannot tell"
    assert any(
        n.startswith("desync in pg 0 seq 2") and "cannot tell which side" in n for n in report.notes
    )
    assert "Suspects: cannot tell: desync in pg 0 seq 2" in head(tmp_path)


def _torch_entry(pg: str, seq: int, state: str, record_id: int) -> dict[str, object]:
    """An entry as torch 2.13 writes it (keys and values as `_dump_fr_trace` gave on gloo)."""
    return {
        "record_id": record_id,
        "pg_id": int(pg),
        "process_group": [pg, "default_pg" if pg == "0" else "undefined"],
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": (T0 + seq * 1000) * 1000,
        "input_sizes": [[16]],
        "input_dtypes": ["Float"],
        "output_sizes": [[16]],
        "output_dtypes": ["Float"],
        "state": state,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
        "frames": [],
        "thread_id": "1",
        "thread_name": "main",
    }


class _Hostile:
    def __reduce__(self):
        return (Path.touch, (Path("/nonexistent-dir/never"),))


def test_torch_s_own_flight_recorder_dump_files_are_read_and_a_hostile_pickle_runs_nothing(
    tmp_path,
):
    # No flight recorder in the black boxes (Python wedged, or off); torch's watchdog wrote its
    # dumps beside the logs.
    for rank in range(3):
        write_rank(
            tmp_path,
            rank,
            3,
            [
                ("span", "all_reduce" if rank != 1 else "data_fetch", 3),
                ("stall", {"threads": frames("main", 80 if rank != 1 else 34)}),
            ],
        )
        last = 3 if rank != 1 else 2
        entries = [
            _torch_entry("0", seq, "completed" if seq < 3 else "scheduled", seq - 1)
            for seq in range(1, last + 1)
        ]
        dump = {
            "version": "2.10",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
            "pg_status": {},
            "entries": entries,
        }
        (tmp_path / f"fr_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    (tmp_path / "structured_logs" / "evil_rank_7").write_bytes(pickle.dumps(_Hostile()))
    report = summarize_run(tmp_path).hang
    assert [(s.rank, s.rule) for s in report.suspects] == [(1, "behind")]
    assert (
        "torch flight-recorder dump fr_trace_rank_1"
        in next(p for p in report.places if p.rank == 1).evidence
    )


# -- item 3: ranks that never reached init ---------------------------------------------------------
def test_ranks_with_no_file_are_listed_missing_first_in_the_headline_the_hang_section_and_json(
    tmp_path,
):
    culprit = write_hang_run(tmp_path, "world", 3, "before_init", "on", seed=0)
    assert culprit == 1
    summary = summarize_run(tmp_path)
    lines = format_summary(summary).splitlines()
    assert lines[0].startswith(
        "Hang: 3 of 3 processes did not finish: 1 missing (no file), 2 stalled"
    )
    assert lines[1] == " ▶ 1 × training rank 1: missing: no file (world_size 3)"
    assert lines[lines.index("Suspects:") + 1].startswith(
        "  rank 1 (training): no stack: no file: never reached init_structured_logger"
    )
    summary_line = next(i for i, line in enumerate(lines) if line.startswith("Summary:"))
    assert (
        lines[summary_line] == "Summary: 2 of 3 processes on 1 host: 1 missing (no file), 2 stalled"
    )
    assert lines[summary_line + 2].startswith(
        "  ▶ missing: training rank 1: no file, of world_size 3"
    )
    data = json.loads(json.dumps(summary_json(summary), default=str))
    assert data["missing"] == [{"source": "training", "attempt": 0, "world_size": 3, "ranks": [1]}]
    assert (
        data["hang"]["suspects"][0]["rank"] == 1
        and data["hang"]["suspects"][0]["rule"] == "missing"
    )
    assert data["headline"]["missing"] == 1 and data["headline"]["diagnosis"][0].startswith(
        "missing: training rank 1"
    )
    assert suspects(tmp_path, summarize_tails) == [1]
    # Asked for some ranks only: only those can be missing.
    assert summarize_run(tmp_path, ranks=[0, 2]).missing == []


# -- item 4: --tail reads the black boxes ----------------------------------------------------------
def test_summarize_tail_reads_the_black_boxes_and_names_the_same_suspects_as_a_full_read(tmp_path):
    for rank in range(3):
        hung = rank in (1, 2)
        script: list[tuple] = []
        for step in range(1, 9):  # enough steps that the tail is not the whole file
            script += [
                ("span", "data_fetch", step),
                ("end",),
                ("span", "all_reduce", step),
                ("end",),
            ]
        script += [("span", "data_fetch", 9)] + (
            [] if hung else [("end",), ("span", "all_reduce", 9)]
        )
        entries = [fr_entry("0", s) for s in range(1, 9)] + (
            [] if hung else [fr_entry("0", 9, state="scheduled")]
        )
        script += [
            (
                "stall",
                {
                    "threads": frames("read_shard" if hung else "main", 34 if hung else 80),
                    "flight_recorder": {"entries": entries},
                },
            )
        ]
        write_rank(tmp_path, rank, 3, script)
    assert suspects(tmp_path) == [1, 2]
    assert suspects(tmp_path, summarize_tails) == [1, 2]
    tail = head(tmp_path, summarize_tails)
    assert "no black box" not in tail and "black box from 3 of 3" in tail
    assert "rank 0 (training)" not in tail.split("Suspects:")[1]


# -- item 6: a stall that progress ended is history ------------------------------------------------
def _recovered(run: Path, closed: bool) -> None:
    script: list[tuple] = []
    for step in range(1, 4):
        script += [("span", "eval", step), ("wait", 1.6)]
        if step == 2:
            script += [("stall", {"threads": frames("evaluate", 12), "reason": "stall"})]
        script += [("end",), ("span", "step", step), ("end",)]
    if not closed:
        # a later hang, whose watchdog wrote nothing (its budget, or SIGKILL)
        script += [("span", "read_shard", 4)]
    write_rank(run, 0, 1, script, closed=closed)


def test_a_run_that_recovered_from_a_stall_and_closed_has_no_hang_section_and_says_the_stall_ended(
    tmp_path,
):
    _recovered(tmp_path, closed=True)
    summary = summarize_run(tmp_path)
    assert summary.hang is None
    text = format_summary(summary)
    assert "Hang:" not in text
    assert (
        "Stalls that ended (the process resumed: history, not a hang): 1" in text
        and "in eval at step 2, then resumed" in text
    )
    assert summarize_tails(tmp_path).hang is None


def test_a_stall_that_progress_ended_never_gives_the_frame_of_a_later_hang(tmp_path):
    _recovered(tmp_path, closed=False)
    report = summarize_run(tmp_path).hang
    (place,) = report.places
    assert place.span == "read_shard" and place.where is None and place.evidence == "records only"
    assert "evaluate" not in "\n".join(format_summary(summarize_run(tmp_path)).splitlines()[:8])
    assert len(report.history) == 1


# -- item 8: nesting from parent ids; one vocabulary -----------------------------------------------
def test_the_innermost_open_span_comes_from_parent_ids_even_when_parent_and_child_start_in_the_same_microsecond(
    tmp_path,
):
    for rank in range(3):
        script: list[tuple] = [("span", "step", 1), ("end",), ("span", "step", 2)]
        script += (
            [("same",), ("span", "data_fetch", 2)]
            if rank == 1
            else [("span", "data_fetch", 2), ("end",), ("span", "all_reduce", 2)]
        )
        write_rank(tmp_path, rank, 3, script + [("heartbeat",)])
    summary = summarize_run(tmp_path)
    hung = next(p for p in summary.processes if p.rank == 1)
    assert hung.open_spans[0].start_us == hung.open_spans[1].start_us  # the same µs
    assert hung.last_phase == "data_fetch" and hung.open_spans[-1].path == ["step", "data_fetch"]
    text = format_summary(summary)
    assert "inside step > data_fetch  (training rank 1)" in text and "inside step  (" not in text
    assert " ▶ 1 × rank 1: span data_fetch" in text


def test_no_none_in_the_reasons_and_one_vocabulary_for_states(tmp_path):
    # Three stuck ranks with no step, frame or flight recorder: the odd one out of the span
    # majority.
    for rank in range(3):
        write_rank(
            tmp_path,
            rank,
            3,
            [("span", "data_fetch" if rank == 2 else "all_reduce", None), ("heartbeat",)],
        )
    text = format_summary(summarize_run(tmp_path))
    assert "None" not in text.split("Run ")[0]
    assert (
        "rank 2 (training): frame unknown in span data_fetch: elsewhere than the 2 others (in "
        "all_reduce)" in text
    )
    hang_line = text.splitlines()[0]
    summary_line = next(line for line in text.splitlines() if line.startswith("Summary:"))
    assert hang_line.startswith(
        "Hang: 3 of 3 processes did not finish: 3 stalled;"
    ) and summary_line.endswith(": 3 stalled")


def test_worker_processes_give_the_same_hang_verdict(tmp_path):
    culprit = write_hang_run(tmp_path, "pp", 8, "p2p", "on", seed=2)
    one, two = (
        summarize_run(tmp_path, cache=False).hang,
        summarize_run(tmp_path, jobs=2, cache=False).hang,
    )
    assert [(s.rank, s.why) for s in two.suspects] == [(s.rank, s.why) for s in one.suspects] and [
        s.rank for s in one.suspects
    ] == [culprit]


@pytest.mark.parametrize("recorder", ["on", "legacy"])
def test_the_json_form_of_the_hang_section_serialises_and_carries_the_verdict(tmp_path, recorder):
    write_hang_run(tmp_path, "tp", 8, "subgroup", recorder)
    hang = json.loads(json.dumps(summarize_run(tmp_path).to_dict()))["hang"]
    assert hang["verdict"] == "named" and hang["suspects"][0]["rule"] in (
        "behind",
        "behind in step",
    )
    assert "fr" not in hang["places"][0]  # the digest is compared, not shipped


# -- no evidence of a hang, no name ----------------------------------------------------------------
def _killed_mid_step(run: Path, trigger: bool) -> None:
    """8 healthy ranks stopped at once in step 4 (SIGKILL, a scheduler's cancel): each a few ms from
    the others."""
    for rank in range(8):
        script: list[tuple] = []
        for step in range(1, 4):
            script += [
                ("span", "data_fetch", step),
                ("end",),
                ("span", "all_reduce", step),
                ("end",),
            ]
        ahead = rank % 3 != 0
        script += [("span", "data_fetch", 4)] + (
            [("end",), ("span", "all_reduce", 4)] if ahead else []
        )
        if trigger:  # an on-demand black box of the live run (OTEL_TITAN_DUMP_TRIGGER): where each rank is, not a stall
            entries = [fr_entry("0", s) for s in range(1, 4)] + (
                [fr_entry("0", 4, state="scheduled")] if ahead else []
            )
            script += [
                (
                    "stall",
                    {
                        "reason": "trigger",
                        "threads": frames("main", 80),
                        "flight_recorder": {"entries": entries},
                    },
                )
            ]
        write_rank(run, rank, 8, script)


@pytest.mark.parametrize("trigger", [False, True])
def test_a_healthy_run_killed_mid_step_names_no_one(tmp_path, trigger):
    _killed_mid_step(tmp_path, trigger)
    for reader in (summarize_run, summarize_tails):
        report = reader(tmp_path).hang
        assert report.suspects == [] and report.verdict == "cannot tell", [
            (s.rank, s.why) for s in report.suspects
        ]
    assert "Suspects: cannot tell" in head(tmp_path)


def test_a_crashed_rank_is_named_when_the_launcher_then_stopped_the_others_and_not_when_the_whole_job_was_killed(
    tmp_path,
):
    steps = [("span", "data_fetch", 1), ("end",), ("span", "all_reduce", 1)]
    for rank in range(3):
        write_rank(
            tmp_path / "agent",
            rank,
            3,
            steps + ([] if rank == 1 else [("signal",)]),
            torn=rank == 1,
        )
        # every rank killed at once; one was writing
        write_rank(tmp_path / "sigkill", rank, 3, steps, torn=rank == 1)
    (crashed,) = summarize_run(tmp_path / "agent", log_skipped=False).hang.suspects
    assert (crashed.rank, crashed.rule) == (1, "crashed") and crashed.why.startswith(
        "failed first: killed (its file ends mid-line; no closing or signal record; "
        "the others were terminated by a signal after its last record)"
    ), crashed.why
    assert crashed.why.endswith("; ranks 0,2 stopped after it (its victims)"), crashed.why
    assert summarize_run(tmp_path / "sigkill", log_skipped=False).hang.suspects == []


def test_the_rank_whose_exception_came_first_is_named_and_the_ranks_whose_collective_then_failed_are_its_victims(
    tmp_path,
):
    for rank in range(3):
        if rank == 1:  # a CUDA error in fwd at step 2
            script = [
                ("span", "fwd", 1),
                ("end",),
                ("span", "all_reduce", 1),
                ("end",),
                ("span", "fwd", 2),
                ("raise", "RuntimeError", "CUDA error: an illegal memory access"),
            ]
        else:  # gloo fails their all_reduce once it is gone
            script = [
                ("span", "fwd", 1),
                ("end",),
                ("span", "all_reduce", 1),
                ("end",),
                ("span", "fwd", 2),
                ("end",),
                ("span", "all_reduce", 2),
                ("wait", 0.5),
                ("raise", "RuntimeError", "Connection reset by peer"),
            ]
        # the exit hook closes the file after the exception
        write_rank(tmp_path, rank, 3, script, closed=True)
    for reader in (summarize_run, summarize_tails):
        summary = reader(tmp_path, log_skipped=False)
        assert [(s.rank, s.rule) for s in summary.hang.suspects] == [(1, "crashed")], [
            (s.rank, s.why) for s in summary.hang.suspects
        ]
        assert summary.hang.suspects[0].why == (
            "failed first: RuntimeError: CUDA error: an illegal memory access at train.py:88 in "
            "step_fn, inside span fwd, step 2; "
            "ranks 0,2 stopped after it (its victims)"
        )
        assert {p.rank: p.state(0) for p in summary.processes} == {
            0: "crashed",
            1: "crashed",
            2: "crashed",
        }
    text = head(tmp_path)
    assert (
        "▶ crashed after it: training ranks 0,2 (RuntimeError: Connection reset by peer at "
        "train.py:88 in step_fn, inside span all_reduce, …)" in text
    ), text


def test_a_silent_kill_is_found_when_its_peers_then_fail_between_spans_in_a_collective_with_no_span(
    tmp_path,
):
    """The matrix's loop without a collective span (issue 26, E): rank 0 is SIGKILLed in fwd; ranks
    1-2 finish fwd_bwd and fail in the all-reduce between spans. They failed after spans it never
    entered: it was killed, they are its victims (both read the first crash, a victim's, as the
    culprit's)."""
    for rank in range(3):
        script = [("span", "data_fetch", 1), ("end",), ("span", "fwd_bwd", 1), ("span", "fwd", 1)]
        if rank:
            script += [
                ("end",),
                ("span", "bwd", 1),
                ("end",),
                ("end",),
                ("wait", 0.5 + rank / 1000),
                ("raise", "RuntimeError", "Connection closed by peer", 1),
            ]
        write_rank(tmp_path, rank, 3, script, closed=rank != 0)
    for reader in (summarize_run, summarize_tails):
        (crashed,) = reader(tmp_path, log_skipped=False).hang.suspects
        assert (crashed.rank, crashed.rule) == (0, "crashed") and crashed.why.startswith(
            "failed first: killed"
        ), (crashed.rank, crashed.why)
    from otel_titan.analysis.watch.loop import Watch

    _, events = Watch(str(tmp_path)).refresh()
    (alert,) = [e for e in events if e["kind"] == "crashed"]
    assert alert["ranks"] == [0] and "ranks 1-2 stopped after it (victims)" in alert["message"], (
        alert
    )


def test_ctrl_c_on_a_hung_job_keeps_the_interrupted_rank_where_it_was_for_watch_as_for_summarize(
    tmp_path,
):
    """Item 5 on `watch`: the hung rank gets KeyboardInterrupt (its span ends with it), the others,
    stuck in the collective, ignore it. `watch` named rank 1, then, once Ctrl-C had ended its span,
    updated the alert to "every process waits in all_reduce; the culprit cannot be told"."""
    from otel_titan.analysis.watch.replay import replay

    for rank in range(3):
        if rank == 1:
            script = [
                ("span", "data_fetch", 1),
                ("end",),
                ("span", "all_reduce", 1),
                ("end",),
                ("span", "data_fetch", 2),
                ("stall", {"threads": frames("read_shard")}),
                ("heartbeat",),
                ("wait", 10),
                ("raise", "KeyboardInterrupt", ""),
            ]
        else:
            script = [
                ("span", "data_fetch", 1),
                ("end",),
                ("span", "all_reduce", 1),
                ("end",),
                ("span", "data_fetch", 2),
                ("end",),
                ("span", "all_reduce", 2),
                ("stall", {"threads": frames("all_reduce", 80)}),
                ("heartbeat",),
            ]
        write_rank(tmp_path, rank, 3, script, closed=rank == 1)
    assert suspects(tmp_path) == [1]
    latest = {}
    for event in replay(str(tmp_path), tail_s=120.0).events:
        if event["type"] in ("alert", "update"):
            latest[event["id"]] = event
    hangs = [e for e in latest.values() if e["kind"] == "hang"]
    assert [h["ranks"] for h in hangs] == [[1]] and "data_fetch" in hangs[0]["message"], [
        h["message"] for h in hangs
    ]


@pytest.mark.parametrize("spanned_barrier", [False, True])
@pytest.mark.parametrize("minutes", [0, 6])
def test_a_rank_zero_only_checkpoint_is_a_pause_until_it_lasts_longer_than_allowed(
    tmp_path, spanned_barrier, minutes
):
    """Item 14 in `summarize`: ``if rank == 0: save(); dist.barrier()``. The others wait (in an
    unspanned barrier: between spans) for rank 0's first checkpoint, a span they never run.
    `summarize` blamed the waiters ("behind in the step": they never entered checkpoint) or rank 0
    at once ("odd one out"); `watch` gives it a pause's patience (`model.hang.own_work`). Now the
    same rule: a pause, no one named, until it has lasted the allowance (300 s); then rank 0."""
    for rank in range(4):
        script: list[tuple] = []
        for step in (1, 2):
            script += [("span", "fwd", step), ("end",), ("span", "all_reduce", step), ("end",)]
        script += [("span", "fwd", 3), ("end",)]
        if rank == 0:
            script += [
                ("span", "checkpoint", 3),
                ("wait", minutes * 60),
                ("stall", {"threads": frames("save", 50)}),
                ("heartbeat",),
            ]
        elif spanned_barrier:
            script += [
                ("span", "barrier", 3),
                ("wait", minutes * 60),
                ("stall", {"threads": frames("barrier", 60)}),
                ("heartbeat",),
            ]
        else:
            script += [
                ("wait", minutes * 60),
                (
                    "stall",
                    {
                        "threads": frames("barrier", 60),
                        "where": "between_spans",
                        "step": 3,
                        "last_span": {"name": "fwd", "ended_s_ago": 3.0},
                    },
                ),
            ]
        write_rank(tmp_path, rank, 4, script)
    for reader in (summarize_run, summarize_tails):
        hang = reader(tmp_path, log_skipped=False).hang
        if minutes:
            assert [s.rank for s in hang.suspects] == [0], [(s.rank, s.why) for s in hang.suspects]
        else:
            assert hang.suspects == [] and any(
                n.startswith(
                    "a pause, not a hang: training rank 0 in checkpoint, a span only it runs, for "
                    "10 s; 3 ranks wait for it"
                )
                for n in hang.notes
            ), ([(s.rank, s.why) for s in hang.suspects], hang.notes)


def test_after_an_uncaught_exception_json_never_says_closed_cleanly(tmp_path):
    """Item 2 (brief b): the exit hook writes the closing record after the exception; `--json` said
    ``closed_cleanly: true`` of every crashed process. The crash wins; whether the closing record
    was written stays in ``closing_record``."""
    for rank in range(2):
        script = [
            ("span", "fwd", 1),
            ("end",),
            ("span", "all_reduce", 1),
            ("end",),
            ("span", "fwd", 2),
        ]
        script += (
            [("raise", "RuntimeError", "CUDA out of memory")]
            if rank == 1
            else [
                ("end",),
                ("span", "all_reduce", 2),
                ("wait", 0.5),
                ("raise", "RuntimeError", "Connection reset by peer"),
            ]
        )
        write_rank(tmp_path, rank, 2, script, closed=True)
    document = json.loads(json.dumps(summary_json(summarize_run(tmp_path, log_skipped=False))))
    assert [
        (p["rank"], p["state"], p["closed_cleanly"], p["closing_record"])
        for p in document["processes"]
    ] == [(0, "crashed", False, True), (1, "crashed", False, True)]
    text = format_summary(summarize_run(tmp_path, log_skipped=False))
    table = text.split("\nProcesses\n")[1].split("\n\n")[0]
    assert "yes" not in table and table.count("after RuntimeError") == 2, table


@pytest.mark.parametrize("stuck", [True, False])
def test_watch_once_after_torchrun_terminated_a_hung_job_names_the_culprit_and_none_of_a_job_cancelled_at_once(
    tmp_path, stuck
):
    """A hang that torchrun's agent then SIGTERMed (after the watchdog's timeout): `watch --once`
    run afterwards said only "training ranks 0-2 terminated"; `summarize` names rank 1. A healthy
    job cancelled at once still names no one."""
    import os

    from otel_titan.analysis.watch.loop import Watch

    paths = []
    for rank in range(3):
        script = [
            ("span", "data_fetch", 1),
            ("end",),
            ("span", "all_reduce", 1),
            ("end",),
            ("span", "data_fetch", 2),
        ]
        if rank != 1:
            script += [("end",), ("span", "all_reduce", 2)]
        if stuck:
            script += [
                (
                    "stall",
                    {
                        "threads": frames(
                            "read_shard" if rank == 1 else "all_reduce", 34 if rank == 1 else 80
                        )
                    },
                ),
                ("heartbeat",),
                ("wait", 30),
            ]
        paths.append(write_rank(tmp_path, rank, 3, script + [("signal",)]))
    last = 0.0
    for path in paths:  # written long ago: a cron's health check
        written = max(json.loads(line)["time_us"] for line in path.read_text().splitlines()) / 1e6
        os.utime(path, (written, written))
        last = max(last, written)
    _, events = Watch(str(tmp_path), clock=lambda: last + 600.0).refresh()
    hangs = [e for e in events if e["type"] == "alert" and e["kind"] == "hang"]
    assert suspects(tmp_path) == ([1] if stuck else [])
    assert [h["ranks"] for h in hangs] == ([[1]] if stuck else []), [h["message"] for h in hangs]


def test_a_collective_that_timed_out_names_the_rank_it_waited_for_not_the_ranks_that_raised(
    tmp_path,
):
    """The ranks that waited raise (a collective's timeout), the one they waited for is still stuck
    before it: it is the one."""
    for rank in range(3):
        if rank == 1:
            script = [
                ("span", "data_fetch", 1),
                ("end",),
                ("span", "all_reduce", 1),
                ("end",),
                ("span", "data_fetch", 2),
                ("heartbeat",),
                ("heartbeat",),
                ("heartbeat",),
                ("heartbeat",),
            ]
        else:
            script = [
                ("span", "data_fetch", 1),
                ("end",),
                ("span", "all_reduce", 1),
                ("end",),
                ("span", "data_fetch", 2),
                ("end",),
                ("span", "all_reduce", 2),
                ("wait", 30),
                (
                    "raise",
                    "RuntimeError",
                    "[gloo] Timed out waiting 30000ms for recv operation to complete",
                ),
            ]
        write_rank(tmp_path, rank, 3, script, closed=rank != 1)
    for reader in (summarize_run, summarize_tails):
        (suspect,) = reader(tmp_path, log_skipped=False).hang.suspects
        assert (
            (suspect.rank, suspect.rule) == (1, "behind in step")
            and "crashed after its last record, in all_reduce at step 2, which it never reached"
            in suspect.why
        ), suspect.why
    from otel_titan.analysis.watch.loop import (
        Watch,  # watch, on the same files, by the same rule (model.ending.held_back_by)
    )

    _, events = Watch(str(tmp_path)).refresh()
    (crashed,) = [e for e in events if e["kind"] == "crashed"]
    assert (
        crashed["ranks"] == [0, 2]
        and "they waited for rank 1, which never reached all_reduce at step 2: look at it first"
        in crashed["message"]
    ), crashed


def test_a_live_run_making_progress_has_no_hang_section(tmp_path):
    import time

    now = int(time.time() * 1e6)
    for rank in range(2):
        path = write_rank(
            tmp_path, rank, 2, [("span", "data_fetch", 1), ("end",), ("span", "all_reduce", 1)]
        )
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text(
            "".join(
                json.dumps({**r, "time_us": r["time_us"] - T0 + now - 5_000}) + "\n" for r in lines
            )
        )
    summary = summarize_run(tmp_path)
    assert {p.state(time.time() * 1e6) for p in summary.processes} == {"running"}
    assert summary.hang is None and "Hang:" not in format_summary(summary)


def test_a_restart_that_then_closed_has_no_hang_section_for_the_attempt_it_replaced(tmp_path):
    from tests.analysis.runs import rank_file

    for rank in range(2):
        # Attempt 0: stopped by torchrun mid-step (no close); attempt 1: ran to the end and closed.
        rank_file(
            tmp_path,
            rank,
            [10.0] * 4,
            phases={"fwd": [5.0] * 4},
            attempt=0,
            world_size=2,
            closed=False,
            run_id="r",
        )
        rank_file(
            tmp_path,
            rank,
            [10.0] * 4,
            phases={"fwd": [5.0] * 4},
            attempt=1,
            world_size=2,
            run_id="r",
            start_us=T0 + 10_000_000,
        )
    summary = summarize_run(tmp_path)
    assert summary.hang is None and summary.missing == []


def test_a_live_process_its_watchdog_found_stuck_is_stalled_everywhere_not_running(tmp_path):
    """Read while the hang is on (the usual case): heartbeats keep the files fresh, but the stall
    record is the latest news.

    The Hang section, the Summary line and the groups said "3 running" above a named culprit.
    """
    paths = [
        write_rank(
            tmp_path,
            rank,
            3,
            [
                ("span", "data_fetch", 3),
                ("stall", {"threads": frames("read_shard")}),
                ("heartbeat",),
            ]
            if rank == 2
            else [
                ("span", "data_fetch", 3),
                ("end",),
                ("span", "all_reduce", 3),
                ("stall", {}),
                ("heartbeat",),
            ],
        )
        for rank in range(3)
    ]
    shift = (
        int(time.time() * 1e6)
        - 2_000_000
        - max(
            json.loads(line)["time_us"] for path in paths for line in path.read_text().splitlines()
        )
    )
    for path in paths:  # written 2 s ago: alive, by the clock
        path.write_text(
            "".join(
                json.dumps({**json.loads(line), "time_us": json.loads(line)["time_us"] + shift})
                + "\n"
                for line in path.read_text().splitlines()
            )
        )
    for reader in (summarize_run, summarize_tails):
        summary = reader(tmp_path)
        text = format_summary(summary)
        assert [s.rank for s in summary.hang.suspects] == [2]
        summary_line = next(line for line in text.splitlines() if line.startswith("Summary:"))
        assert text.splitlines()[0].startswith(
            "Hang: 3 of 3 processes did not finish: 3 stalled;"
        ) and summary_line.endswith(": 3 stalled"), text
        assert "running" not in text.split("Processes")[0], text
    # A live process whose stall record progress followed is running again.
    path = paths[0]
    path.write_text(
        path.read_text()
        + json.dumps(
            {
                **json.loads(path.read_text().splitlines()[-1]),
                "log_type": "event",
                "log_type_name": "all_reduce_end",
                "seq_id": 99,
            }
        )
        + "\n"
    )
    assert "1 running" in next(
        line
        for line in format_summary(summarize_run(tmp_path)).splitlines()
        if line.startswith("Summary:")
    )


@pytest.mark.parametrize(
    "layout,world,fault",
    [
        ("world", 2, "span"),
        ("world", 2, "between"),
        ("world", 8, "between"),
        ("tp", 8, "subgroup"),
        ("pp", 8, "p2p"),
    ],
)
def test_the_reasons_count_ranks_as_a_person_writes_them(tmp_path, layout, world, fault):
    """ "which 1 rank(s) wait in", "where 63 other rank(s) are": one rank is a rank, several are
    ranks, and the verb agrees."""
    write_hang_run(tmp_path, layout, world, fault, "on")
    for reader in (summarize_run, summarize_tails):
        report = reader(tmp_path).hang
        said = [s.why for s in report.suspects] + list(report.notes)
        assert report.suspects and not any("(s)" in text or "(es)" in text for text in said), said
        assert not any(
            bad in text
            for text in said
            for bad in ("1 ranks", "1 other ranks", "1 rank wait ", "1 other rank are")
        ), said


def test_ranks_whose_logs_are_elsewhere_are_listed_missing_but_never_blamed_when_the_others_ran_steps_with_them(
    tmp_path,
):
    """One node's folder of a 64-rank job (node-local disks): 8 files, world_size 64.

    The 56 other ranks completed every step's collective with these 8, so none of them "never
    reached init": naming them (56 suspects, the real culprit listed among the victims) is wrong.
    They stay listed as missing, with why they are not blamed; the present ranks cannot be compared
    without them, so nobody is named.
    """
    culprit = write_hang_run(tmp_path, "world", 16, "span", "on", seed=1)
    kept = [r for r in range(16) if r // 8 == culprit // 8]
    for path in (tmp_path / "structured_logs").glob("*.jsonl"):
        if int(path.name.split("global_rank_")[1].split(".")[0]) not in kept:
            path.unlink()
    for reader in (summarize_run, summarize_tails):
        summary = reader(tmp_path)
        report = summary.hang
        assert [s.rank for s in report.suspects if s.rule == "missing"] == [], [
            (s.rank, s.rule) for s in report.suspects
        ]
        # the flight recorder shows it never entered what the others wait in
        assert {s.rank for s in report.suspects} <= {culprit}
        assert sum(len(m["ranks"]) for m in report.missing) == 8
    text = format_summary(summarize_run(tmp_path))
    assert (
        "took part in the steps" in text.split("Run ")[0]
        and "never reached init_structured_logger" not in text
    ), text[:3000]
    assert "look at" not in text.split("Run ")[0]
    # A rank that really never reached init: the others are stuck in their first step, waiting for
    # it.
    before = tmp_path / "before"
    culprit = write_hang_run(before, "world", 4, "before_init", "on")
    assert [(s.rank, s.rule) for s in summarize_run(before).hang.suspects] == [(culprit, "missing")]


def test_a_terminated_rank_whose_file_then_tore_is_terminated_not_the_crash_that_came_first(
    tmp_path: Path,
) -> None:
    """torchrun SIGTERMs every rank, then SIGKILLs one still writing after its grace period: its
    file holds its ``signal_received`` record and ends mid-line. It was stopped as its peers were;
    `summarize` called it ``crashed`` (the torn line decided before the signal) and named it the
    rank that died first, `watch` said ``terminated``."""
    from otel_titan.analysis.watch.replay import replay
    from tests.analysis.failure_runs import Case, write_failure_run

    run = tmp_path / "run"
    assert write_failure_run(run, Case("sigterm_healthy", world=3, seed=1)) is None
    files = sorted((run / "structured_logs").glob("*.jsonl"))
    assert all(b'"signal_received"' in path.read_bytes() for path in files)
    with open(files[2], "ab") as torn:
        torn.write(b'{"log_type_name": "heartbeat", "time_us": 17')  # killed mid-write
    summary = summarize_run(run, log_skipped=False)
    assert {p.rank: p.state(time.time() * 1e6) for p in summary.processes} == {
        0: "terminated (SIGTERM)",
        1: "terminated (SIGTERM)",
        2: "terminated (SIGTERM)",
    }
    assert summary.hang is None or summary.hang.suspects == [], summary.hang.suspects
    headline = format_summary(summary).split("Summary:")[1].split("Where the processes stopped")[0]
    assert "crashed" not in headline, headline
    result = replay(str(run), tail_s=30.0)
    assert not [e for e in result.events if e.get("kind") in ("crashed", "hang") and e["ranks"]]


def test_the_rank_whose_own_error_came_first_is_named_whatever_the_clocks_of_the_hosts_say(
    tmp_path: Path,
) -> None:
    """Rank 1 dies of a CUDA OOM; gloo fails its peers' collective within milliseconds (``Connection
    closed by peer``), as far apart as two hosts' clocks can be. Here rank 1's host runs 2 s ahead
    and no collective span lets the clocks be aligned: its crash reads as the last. Both
    `summarize` and `watch` named a victim, whose error came first on its clock; a crash whose error
    says a peer failed is the consequence of one that does not."""
    from otel_titan.analysis.watch.replay import replay
    from tests.analysis.failure_runs import Case, write_failure_run

    run = tmp_path / "run"
    case = Case("exception_in_span", loop="nospan", world=3, peers="fail", seed=0)
    assert write_failure_run(run, case) == 1
    (path,) = (run / "structured_logs").glob("*global_rank_1.*.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        record["time_us"] += 2_000_000
        record["host_name"] = "node-009"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    summary = summarize_run(run, log_skipped=False)
    crashed = [s for s in summary.hang.suspects if s.rule == "crashed"]
    assert [s.rank for s in crashed] == [1], summary.hang.suspects
    assert "CUDA out of memory" in crashed[0].why and "stopped after it" in crashed[0].why
    # The replay feeds the records in the order of their (skewed) times: the victims' errors come
    # first, then rank 1's, which renames the alert (live, its record comes first).
    result = replay(str(run), tail_s=30.0)
    latest = {}
    for event in result.events:
        if event.get("kind") == "crashed" and event["type"] in ("alert", "update"):
            latest[event["id"]] = event
    assert [a["ranks"] for a in latest.values()] == [[1]], list(latest.values())

"""Summaries of generated multi-rank runs with known faults (benchmarks/generate_run.py): diagnosis,
clocks, tails, export size."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis import format_summary, generate_gantt_trace, summarize_run
from otel_titan.analysis.export.checks import TraceTooBigError
from otel_titan.analysis.model.collect import summarize_tails
from otel_titan.analysis.model.headline import headline_data
from otel_titan.cli import main


def _first(text: str, count: int = 15) -> str:
    return "\n".join(text.splitlines()[:count])


def _run(tmp_path, name="run", **spec) -> tuple[str, dict]:
    out = str(tmp_path / name)
    return out, generate_run(out, RunSpec(**spec))


def test_hung_rank_and_phase_straggler_are_named_in_the_first_15_lines(tmp_path):
    run, truth = _run(
        tmp_path, ranks=64, steps=30, hung=(17, 25), straggler=(40, "bwd", 25.0), seed=3
    )
    summary = summarize_run(run, log_skipped=False)
    head = _first(format_summary(summary))
    # The waiting ranks' heartbeats (alive, in all_reduce) say they are stuck: the one behind them is
    # named, first.
    assert [s.rank for s in summary.hang.suspects] == [17]
    assert "hang suspect: training rank 17: behind in the step: in bwd at step 25" in head
    # the fact stays, below
    assert (
        "▶ 1 process: stalled at step 25, inside fwd_bwd > bwd  (training rank 17)"
        in format_summary(summary)
    )
    assert "straggler: training rank 40: last to arrive at all_reduce" in head and "bwd +2" in head
    assert "Processes" not in format_summary(summary)  # no row per process at 64 ranks ...
    assert "training rank 33 " in format_summary(summary, show_all=True)  # ... unless asked
    (group,) = summary.stragglers
    assert [row["rank"] for row in group.arrival_stragglers] == [40]
    assert group.last_arrivals[0]["rank"] == 40 and group.last_arrivals[0]["steps"] >= 12


def test_without_heartbeats_a_hang_is_not_told_from_a_job_killed_mid_step(tmp_path):
    """Files as a writer before heartbeats left them (no interval, no heartbeat) and no black box:
    nothing says the ranks were stuck rather than killed mid-step, so the Hang section names no one,
    and "Look first at" does not contradict it by blaming the odd group."""
    run, _ = _run(tmp_path, ranks=64, steps=30, hung=(17, 25), seed=3, heartbeat_s=None)
    summary = summarize_run(run, log_skipped=False)
    head = _first(format_summary(summary))
    assert summary.hang.suspects == [] and summary.hang.verdict == "cannot tell"
    assert (
        "look at training rank 17 first" not in head
        and "hang: cannot tell who holds the others up: no process is stuck on the evidence" in head
    )
    assert (
        "▶ 1 process: stalled at step 25, inside fwd_bwd > bwd  (training rank 17)"
        in format_summary(summary)
    )


def test_a_healthy_job_killed_mid_step_has_no_rank_to_look_at_first(tmp_path):
    """A scheduler SIGKILLs a healthy 64-rank job at one instant: each rank stops wherever it was
    (fwd, bwd, between).

    Nothing says any rank was stuck, so the Hang section cannot tell; the headline must not then
    blame the ranks that happened to be in a smaller group ("→ look at … first" named 27 innocent
    ranks).
    """
    run, _ = _run(tmp_path, ranks=64, steps=20, seed=0)
    files = sorted(glob.glob(os.path.join(run, "structured_logs", "*.jsonl")))
    first = [json.loads(line) for line in open(files[0], encoding="utf-8")]
    # near fwd's end
    cut = (
        next(
            r["time_us"] for r in first if r["log_type_name"] == "fwd_start" and r.get("step") == 15
        )
        + 30_000
    )
    for path in files:
        kept = [line for line in open(path, encoding="utf-8") if json.loads(line)["time_us"] <= cut]
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(kept)
    summary = summarize_run(run, log_skipped=False)
    data = headline_data(summary)
    # the ranks did stop in different places
    assert len([g for g in data["groups"] if g["differs"]]) >= 1
    assert summary.hang is not None and summary.hang.suspects == []
    assert not any("look at" in line for line in data["diagnosis"]), data["diagnosis"]
    assert [line for line in data["diagnosis"] if line.startswith("hang: cannot tell who")] == [
        data["diagnosis"][0]
    ]


def test_crashed_rank_is_named_with_its_torn_line(tmp_path):
    run, _ = _run(tmp_path, ranks=32, steps=20, crashed=(9, 14), seed=4)
    summary = summarize_run(run, log_skipped=False)
    head = _first(format_summary(summary))
    assert (
        "▶ crashed: training rank 9: killed (its file ends mid-line; no closing or signal record; "
        "the others were terminated by a signal after its last record), "
        "inside span fwd, step 14; ranks 0-8,10-31 stopped after it (its victims)" in head
    ), head
    assert "31 terminated (SIGTERM)" in head
    assert summary.skipped_lines == 1  # the torn line, counted


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_clean_runs_with_noise_and_offsets_report_no_straggler(tmp_path, seed):
    run, _ = _run(tmp_path, ranks=64, steps=30, seed=seed, noise=0.05, offset_ms=5.0)
    summary = summarize_run(run, log_skipped=False)
    (group,) = summary.stragglers
    assert (
        group.straggler_ranks == []
        and group.phase_stragglers == []
        and group.arrival_stragglers == []
    )
    assert group.arrival_collective == "all_reduce"
    data = headline_data(summary)
    assert data["diagnosis"] == [] and data["states"] == {"closed": 64}
    assert "64 processes: closed at step 30, after training_end" in _first(format_summary(summary))


def test_without_alignment_arrivals_are_still_judged_on_each_ranks_own_clock(tmp_path):
    """Clocks 100 ms apart, --no-align: each rank's arrival is measured from its own exit of the
    previous collective, so no host looks late."""
    run, truth = _run(tmp_path, ranks=64, steps=30, seed=5, offset_ms=100.0)
    aligned = summarize_run(run, log_skipped=False)
    raw = summarize_run(run, log_skipped=False, align=False)
    assert raw.clock.applied is False and raw.clock.reason == "turned off (--no-align)"
    offsets = truth["host_offsets_us"]
    # the clocks furthest ahead
    ahead = {host for host, offset in offsets.items() if offset > max(offsets.values()) - 5000}
    for group in (aligned.stragglers[0], raw.stragglers[0]):
        assert (
            group.arrival_collective == "all_reduce"
            and group.arrival_stragglers == []
            and group.findings == []
        )
        on_those_hosts = sum(
            row["steps"] for row in group.last_arrivals if truth["rank_host"][row["rank"]] in ahead
        )
        assert on_those_hosts < sum(row["steps"] for row in group.last_arrivals) / 2
    # the same evidence: no clock compared with another
    assert raw.stragglers[0].last_arrivals == aligned.stragglers[0].last_arrivals


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_injected_clock_offsets_are_recovered_within_0_2_ms_at_p95(tmp_path, seed):
    run, truth = _run(
        tmp_path, ranks=128, steps=30, seed=seed, offset_ms=5.0, straggler=(5, "bwd", 30.0)
    )
    clock = summarize_run(run, log_skipped=False).clock
    assert clock.applied and clock.anchor == "all_reduce" and clock.hosts == 16
    injected = truth["host_offsets_us"]
    errors = np.array([clock.offsets_us[host] - injected[host] for host in injected])
    errors -= np.median(errors)  # only differences between clocks can be known
    assert np.percentile(np.abs(errors), 95) <= 200.0, errors


def test_restart_attempts_are_kept_apart(tmp_path):
    run, _ = _run(tmp_path, ranks=16, steps=30, restart=(3, 17), seed=6)
    summary = summarize_run(run, log_skipped=False)
    data = headline_data(summary)
    assert data["attempts"] == [0, 1]
    assert [(g["attempt"], g["state"], g["step"], g["count"]) for g in data["groups"]] == [
        (0, "terminated (SIGTERM)", 17, 15),
        (0, "crashed", 17, 1),
        (1, "closed", 30, 16),
    ]
    assert [(g.attempt, len(g.ranks)) for g in summary.stragglers] == [(0, 16), (1, 16)]
    head = _first(format_summary(summary))
    assert (
        "2 attempts (restarts: 0, 1)" in head
        and "crashed: training rank 3 (attempt 0): killed (its file ends mid-line" in head
        and "inside span fwd, step 17" in head
    ), head


def test_two_runs_in_one_folder_are_never_mixed(tmp_path):
    out = str(tmp_path / "mixed")
    generate_run(
        out, RunSpec(ranks=16, steps=10, run_id="first", seed=1, start_us=1_796_000_000_000_000)
    )
    generate_run(
        out, RunSpec(ranks=16, steps=12, run_id="second", seed=2, start_us=1_796_000_100_000_000)
    )
    latest = summarize_run(out, log_skipped=False)
    assert (
        latest.run_id == "second"
        and {p.run_id for p in latest.processes} == {"second"}
        and len(latest.processes) == 16
    )
    assert [r.run_id for r in latest.runs] == ["first", "second"]
    first = summarize_run(out, run_id="first", log_skipped=False)
    assert {p.last_step for p in first.processes} == {10}


@pytest.mark.parametrize(
    "fault", [{"hung": (7, 12)}, {"crashed": (7, 12)}, {"restart": (7, 12)}, {}]
)
def test_tails_agree_with_a_full_read(tmp_path, fault):
    run, _ = _run(tmp_path, ranks=16, steps=20, seed=8, **fault)
    full = summarize_run(run, log_skipped=False, align=False)
    tail = summarize_tails(run, log_skipped=False)

    def keys(s):
        return [
            (
                p.label,
                p.attempt,
                p.last_step,
                p.last_event,
                p.last_event_us,
                p.closed_cleanly,
                p.signal,
                p.torn_last_line,
                p.hang_suspect,
                p.state(0),
                [o.path for o in p.open_spans],
            )
            for p in s.processes
        ]

    assert keys(tail) == keys(full)
    assert headline_data(tail, 0)["groups"] == headline_data(full, 0)["groups"]
    assert (
        tail.tail_only
        and sum(
            os.path.getsize(os.path.join(run, "structured_logs", f))
            for f in os.listdir(os.path.join(run, "structured_logs"))
        )
        > 4 * 64 * 1024
    )


def test_a_rank_that_logged_nothing_is_found_by_the_tail_reader(tmp_path):
    run, _ = _run(tmp_path, ranks=16, steps=10, seed=9)
    log_dir = os.path.join(run, "structured_logs")
    name = next(n for n in os.listdir(log_dir) if ".global_rank_4." in n)
    with open(os.path.join(log_dir, name), "rb") as handle:
        opened = handle.readline()
    with open(os.path.join(log_dir, name), "wb") as handle:
        handle.write(opened)
    tail = summarize_tails(run, log_skipped=False)
    assert tail.hang_suspects == ["training rank 4"]
    assert (
        "logged nothing since its file was created (hung or died before its first record): "
        "training rank 4" in _first(format_summary(tail))
    )


def test_export_refuses_a_trace_too_big_for_perfetto_and_proposes_a_window(tmp_path, capsys):
    run, _ = _run(tmp_path, ranks=16, steps=20, seed=10)
    output = str(tmp_path / "trace.json")
    with pytest.raises(
        TraceTooBigError,
        match=r"Export a window instead: --steps \d+:20 .* or --ranks 0-\d+ .*; or --force",
    ):
        generate_gantt_trace(run, output, max_output_bytes=200_000, log_skipped=False)
    assert not os.path.exists(output) and os.listdir(tmp_path) == ["run"]
    # the window proposed fits
    stats = generate_gantt_trace(
        run, output, max_output_bytes=200_000, steps="16:20", log_skipped=False
    )
    assert stats.output_bytes < 200_000
    assert main(["export", run, "-o", output, "--force"]) == 0
    other = json.loads(open(output, "rb").read())["otherData"]
    assert (
        other["clock_alignment"]["applied"] and other["clock_alignment"]["anchor"] == "all_reduce"
    )
    assert "clocks: aligned on the end of all_reduce" in capsys.readouterr().out


def test_export_aligns_every_host_on_the_collective(tmp_path):
    run, _ = _run(tmp_path, ranks=32, steps=10, seed=11, offset_ms=10.0)
    output = str(tmp_path / "trace.json")
    generate_gantt_trace(run, output, log_skipped=False)
    events = json.loads(open(output, "rb").read())["traceEvents"]
    ends: dict[int, list[float]] = {}
    for event in events:
        if event.get("name") == "all_reduce" and event.get("ph") == "X":
            ends.setdefault(event["args"]["step"], []).append(event["ts"] + event["dur"])
    spread = max(max(v) - min(v) for v in ends.values())
    assert spread < 500, spread  # 10 ms apart on the raw clocks
    assert main(["export", run, "-o", output, "--no-align"]) == 0
    trace = json.loads(open(output, "rb").read())
    assert trace["otherData"]["clock_alignment"]["applied"] is False
    raw: dict[int, list[float]] = {}
    for event in trace["traceEvents"]:
        if event.get("name") == "all_reduce" and event.get("ph") == "X":
            raw.setdefault(event["args"]["step"], []).append(event["ts"] + event["dur"])
    assert max(max(v) - min(v) for v in raw.values()) > 5000


def test_the_summary_on_two_workers_is_the_summary_in_one_process(tmp_path):
    run, _ = _run(
        tmp_path, ranks=24, steps=20, seed=12, crashed=(5, 15), straggler=(7, "bwd", 30.0)
    )
    one = summarize_run(run, log_skipped=False, jobs=1, cache=False).to_dict()
    two = summarize_run(run, log_skipped=False, jobs=2, cache=False).to_dict()
    for data in (one, two):
        data.pop("last_record_s_before_now")
        for process in data["processes"]:
            process.pop("created_s_before_now")
    assert one == two and one["skipped_lines"] == 1


def _odd_lines(run: str) -> None:
    """What real files hold besides clean records: torn, NaN and lone-surrogate lines,
    torchtitan-style files without span ids, a rotated segment, a NUL tail, a torn last line."""
    files = sorted(glob.glob(os.path.join(run, "structured_logs", "*.jsonl")))
    for index, path in enumerate(files):
        lines = open(path, "rb").read().splitlines()
        odd = []
        for number, line in enumerate(lines):
            if number % 97 == 13:
                odd.append(line[: len(line) // 2])  # torn
            elif number % 89 == 7:
                # a lone surrogate, kept escaped
                odd.append(line.replace(b'"event_name":null', b'"event_name":"x\\ud800"'))
            elif number % 83 == 5:
                # torchtitan's bare NaN
                odd.append(line.replace(b'"log_level"', b'"ratio":NaN,"log_level"'))
            else:
                odd.append(line)
        if index % 3 == 0:  # torchtitan's files: no span ids, spans paired per lane
            odd = [
                line.replace(b'"span_id"', b'"no_span_id"').replace(
                    b'"parent_span_id"', b'"no_parent_span_id"'
                )
                for line in odd
            ]
        if index % 4 == 1:  # rotated: the first half in the older segment
            half = len(odd) // 2
            with open(path + ".1", "wb") as handle:
                handle.write(b"\n".join(odd[:half]) + b"\n")
            odd = odd[half:]
        data = b"\n".join(odd) + b"\n"
        data = data + b"\0" * 64 if index % 5 == 2 else data[:-30] if index % 5 == 3 else data
        with open(path, "wb") as handle:
            handle.write(data)


def _outputs(run: str, out: str) -> dict[str, object]:
    summary = summarize_run(run, log_skipped=False)
    data = summary.to_dict(now_us=2e15)
    trace, native = os.path.join(out, "trace.json"), os.path.join(out, "trace.pftrace")
    generate_gantt_trace(run, trace, log_skipped=False, max_output_bytes=None, jobs=1)
    generate_gantt_trace(run, native, log_skipped=False, max_output_bytes=None, jobs=1)
    tails = summarize_tails(run, log_skipped=False).to_dict(now_us=2e15)
    return {
        "summary": data,
        "text": format_summary(summary, show_all=True),
        "tails": tails,
        "trace": open(trace, "rb").read(),
        "native": open(native, "rb").read(),
    }


@pytest.mark.parametrize(
    "spec",
    [
        dict(
            ranks=16,
            steps=20,
            seed=21,
            hung=(9, 15),
            straggler=(3, "bwd", 30.0),
            black_boxes=True,
            pp=2,
            scalars=3,
        ),
        dict(ranks=12, steps=24, seed=22, restart=(4, 12), drift_hosts=(1,), drift_ms=3.0),
    ],
    ids=["hung", "restart"],
)
def test_every_command_answers_the_same_with_the_typed_decoder_and_without(
    tmp_path, monkeypatch, spec
):
    """summarize, its tails and both traces: byte for byte the same whether lines are read by
    msgspec into trimmed records or by orjson whole (the tolerant path), on runs with odd lines,
    torchtitan files and rotated segments."""
    from otel_titan.analysis.read import lines as record_lines

    run, _ = _run(tmp_path, **spec)
    _odd_lines(run)
    # the text says how long ago the last record was
    monkeypatch.setattr("time.time", lambda: 1.9e9)
    (tmp_path / "typed").mkdir()
    (tmp_path / "whole").mkdir()
    typed = _outputs(run, str(tmp_path / "typed"))
    monkeypatch.setattr(record_lines, "_typed_decode", None)
    whole = _outputs(run, str(tmp_path / "whole"))
    # the odd lines are there
    assert typed["summary"]["skipped_lines"] > 0 and typed["summary"]["repaired_lines"] > 0
    for name in typed:
        assert typed[name] == whole[name], name

"""`otel-titan watch` on the command line: help, bad arguments, --once, --json fields, the trigger
file, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.cli import main
from otel_titan.schema import stacks_file_name


def test_help_names_every_option_and_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["watch", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in (
        "--interval",
        "--once",
        "--json",
        "--exit-on",
        "--trigger",
        "--no-trigger",
        "--plain",
        "OTEL_TITAN_DUMP_TRIGGER",
        "3 an --exit-on alert",
    ):
        assert option in text


def test_exit_on_slow_is_refused_with_the_reason(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["watch", "/tmp", "--exit-on", "hang,slow"])
    assert exit_info.value.code == 2
    assert "slow is not one of hang, crashed, terminated, missing" in capsys.readouterr().err


def test_a_path_that_is_not_a_run_exits_2(tmp_path, capsys):
    assert main(["watch", str(tmp_path / "nope"), "--once"]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_once_json_prints_one_frame_with_the_documented_fields(tmp_path, capsys):
    generate_run(str(tmp_path), RunSpec(ranks=4, steps=12, seed=1))
    assert main(["watch", str(tmp_path), "--once", "--json", "--no-trigger"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    frame = json.loads(lines[0])
    for field in (
        "type",
        "time_utc",
        "run_id",
        "attempt",
        "age_s",
        "processes",
        "world_size",
        "states",
        "ranks_by_state",
        "steps",
        "step_ms",
        "steps_per_min",
        "phases",
        "last_arrivals",
        "hang_after_s",
        "suspected_hang",
        "pause",
        "alerts",
        "resolved",
        "run_dir",
        "black_box_requested_utc",
        "read",
    ):
        assert field in frame, field
    assert (
        frame["type"] == "frame"
        and frame["states"] == {"closed": 4}
        and frame["steps"]["max"] == 12
    )


def test_a_suspected_hang_touches_the_trigger_file_once_and_exit_on_hang_exits_3(tmp_path, capsys):
    generate_run(str(tmp_path), RunSpec(ranks=8, steps=20, seed=2, hung=(3, 15)))
    old = time.time() - 60
    for name in os.listdir(tmp_path / "structured_logs"):
        os.utime(tmp_path / "structured_logs" / name, (old, old))
    trigger = tmp_path / "dump-now"
    assert (
        main(
            [
                "watch",
                str(tmp_path),
                "--json",
                "--interval",
                "0.1",
                "--exit-on",
                "hang",
                "--trigger",
                str(trigger),
            ]
        )
        == 3
    )
    assert trigger.exists()
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    alert = [e for e in events if e["type"] == "alert"][0]
    for field in (
        "kind",
        "id",
        "message",
        "ranks",
        "source",
        "attempt",
        "host",
        "step",
        "phase",
        "where",
        "line",
        "since_utc",
        "detected_utc",
        "cost",
        "evidence",
        "victims",
        "confirmed",
    ):
        assert field in alert, field
    assert alert["ranks"] == [3] and alert["kind"] == "hang"
    requested = [e["black_box_requested_utc"] for e in events if e["type"] == "frame"]
    assert len(requested[-1]) == 1, (
        "the trigger is touched once per suspected hang, not at every refresh"
    )


def test_once_on_a_job_stuck_just_past_the_threshold_shows_the_suspect_it_will_confirm_at_the_next_refresh(
    tmp_path, capsys
):
    # Stuck for 11 s: past the 8 s a hang needs, not twice it; one refresh may have caught the files
    # between two writes. The writers' heartbeats, 10 s in, were written a second ago.
    generate_run(str(tmp_path), RunSpec(ranks=8, steps=20, seed=2, hung=(3, 15), hang_s=11.0))
    old = time.time() - 1
    for name in os.listdir(tmp_path / "structured_logs"):
        os.utime(tmp_path / "structured_logs" / name, (old, old))
    assert main(["watch", str(tmp_path), "--once", "--no-trigger", "--exit-on", "hang"]) == 0
    out = capsys.readouterr().out
    assert "suspected hang: training rank 3 in bwd (step 15)" in out and "alerts: none" in out


def test_a_rank_whose_c_call_held_the_interpreter_lock_is_named_with_the_line_of_its_faulthandler_dump(
    tmp_path, capsys
):
    # Such a rank cannot write its stall record: the writer's faulthandler dump in the side file
    # beside its JSONL file (schema.stacks_file_name) is its only black box, and must give the alert
    # its line of code.
    generate_run(str(tmp_path), RunSpec(ranks=8, steps=20, seed=2, hung=(3, 15)))
    logs = tmp_path / "structured_logs"
    old = time.time() - 60
    for name in os.listdir(logs):
        os.utime(logs / name, (old, old))
    rank3 = next(name for name in os.listdir(logs) if ".global_rank_3." in name)
    script = tmp_path / "stuck.py"
    script.write_text(
        textwrap.dedent("""
        import sys, time
        from otel_titan.core.blackbox import FaulthandlerArm, open_side_file
        arm = FaulthandlerArm(open_side_file(sys.argv[1]))
        arm.rearm(0.3)
        def read_batch():
            time.sleep(1.5)  # the dump fires from faulthandler's own thread while this call runs
        read_batch()
    """)
    )
    # The writer's own arming code, in a real process: its note (threads, when it fires) and
    # faulthandler's dump.
    subprocess.run(
        [sys.executable, str(script), str(logs / stacks_file_name(rank3))], check=True, timeout=60
    )
    assert (
        main(
            [
                "watch",
                str(tmp_path),
                "--json",
                "--interval",
                "0.1",
                "--exit-on",
                "hang",
                "--no-trigger",
            ]
        )
        == 3
    )
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    alerts = [e for e in events if e["type"] in ("alert", "update") and e["kind"] == "hang"]
    assert alerts and alerts[-1]["ranks"] == [3], alerts
    assert (
        alerts[-1]["line"] is not None
        and alerts[-1]["line"].endswith(" read_batch")
        and "stuck.py:" in alerts[-1]["line"]
    ), alerts[-1]
    assert "black box" in alerts[-1]["evidence"]


def _stray_of_another_run(folder, *, progressed: bool) -> None:
    """One process of another run in the watched folder, written now: its opening record (and, when
    `progressed`, a few spans)."""
    other = folder.parent / f"{folder.name}-other"
    generate_run(
        str(other),
        RunSpec(ranks=8, steps=3, seed=5, run_id="run-b", start_us=int(time.time() * 1e6)),
    )
    (path,) = [p for p in (other / "structured_logs").iterdir() if "global_rank_5." in p.name]
    lines = path.read_bytes().splitlines(keepends=True)
    (folder / "structured_logs" / f"b-{path.name}").write_bytes(
        b"".join(lines if progressed else lines[:1])
    )


@pytest.mark.parametrize("progressed", [False, True])
def test_a_process_of_another_run_does_not_take_the_watch_over(tmp_path, progressed):
    """Run A's 8 ranks, rank 3 hung; one process of run B arrives (a test, a leftover with the
    endpoint set). The watch stays on A: its hang is named and --exit-on acts on it, never on
    "missing: 7 of 8" for B (before: B took the frames for good)."""
    from io import StringIO

    from otel_titan.analysis.watch.loop import run_watch

    run = tmp_path / "run"
    generate_run(str(run), RunSpec(ranks=8, steps=20, seed=2, hung=(3, 15), run_id="run-a"))
    old = time.time() - 60
    for name in os.listdir(run / "structured_logs"):
        os.utime(run / "structured_logs" / name, (old, old))
    _stray_of_another_run(run, progressed=progressed)
    out = StringIO()
    assert (
        run_watch(
            str(run),
            interval=0.05,
            json_lines=True,
            exit_on=("hang", "missing"),
            trigger=None,
            max_refreshes=40,
            out=out,
        )
        == 3
    )
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    frames = [e for e in events if e["type"] == "frame"]
    assert {f["run_id"] for f in frames} == {"run-a"} and frames[-1]["other_runs"] == [
        {"run_id": "run-b", "processes": 1}
    ]
    alerts = [e for e in events if e["type"] == "alert"]
    assert [(a["kind"], a["ranks"]) for a in alerts if a.get("confirmed")][-1] == (
        "hang",
        [3],
    ) and not any(a["kind"] == "missing" for a in alerts)


def test_a_new_job_in_the_folder_takes_over_once_it_runs_with_as_many_processes(tmp_path):
    from io import StringIO

    from otel_titan.analysis.watch.loop import run_watch

    run = tmp_path / "run"
    # over: every process closed
    generate_run(str(run), RunSpec(ranks=4, steps=6, seed=1, run_id="run-a"))
    old = time.time() - 600
    for name in os.listdir(run / "structured_logs"):
        os.utime(run / "structured_logs" / name, (old, old))
    new = tmp_path / "new"
    generate_run(
        str(new), RunSpec(ranks=4, steps=6, seed=3, run_id="run-b", start_us=int(time.time() * 1e6))
    )
    for path in (new / "structured_logs").iterdir():
        path.rename(run / "structured_logs" / f"b-{path.name}")
    out = StringIO()
    assert (
        run_watch(str(run), interval=0.05, json_lines=True, trigger=None, max_refreshes=2, out=out)
        == 0
    )
    frame = json.loads(out.getvalue().splitlines()[-1])
    assert (
        frame["run_id"] == "run-b"
        and frame["processes"] == 4
        and frame["other_runs"] == [{"run_id": "run-a", "processes": 4}]
    )

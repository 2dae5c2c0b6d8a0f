"""`otel-titan watch` as it is used (issue 26, part D): started before the job, the operator's
patience, a cron check, the screen's figures.

Every test runs the real command as a subprocess, beside a real torchrun/gloo
job (tests/helpers/watch_workload.py) or a generated run played live
(benchmarks/generate_run.py --live), and kills what it started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import processes

pytestmark = pytest.mark.slow

WORKLOAD = str(REPO / "tests" / "helpers" / "watch_workload.py")
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def watch_command(run: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "otel_titan.cli", "watch", str(run), *options]


def launch_job(
    fault: str, run: Path, log: Path, bad: int = 1, **extra: str
) -> subprocess.Popen[bytes]:
    """3 ranks of the watch workload under torchrun, writing into `run` (which need not exist
    yet)."""
    pytest.importorskip("torch")
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {
        **ENV,
        "OMP_NUM_THREADS": "1",
        "OTEL_TITAN_DUMP_TRIGGER": str(run / "dump-now"),
        "WATCH_STEP_S": "0.2",
        **extra,
    }
    with open(log, "wb") as out:
        return subprocess.Popen(
            [launcher, "--standalone", "--nproc_per_node=3", WORKLOAD, fault, str(bad), str(run)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )


def events_of(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -- item 13: started before the job ---------------------------------------------------------------


def test_watch_started_before_the_job_waits_for_its_files_says_so_and_names_the_hang(tmp_path):
    """The docs' recipes start watch first: it must wait for the folder, then follow the job as if
    started after it."""
    run = tmp_path / "outputs"  # does not exist yet: the logger creates it at init
    err = open(tmp_path / "watch.err", "wb")
    watcher = subprocess.Popen(
        watch_command(run, "--json", "--exit-on", "hang", "--interval", "1"),
        stdout=subprocess.PIPE,
        stderr=err,
        cwd=REPO,
        env=ENV,
    )
    job = None
    try:
        time.sleep(2.0)
        assert watcher.poll() is None, (
            "watch gave up on a run that does not exist yet: "
            + (tmp_path / "watch.err").read_text()
        )
        said = (tmp_path / "watch.err").read_text()
        assert (
            "no such file or directory: waiting for the job to write its files there, until it does"
            in said
        ), said
        job = launch_job("peer_phase", run, tmp_path / "torchrun.log")
        out, _ = watcher.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            "watch did not name the hang of the job started after it; job log: "
            + (tmp_path / "torchrun.log").read_text(errors="replace")[-2000:]
        ) from None
    finally:
        processes.kill_tree(watcher)
        if job is not None:
            processes.kill_tree(job)
        err.close()
    assert watcher.returncode == 3, (tmp_path / "watch.err").read_text()
    hangs = [e for e in events_of(out.decode()) if e["type"] == "alert" and e["kind"] == "hang"]
    assert [(h["ranks"], h["phase"]) for h in hangs] == [([1], "data_fetch")], hangs
    assert (tmp_path / "watch.err").read_text().count("waiting for the job") == 1, (
        "said once, not at every poll"
    )


def test_wait_gives_up_after_its_seconds_with_exit_2_naming_the_wait(tmp_path):
    started = time.monotonic()
    done = processes.run(
        watch_command(tmp_path / "never", "--wait", "1.5", "--no-trigger"),
        capture_output=True,
        cwd=REPO,
        env=ENV,
        timeout=60,
    )
    took = time.monotonic() - started
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "waiting for the job to write its files there, for up to 1.5 s (--wait)" in err, err
    assert (
        "never: no such file or directory (waited 1.5 s for the job to write its files: --wait)"
        in err
    ), err
    assert took >= 1.5, took


def test_a_folder_with_no_log_files_yet_is_waited_for_but_a_file_that_is_no_run_fails_at_once(
    tmp_path,
):
    folder = tmp_path / "outputs"
    folder.mkdir()
    done = processes.run(
        watch_command(folder, "--wait", "0.5", "--no-trigger"),
        capture_output=True,
        cwd=REPO,
        env=ENV,
        timeout=60,
    )
    assert done.returncode == 2 and "waiting for the job" in done.stderr.decode(), (
        done.stderr.decode()
    )
    not_a_log = tmp_path / "notes.txt"
    not_a_log.write_text("hello\n")
    started = time.monotonic()
    done = processes.run(
        watch_command(not_a_log, "--no-trigger"), capture_output=True, cwd=REPO, env=ENV, timeout=60
    )
    assert (
        done.returncode == 2
        and "not a structured-log file" in done.stderr.decode()
        and "waiting" not in done.stderr.decode()
    )
    assert time.monotonic() - started < 20, "a path that cannot become a run is not waited for"


# -- item 18: the screen's figures are of the steps ------------------------------------------------


def _step_begins(path: Path) -> dict[int, int]:
    begins: dict[int, int] = {}
    for line in open(path, "rb"):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line still being written (a live file)
        if type(record.get("step")) is int and record["log_type_name"] not in ("step_rollup",):
            begins.setdefault(record["step"], record["time_us"])
    return begins


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_screen_shows_shares_of_the_step_and_the_rate_the_job_ran_at(tmp_path):
    """A 900 ms checkpoint every 10th step of ~100 ms ones: it is about half the time, not 900 % of
    a step, and the job ran ~310 steps/min, not 577."""
    import re

    from benchmarks.generate_run import RunSpec, generate_run
    from tests.analysis.watch.test_screen import tmux_screen

    run = tmp_path / "run"
    generate_run(
        str(run), RunSpec(ranks=4, steps=40, seed=3, step_ms=100.0, pause_every=10, pause_ms=900.0)
    )
    screen = tmux_screen(tmp_path, run, 200, 40, wait_for="steps/min")
    flat = " ".join(screen.split())
    print(screen)
    # What the files say, read here independently (rank 0): the last 10 finished steps are 30-39,
    # the checkpoint in step 30.
    rank0 = next((run / "structured_logs").glob("*global_rank_0.*.jsonl"))
    begins = _step_begins(rank0)
    took_ms = (begins[40] - begins[30]) / 1000.0
    rate = float(re.search(r"([\d,.]+) steps/min", flat).group(1).replace(",", ""))
    expected_rate = 10 * 60_000.0 / took_ms
    assert abs(rate - expected_rate) <= 0.05 * expected_rate, (rate, expected_rate)
    shares = {name: float(pct) for name, pct in re.findall(r"(\w+) [\d,.]+ ms \((\d+)%\)", flat)}
    assert shares and max(shares.values()) <= 100 and sum(shares.values()) <= 102, shares
    expected_share = 100.0 * 900.0 / took_ms  # the generator's checkpoint lasts exactly pause_ms
    assert abs(shares["checkpoint"] - expected_share) <= 5, (shares, expected_share)
    assert "median step" in flat


# -- item 15: the operator sets the patience -------------------------------------------------------


def test_a_storage_hiccup_is_paged_but_kills_nothing_with_a_limit_and_is_no_hang_with_more_patience(
    tmp_path,
):
    """One rank waits 12 s in data_fetch once, then the job runs on: three watchers of the same real
    job.

    The default one (``--exit-on hang``) kills the healthy job, as the issue found; ``--exit-on
    hang:1m`` raises the hang (page early), sees it resolve and runs on (kill late); ``--hang-after
    25`` raises nothing.
    """
    run = tmp_path / "outputs"
    hiccup_s = 12.0
    job = launch_job(
        "hiccup",
        run,
        tmp_path / "torchrun.log",
        WATCH_HICCUP_S=str(hiccup_s),
        WATCH_FAULT_STEP="15",
    )
    watchers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        options = {
            "default": ("--exit-on", "hang"),
            "limit": ("--exit-on", "hang:1m"),
            "patient": ("--hang-after", "25", "--exit-on", "hang"),
        }
        for name, extra in options.items():
            watchers[name] = subprocess.Popen(
                watch_command(run, "--json", "--interval", "1", "--no-trigger", *extra),
                stdout=open(tmp_path / f"{name}.out", "wb"),
                stderr=open(tmp_path / f"{name}.err", "wb"),
                cwd=REPO,
                env=ENV,
            )
        # Until the job has run well past the hiccup: its step 15 plus the hiccup plus 10 s of
        # steps.
        deadline = time.monotonic() + 150
        resumed = None
        while time.monotonic() < deadline:
            assert job.poll() is None, (tmp_path / "torchrun.log").read_text(errors="replace")[
                -2000:
            ]
            steps = [
                e["steps"]["min"]
                for e in events_of((tmp_path / "patient.out").read_text())
                if e["type"] == "frame" and e.get("steps")
            ]
            if resumed is None and steps and steps[-1] >= 17:
                resumed = time.monotonic()
            if resumed is not None and time.monotonic() - resumed >= 10:
                break
            time.sleep(0.5)
        assert resumed is not None, "the job never got past its hiccup"
        running = {name: w.poll() for name, w in watchers.items()}
    finally:
        for w in watchers.values():
            processes.kill_tree(w)
        processes.kill_tree(job)
    out = {name: events_of((tmp_path / f"{name}.out").read_text()) for name in watchers}
    hangs = {
        name: [e for e in lines if e["type"] in ("alert", "resolved") and e["kind"] == "hang"]
        for name, lines in out.items()
    }
    # What the issue found: the default kills a job that recovers (it is the operator's patience
    # that decides).
    assert running["default"] == 3 and hangs["default"][0]["ranks"] == [1], hangs["default"]
    # Page early, kill late: raised, confirmed, resolved once the rank went on; the watcher never
    # exited.
    assert running["limit"] is None, (tmp_path / "limit.err").read_text()
    assert [(e["type"], e["ranks"]) for e in hangs["limit"]] == [
        ("alert", [1]),
        ("resolved", [1]),
    ], hangs["limit"]
    assert hangs["limit"][1]["lasted_s"] < 60
    assert not [e for e in out["limit"] if e["type"] == "exit"]
    # More patience than the hiccup lasted: no hang at all.
    assert running["patient"] is None and hangs["patient"] == [], hangs["patient"]
    assert {e["hang_after_s"] for e in out["patient"] if e["type"] == "frame"} == {25.0}


def test_exit_on_a_limit_exits_once_the_hang_has_lasted_it_and_says_why(tmp_path):
    """A generated run stuck for a minute: ``--exit-on hang:30s`` exits 3 at once (it has lasted 60
    s), ``hang:10m`` does not."""
    from benchmarks.generate_run import RunSpec, generate_run

    generate_run(str(tmp_path), RunSpec(ranks=8, steps=20, seed=2, hung=(3, 15)))
    old = time.time() - 60
    for path in (tmp_path / "structured_logs").iterdir():
        os.utime(path, (old, old))
    done = processes.run(
        watch_command(
            tmp_path, "--json", "--interval", "0.2", "--no-trigger", "--exit-on", "hang:30s"
        ),
        capture_output=True,
        cwd=REPO,
        env=ENV,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    last = events_of(done.stdout.decode())[-1]
    assert (
        last["type"] == "exit"
        and last["kind"] == "hang"
        and last["limit_s"] == 30.0
        and last["lasted_s"] >= 59
    ), last
    assert "--exit-on hang:30s" in last["message"] and "training rank 3" in last["message"]
    waiting = subprocess.Popen(
        watch_command(
            tmp_path, "--json", "--interval", "0.2", "--no-trigger", "--exit-on", "hang:10m"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=ENV,
    )
    try:
        time.sleep(4)
        assert waiting.poll() is None, waiting.communicate()
    finally:
        processes.kill_tree(waiting)
        out, _ = waiting.communicate()
    assert any(
        e["type"] == "alert" and e["kind"] == "hang" and e["ranks"] == [3]
        for e in events_of(out.decode())
    ), "the hang is raised at once: page early"


def test_bad_limits_and_patience_are_usage_errors_naming_the_option(tmp_path):
    for options, expected in (
        (
            ("--exit-on", "hang:soon"),
            "--exit-on: hang:soon: expected a duration such as 30, 45s, 10m or 1h, got 'soon'",
        ),
        (
            ("--exit-on", "slow:10m"),
            "--exit-on: slow is not one of hang, crashed, terminated, missing",
        ),
        (("--hang-after", "-3"), "--hang-after: expected a duration of 0 s or more"),
    ):
        done = processes.run(
            watch_command(tmp_path, "--once", *options),
            capture_output=True,
            cwd=REPO,
            env=ENV,
            timeout=60,
        )
        assert done.returncode == 2 and expected in done.stderr.decode(), (
            options,
            done.stderr.decode(),
        )


# -- item 17: --once --exit-on hang fires on what the files prove ----------------------------------


def test_once_exit_on_hang_fires_on_files_still_for_five_minutes(tmp_path):
    """A cron health check: one refresh of files untouched for 5 minutes is enough, the hang is
    confirmed and the check pages."""
    from benchmarks.generate_run import RunSpec, generate_run

    generate_run(str(tmp_path), RunSpec(ranks=8, steps=20, seed=2, hung=(3, 15)))
    old = time.time() - 300
    for path in (tmp_path / "structured_logs").iterdir():
        os.utime(path, (old, old))
    done = processes.run(
        watch_command(tmp_path, "--once", "--json", "--no-trigger", "--exit-on", "hang"),
        capture_output=True,
        cwd=REPO,
        env=ENV,
        timeout=60,
    )
    assert done.returncode == 3, done.stdout.decode()[-2000:]
    alert = next(e for e in events_of(done.stdout.decode()) if e["type"] == "alert")
    assert alert["kind"] == "hang" and alert["ranks"] == [3] and alert["confirmed"], alert
    assert "files still for over twice the 8 s a hang needs" in alert["evidence"], alert["evidence"]
    assert alert["cost"]["stopped_s"] >= 299, alert["cost"]


def test_once_on_a_real_hung_job_whose_heartbeats_keep_its_files_fresh_names_the_hang(tmp_path):
    """A real torchrun/gloo job hung for ~25 s: its logger still writes a heartbeat every 10 s, so
    the files are fresh, but their records say since when the culprit made no progress; one refresh
    names it and --exit-on hang pages."""
    run = tmp_path / "outputs"
    job = launch_job("peer_phase", run, tmp_path / "torchrun.log")
    try:
        deadline = time.monotonic() + 120
        onset = None
        while time.monotonic() < deadline:
            assert job.poll() is None, (tmp_path / "torchrun.log").read_text(errors="replace")[
                -2000:
            ]
            files = (
                list((run / "structured_logs").glob("training.global_rank_1.*.jsonl"))
                if (run / "structured_logs").is_dir()
                else []
            )
            # the workload's fault step: rank 1 hangs in it
            if onset is None and files and 4 in _step_begins(files[0]):
                onset = time.monotonic()
            if onset is not None and time.monotonic() - onset >= 25:
                break
            time.sleep(0.5)
        assert onset is not None, "the job never reached its fault"
        done = processes.run(
            watch_command(run, "--once", "--json", "--no-trigger", "--exit-on", "hang"),
            capture_output=True,
            cwd=REPO,
            env=ENV,
            timeout=60,
        )
    finally:
        processes.kill_tree(job)
    lines = events_of(done.stdout.decode())
    assert done.returncode == 3, lines[-1]
    alert = next(e for e in lines if e["type"] == "alert")
    assert alert["kind"] == "hang" and alert["ranks"] == [1] and alert["phase"] == "data_fetch", (
        alert
    )
    assert alert["cost"]["stopped_s"] >= 20, alert["cost"]


# -- item 14: a rank-0-only checkpoint is a pause, not a hang --------------------------------------


def test_a_rank_0_only_checkpoint_is_a_pause_not_a_hang_until_it_lasts_longer_than_allowed(
    tmp_path,
):
    """``if rank == 0: save(); dist.barrier()`` on a real job, a first checkpoint of 40 s, the
    others waiting in a ``barrier`` span (job A) or in no span at all (job B). Before: a hang of
    rank 0 at 30 s (A; ``--exit-on hang`` killed the healthy job) and ranks 1-2 named "behind in the
    step" (B: the victims). Now no alert, and the jobs run on; ``--pause-after 20`` names rank 0 in
    its checkpoint once it lasted that long."""
    checkpoint_s, fault_step = 40.0, 10
    jobs: dict[str, subprocess.Popen[bytes]] = {}
    watchers: dict[str, subprocess.Popen[bytes]] = {}
    runs = {"A": tmp_path / "span", "B": tmp_path / "nospan"}
    try:
        for name, barrier in (("A", "1"), ("B", "0")):
            jobs[name] = launch_job(
                "checkpoint",
                runs[name],
                tmp_path / f"torchrun-{name}.log",
                WATCH_CHECKPOINT_S=str(checkpoint_s),
                WATCH_FAULT_STEP=str(fault_step),
                WATCH_BARRIER_SPAN=barrier,
            )
        plan = {
            "A": ("A", ("--exit-on", "hang")),
            "B": ("B", ("--exit-on", "hang")),
            "A-impatient": ("A", ("--pause-after", "20", "--exit-on", "hang")),
        }
        for name, (job, extra) in plan.items():
            watchers[name] = subprocess.Popen(
                watch_command(runs[job], "--json", "--interval", "1", *extra),
                stdout=open(tmp_path / f"{name}.out", "wb"),
                stderr=open(tmp_path / f"{name}.err", "wb"),
                cwd=REPO,
                env=ENV,
            )
        deadline = time.monotonic() + 180
        past = set()
        while time.monotonic() < deadline and past != {"A", "B"}:
            for name in ("A", "B"):
                assert jobs[name].poll() is None, (tmp_path / f"torchrun-{name}.log").read_text(
                    errors="replace"
                )[-2000:]
                files = (
                    list((runs[name] / "structured_logs").glob("training.global_rank_1.*.jsonl"))
                    if (runs[name] / "structured_logs").is_dir()
                    else []
                )
                if files and fault_step + 10 in _step_begins(files[0]):
                    past.add(name)
            time.sleep(1.0)
        assert past == {"A", "B"}, f"the jobs never got past the checkpoint: {past}"
        running = {name: w.poll() for name, w in watchers.items()}
    finally:
        for w in watchers.values():
            processes.kill_tree(w)
        for job in jobs.values():
            processes.kill_tree(job)
    out = {name: events_of((tmp_path / f"{name}.out").read_text()) for name in watchers}
    for name in ("A", "B"):
        alerts = [e for e in out[name] if e["type"] == "alert"]
        assert running[name] is None and alerts == [], (name, alerts)
    # While it lasts, the frame says what the others wait for (job A: the records place rank 0 apart
    # from the others).
    pauses = [e["pause"] for e in out["A"] if e["type"] == "frame" and e.get("pause")]
    assert pauses and all(
        p.startswith("training rank 0 in checkpoint, a span only it runs") for p in pauses
    ), pauses[:3]
    impatient = [e for e in out["A-impatient"] if e["type"] == "alert" and e["kind"] == "hang"]
    assert running["A-impatient"] == 3, out["A-impatient"][-1]
    assert impatient and impatient[0]["ranks"] == [0] and impatient[0]["phase"] == "checkpoint", (
        impatient
    )
    assert impatient[0]["cost"]["stopped_s"] >= 20, impatient[0]["cost"]


def test_help_names_the_options_of_watch_as_it_is_used(capsys):
    from otel_titan.cli import main

    with pytest.raises(SystemExit):
        main(["watch", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in (
        "--wait S",
        "--hang-after S",
        "--pause-after S",
        "KIND:S",
        "hang:10m",
        "page early, kill late",
        "not a run (within --wait)",
    ):
        assert option in text, option


# -- item 16: a hang in a span never seen to finish, named from its flight recorder ----------------


def test_a_barrier_only_the_culprit_entered_is_named_from_the_flight_recorder_within_the_target(
    tmp_path,
):
    """Rank 1 calls ``dist.barrier()`` in a ``barrier`` span never seen to finish while the others
    wait in all_reduce.

    Its flight recorder shows the desync as soon as the black boxes arrive; it used to wait 30 s
    more for the span to outlast a past it never had (named after ~32 s). Target: max(15 s, 3 ×
    step) after its last record."""
    from tests.analysis.watch.test_watch_torchrun import last_program_record_s, parse_utc

    run = tmp_path / "outputs"
    job = launch_job("lone_barrier", run, tmp_path / "torchrun.log", TORCH_FR_BUFFER_SIZE="200")
    try:
        done = processes.run(
            watch_command(run, "--json", "--interval", "1", "--exit-on", "hang"),
            capture_output=True,
            cwd=REPO,
            env=ENV,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(
            "watch did not name the hang; job log: "
            + (tmp_path / "torchrun.log").read_text(errors="replace")[-2000:]
        ) from None
    finally:
        processes.kill_tree(job)
    lines = events_of(done.stdout.decode())
    assert done.returncode == 3, lines[-1]
    hang = next(e for e in lines if e["type"] == "alert" and e["kind"] == "hang")
    assert hang["ranks"] == [1] and hang["phase"] == "barrier" and hang["rule"] == "desync", hang
    assert "flight recorder" in hang["evidence"] and "watch_workload.py" in (hang["line"] or ""), (
        hang
    )
    latency = parse_utc(hang["detected_utc"]) - last_program_record_s(run, 1)
    print(f"named {latency:.1f} s after the culprit's last record: {hang['message']}")
    assert latency <= 15.0, latency

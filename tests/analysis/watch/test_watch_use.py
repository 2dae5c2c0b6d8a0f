"""`otel-titan watch` as it is used (issue 26, part D): started before the job, the operator's patience, a cron check, the screen's figures.

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


def launch_job(fault: str, run: Path, log: Path, bad: int = 1, **extra: str) -> subprocess.Popen[bytes]:
    """3 ranks of the watch workload under torchrun, writing into `run` (which need not exist yet)."""
    pytest.importorskip("torch")
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {**ENV, "OMP_NUM_THREADS": "1", "OTEL_TITAN_DUMP_TRIGGER": str(run / "dump-now"), "WATCH_STEP_S": "0.2", **extra}
    with open(log, "wb") as out:
        return subprocess.Popen([launcher, "--standalone", "--nproc_per_node=3", WORKLOAD, fault, str(bad), str(run)], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def events_of(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -- item 13: started before the job -----------------------------------------------------------------------------------


def test_watch_started_before_the_job_waits_for_its_files_says_so_and_names_the_hang(tmp_path):
    """The docs' recipes start watch first: it must wait for the folder, then follow the job as if started after it."""
    run = tmp_path / "outputs"  # does not exist yet: the logger creates it at init
    err = open(tmp_path / "watch.err", "wb")  # noqa: SIM115 - closed below
    watcher = subprocess.Popen(watch_command(run, "--json", "--exit-on", "hang", "--interval", "1"), stdout=subprocess.PIPE, stderr=err, cwd=REPO, env=ENV)
    job = None
    try:
        time.sleep(2.0)
        assert watcher.poll() is None, "watch gave up on a run that does not exist yet: " + (tmp_path / "watch.err").read_text()
        said = (tmp_path / "watch.err").read_text()
        assert "no such file or directory: waiting for the job to write its files there, until it does" in said, said
        job = launch_job("peer_phase", run, tmp_path / "torchrun.log")
        out, _ = watcher.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError("watch did not name the hang of the job started after it; job log: " + (tmp_path / "torchrun.log").read_text(errors="replace")[-2000:]) from None
    finally:
        processes.kill_tree(watcher)
        if job is not None:
            processes.kill_tree(job)
        err.close()
    assert watcher.returncode == 3, (tmp_path / "watch.err").read_text()
    hangs = [e for e in events_of(out.decode()) if e["type"] == "alert" and e["kind"] == "hang"]
    assert [(h["ranks"], h["phase"]) for h in hangs] == [([1], "data_fetch")], hangs
    assert (tmp_path / "watch.err").read_text().count("waiting for the job") == 1, "said once, not at every poll"


def test_wait_gives_up_after_its_seconds_with_exit_2_naming_the_wait(tmp_path):
    started = time.monotonic()
    done = processes.run(watch_command(tmp_path / "never", "--wait", "1.5", "--no-trigger"), capture_output=True, cwd=REPO, env=ENV, timeout=60)
    took = time.monotonic() - started
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "waiting for the job to write its files there, for up to 1.5 s (--wait)" in err, err
    assert "never: no such file or directory (waited 1.5 s for the job to write its files: --wait)" in err, err
    assert took >= 1.5, took


def test_a_folder_with_no_log_files_yet_is_waited_for_but_a_file_that_is_no_run_fails_at_once(tmp_path):
    folder = tmp_path / "outputs"
    folder.mkdir()
    done = processes.run(watch_command(folder, "--wait", "0.5", "--no-trigger"), capture_output=True, cwd=REPO, env=ENV, timeout=60)
    assert done.returncode == 2 and "waiting for the job" in done.stderr.decode(), done.stderr.decode()
    not_a_log = tmp_path / "notes.txt"
    not_a_log.write_text("hello\n")
    started = time.monotonic()
    done = processes.run(watch_command(not_a_log, "--no-trigger"), capture_output=True, cwd=REPO, env=ENV, timeout=60)
    assert done.returncode == 2 and "not a structured-log file" in done.stderr.decode() and "waiting" not in done.stderr.decode()
    assert time.monotonic() - started < 20, "a path that cannot become a run is not waited for"


# -- item 18: the screen's figures are of the steps ---------------------------------------------------------------------


def _step_begins(path: Path) -> dict[int, int]:
    begins: dict[int, int] = {}
    for line in open(path, "rb"):
        record = json.loads(line)
        if type(record.get("step")) is int and record["log_type_name"] not in ("step_rollup",):
            begins.setdefault(record["step"], record["time_us"])
    return begins


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_screen_shows_shares_of_the_step_and_the_rate_the_job_ran_at(tmp_path):
    """A 900 ms checkpoint every 10th step of ~100 ms ones: it is about half the time, not 900 % of a step, and the job ran ~310 steps/min, not 577."""
    import re

    from benchmarks.generate_run import RunSpec, generate_run
    from tests.analysis.watch.test_screen import tmux_screen

    run = tmp_path / "run"
    generate_run(str(run), RunSpec(ranks=4, steps=40, seed=3, step_ms=100.0, pause_every=10, pause_ms=900.0))
    screen = tmux_screen(tmp_path, run, 200, 40, wait_for="steps/min")
    flat = " ".join(screen.split())
    print(screen)
    # What the files say, read here independently (rank 0): the last 10 finished steps are 30-39, the checkpoint in step 30.
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

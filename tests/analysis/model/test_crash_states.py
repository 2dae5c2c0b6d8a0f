"""How a process ended decides its state: real torchrun/gloo jobs whose rank 1 dies the way real
ranks die (issue 26, part B).

Each test runs tests/helpers/crash_workload.py under torchrun (CPU, gloo),
then the real commands on its files: ``summarize`` (text and ``--json``),
``report`` and ``watch --once``, and checks that the rank that failed is
named with its error, that the others are its victims (never culprits), and
that where each process stopped is its program's last record. The job's
whole process tree is killed after each test.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import processes

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

WORKLOAD = str(REPO / "tests" / "helpers" / "crash_workload.py")
BAD = 1
CRASH_LINE = next(
    n for n, line in enumerate(open(WORKLOAD, encoding="utf-8"), 1) if "# the crash line" in line
)


def start(
    fault: str, output: Path, nproc: int, *torchrun: str, **extra: str
) -> subprocess.Popen[bytes]:
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}
    log = open(output / "torchrun.log", "wb")  # closed with the process
    return subprocess.Popen(
        [
            launcher,
            "--standalone",
            f"--nproc_per_node={nproc}",
            *torchrun,
            WORKLOAD,
            fault,
            str(BAD),
            str(output),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )


def run_job(fault: str, output: Path, nproc: int, *torchrun: str, **extra: str) -> None:
    job = start(fault, output, nproc, *torchrun, **extra)
    try:
        job.wait(timeout=120)
    finally:
        processes.kill_tree(job)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return processes.run(
        [sys.executable, "-m", "otel_titan.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def summarize(output: Path, *args: str) -> str:
    result = cli("summarize", str(output), *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def watch_once(output: Path, *args: str) -> tuple[int, list[dict]]:
    result = cli("watch", str(output), "--once", "--json", *args)
    return result.returncode, [
        json.loads(line) for line in result.stdout.splitlines() if line.strip()
    ]


def last_record(path: str) -> dict | None:
    lines = [line for line in open(path, "rb").read().splitlines() if line.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None  # a line being written


def alerts(lines: list[dict], kind: str) -> list[dict]:
    return [line for line in lines if line["type"] == "alert" and line["kind"] == kind]


def test_an_uncaught_exception_is_a_crash_with_its_error_line_span_and_step_everywhere(tmp_path):
    """Item 2: rank 1 raises a CUDA OOM in fwd_bwd at step 8, rank 0 runs to step 20 (no collective
    between them)."""
    run_job("raise", tmp_path, 2, NO_COLLECTIVE="1", CRASH_DELAY_S="4")
    crash = f"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 79.15 GiB total capacity) at crash_workload.py:{CRASH_LINE} in allocate, inside span fwd_bwd, step 8"
    text = summarize(tmp_path)
    head = text[: text.index("Processes")]
    print(head)
    assert f"▶ crashed: training rank 1: {crash}" in head
    assert "nothing stands out" not in head
    assert "1 process: crashed at step 8, RuntimeError inside fwd_bwd  (training rank 1)" in head
    # Item 7: where each process stopped is its program's last record, never the logger's per-step
    # figures.
    assert "1 process: closed at step 20, after training_end  (training rank 0)" in head, head
    data = json.loads(summarize(tmp_path, "--json"))
    assert data["headline"]["states"] == {"closed": 1, "crashed": 1}
    rank1 = next(p for p in data["processes"] if p["rank"] == BAD)
    assert rank1["state"] == "crashed" and rank1["last_event"] == "fwd_bwd_end"
    assert {k: rank1["crash"][k] for k in ("type", "line", "function", "span", "step")} == {
        "type": "RuntimeError",
        "line": CRASH_LINE,
        "function": "allocate",
        "span": "fwd_bwd",
        "step": 8,
    }
    assert [(s["rank"], s["rule"]) for s in data["hang"]["suspects"]] == [(BAD, "crashed")]
    report = cli("report", str(tmp_path), "--output", str(tmp_path / "report.html"))
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert (
        "crashed: training rank 1: RuntimeError: CUDA out of memory" in page
        and f"crash_workload.py:{CRASH_LINE} in allocate" in page
    )
    findings = page[page.index("<h2 id=crashes>Crashes (summarize)</h2>") :]
    assert (
        f"<td>training rank 1</td><td>0</td><td>{crash}</td><td>failed first</td>"
        in findings[:2000]
    ), findings[:2000]
    code, lines = watch_once(tmp_path, "--exit-on", "hang,crashed,missing")
    (alert,) = alerts(lines, "crashed")
    assert (
        code == 3
        and alert["ranks"] == [BAD]
        and alert["message"] == f"training rank 1 crashed: {crash}"
    ), alert
    # the last line is the exit line (--exit-on says why it exits)
    frame = [line for line in lines if line.get("type") == "frame"][-1]
    assert frame["states"] == {"crashed": 1, "closed": 1}
    assert lines[-1]["type"] == "exit" and lines[-1]["kind"] == "crashed"


def test_the_rank_that_crashed_first_is_named_and_the_ranks_terminated_after_it_are_its_victims(
    tmp_path,
):
    """Item 3: rank 1 raises at step 8; ranks 0 and 2 wait in all_reduce (as NCCL does) until
    torchrun terminates them."""
    run_job("raise_wait", tmp_path, 3, OTEL_TITAN_STALL_AFTER_S="1")
    head = summarize(tmp_path)[:2500]
    print(head)
    assert (
        "▶ crashed: training rank 1: RuntimeError: CUDA out of memory" in head
        and "; ranks 0,2 stopped after it (its victims)" in head
    )
    hang = json.loads(summarize(tmp_path, "--json"))["hang"]
    assert [(s["rank"], s["rule"]) for s in hang["suspects"]] == [(BAD, "crashed")]
    victims = [g for g in hang["groups"] if g["role"] == "victims"]
    assert [g["ranks"] for g in victims] == [[0, 2]], hang["groups"]
    code, lines = watch_once(tmp_path, "--exit-on", "crashed")
    (crashed,) = alerts(lines, "crashed")
    assert (
        code == 3
        and crashed["ranks"] == [BAD]
        and crashed["victims"] == 2
        and "CUDA out of memory" in crashed["message"]
    )
    assert not alerts(lines, "hang")
    (terminated,) = alerts(lines, "terminated")
    assert "after rank 1 crashed (victims)" in terminated["message"], terminated


def test_a_sigkilled_rank_is_a_crash_and_its_peers_whose_collective_failed_are_its_victims(
    tmp_path,
):
    """Item 4: rank 1 SIGKILLs itself in fwd_bwd at step 8; gloo fails the others' all_reduce, they
    die of that exception."""
    run_job("sigkill", tmp_path, 3)
    head = summarize(tmp_path)[:2500]
    print(head)
    assert (
        "▶ crashed: training rank 1: killed (no closing or signal record; its peers failed after "
        "its last record, in what it never reached), inside span fwd_bwd, step 8; ranks 0,2 "
        "stopped after it (its victims)" in head
    )
    assert "crashed after it: training ranks 0,2 (RuntimeError" in head
    data = json.loads(summarize(tmp_path, "--json"))
    assert [(s["rank"], s["rule"]) for s in data["hang"]["suspects"]] == [(BAD, "crashed")]
    assert {p["rank"]: p["state"] for p in data["processes"]} == {
        0: "crashed",
        1: "crashed",
        2: "crashed",
    }
    # also once torchrun's SIGTERM (when it reached ranks 0,2 as they failed) is 2 s old
    for wait in (
        0.0,
        2.5,
    ):
        time.sleep(wait)
        code, lines = watch_once(tmp_path, "--exit-on", "crashed")
        (crashed,) = alerts(lines, "crashed")
        assert (
            code == 3
            and crashed["ranks"] == [BAD]
            and crashed["victims"] == 2
            and "killed" in crashed["message"]
        ), (wait, crashed)
        assert not alerts(lines, "hang")


def test_a_sigkilled_rank_whose_peers_torchrun_terminated_is_the_crash_and_they_its_victims(
    tmp_path,
):
    """Item 4, as CI once raced it: rank 1 SIGKILLs itself in fwd_bwd at step 8; ranks 0,2 wait in
    all_reduce (as NCCL does) until torchrun's SIGTERM, whose records come after rank 1's last one.
    `watch` once called rank 1 crashed for writing nothing since (with no crash facts) once the
    SIGTERM was 2 s old, and then named ranks 0,2 as the crash, held back by rank 1: `watch --once`
    runs at once and again 2.5 s later."""
    run_job("sigkill_wait", tmp_path, 3)
    head = summarize(tmp_path)[:2500]
    print(head)
    assert (
        "▶ crashed: training rank 1: killed (no closing or signal record; the others were "
        "terminated by a signal after its last record), inside span fwd_bwd, step 8; ranks 0,2 "
        "stopped after it (its victims)" in head
    )
    for wait in (0.0, 2.5):
        time.sleep(wait)
        code, lines = watch_once(tmp_path, "--exit-on", "crashed")
        (crashed,) = alerts(lines, "crashed")
        assert (
            code == 3
            and crashed["ranks"] == [BAD]
            and crashed["victims"] == 2
            and "killed" in crashed["message"]
        ), (wait, crashed)
        assert not alerts(lines, "hang")
        (terminated,) = alerts(lines, "terminated")
        assert (
            terminated["ranks"] == [0, 2]
            and "after rank 1 crashed (victims)" in terminated["message"]
        ), (wait, terminated)


def test_ctrl_c_on_a_hung_job_still_names_the_rank_it_interrupted_in_its_span(tmp_path):
    """Item 5: rank 1 hangs in data_fetch at step 8, rank 0 waits in all_reduce; then Ctrl-C (SIGINT
    to the job's process group)."""
    job = start("hang", tmp_path, 2, OTEL_TITAN_STALL_AFTER_S="2")
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # both black boxes written: the hang is on record
            files = glob.glob(str(tmp_path / "structured_logs" / "*.jsonl"))
            if len(files) == 2 and all(
                b'"log_type_name":"stall"' in open(path, "rb").read() for path in files
            ):
                break
            assert job.poll() is None, (tmp_path / "torchrun.log").read_text(errors="replace")[
                -3000:
            ]
            time.sleep(0.5)
        os.killpg(job.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        job.wait(timeout=60)
    finally:
        processes.kill_tree(job)
    head = summarize(tmp_path)[:2500]
    print(head)
    hang = json.loads(summarize(tmp_path, "--json"))["hang"]
    assert [s["rank"] for s in hang["suspects"]] == [BAD], hang
    assert (
        hang["suspects"][0]["span"] == "data_fetch"
        and "crash_workload.py" in hang["suspects"][0]["where"]
        and "read_shard" in hang["suspects"][0]["where"]
    )
    assert "never entered fwd_bwd, all_reduce of step 8" in hang["suspects"][0]["why"]
    assert "▶ hang suspect: training rank 1: behind in the step: in data_fetch at step 8" in head


def test_after_a_restart_the_first_attempts_crash_is_still_shown(tmp_path):
    """Item 2: under torchrun --max-restarts, attempt 0's failure stays in the headline and the
    watch after attempt 1 replaced it."""
    run_job(
        "raise", tmp_path, 2, "--max-restarts=1", ONLY_ATTEMPT="0", NO_COLLECTIVE="1", STEPS="40"
    )
    head = summarize(tmp_path)[:2500]
    print(head)
    assert "▶ crashed: training rank 1 (attempt 0): RuntimeError: CUDA out of memory" in head
    data = json.loads(summarize(tmp_path, "--json"))
    assert data["headline"]["attempts"] == [0, 1]
    assert all(p["state"] == "closed" for p in data["processes"] if p["attempt"] == 1)
    _, lines = watch_once(tmp_path)
    crashed = alerts(lines, "crashed")
    assert [(a["attempt"], a["ranks"]) for a in crashed] == [(0, [BAD])], crashed
    assert "attempt 0" in crashed[0]["message"]


def test_torchtitans_files_of_a_live_hang_name_the_rank_behind_while_its_processes_live_here(
    tmp_path,
):
    """Item 6: torchtitan's own logger (no closing record, no heartbeat, no black box); rank 1 hangs
    in data_fetch, rank 0 waits in all_reduce.

    Their files alone cannot tell a stuck process from one killed mid-step; this host's process
    table can. While the processes live, both are stuck on that evidence: `summarize` and `watch
    --once` name rank 1, behind in the step (summarize named no one: "2 ended", later "cannot
    tell"). Once the job is killed, neither names anyone (watch named the least advanced rank of a
    job killed mid-step), and a quiet process is never "ended".
    """
    pytest.importorskip("torchtitan.observability.structured_logger", exc_type=ImportError)
    job = start("hang", tmp_path, 2, WRITER="torchtitan")
    try:
        deadline = time.monotonic() + 60
        # rank 1 inside data_fetch and rank 0 inside all_reduce at step 8
        while time.monotonic() < deadline:
            files = {
                int(path.split("global_rank_")[1].split(".")[0]): last_record(path)
                for path in glob.glob(str(tmp_path / "structured_logs" / "*.jsonl"))
            }
            if {rank: (r or {}).get("log_type_name") for rank, r in files.items()} == {
                0: "all_reduce_start",
                1: "data_fetch_start",
            }:
                break
            assert job.poll() is None, (tmp_path / "torchrun.log").read_text(errors="replace")[
                -3000:
            ]
            time.sleep(0.5)
        else:
            raise AssertionError(f"the hang never began: {sorted(files)}")
        time.sleep(62)  # quiet for a minute: no longer `running`
        head = summarize(tmp_path)[:3000]
        data = json.loads(summarize(tmp_path, "--json"))
        _, frames = watch_once(tmp_path, "--no-trigger")
    finally:
        processes.kill_tree(job)
    print(head)
    assert data["headline"]["states"] == {"stalled": 2}, data["headline"]["states"]
    assert "ended" not in head and "nothing stands out" not in head
    hang = data["hang"]
    assert hang is not None and [s["rank"] for s in hang["suspects"]] == [1], hang["suspects"]
    assert {p["rank"]: p["span"] for p in hang["places"]} == {0: "all_reduce", 1: "data_fetch"}
    assert "still alive on this host" in " ".join(p["evidence"] for p in hang["places"])
    assert [a["ranks"] for a in alerts(frames, "hang")] == [[1]], frames[-1]

    # The job killed: the same files, its processes gone.
    after = json.loads(summarize(tmp_path, "--json"))
    assert after["headline"]["states"] == {"stopped": 2}, after["headline"]["states"]
    assert after["hang"] is not None and after["hang"]["suspects"] == [], after["hang"]["suspects"]
    assert "cannot tell a stuck process from one killed mid-step" in summarize(tmp_path)
    _, frames = watch_once(tmp_path, "--no-trigger")
    named = [a["ranks"] for a in alerts(frames, "hang")]
    assert all(ranks == [] for ranks in named), named


def test_watch_beside_the_job_exits_on_the_crash_naming_the_rank_that_failed_first(tmp_path):
    """Item 2-3 live: ``watch --exit-on hang,crashed,missing`` started beside the job exits 3 on the
    crash, not on a hang."""
    job = start("raise_wait", tmp_path, 3, CRASH_STEP="30", STEPS="40")
    try:
        deadline = time.monotonic() + 90
        while len(glob.glob(str(tmp_path / "structured_logs" / "*.jsonl"))) < 3:
            assert time.monotonic() < deadline and job.poll() is None, (
                tmp_path / "torchrun.log"
            ).read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        result = cli(
            "watch", str(tmp_path), "--json", "--exit-on", "hang,crashed,missing", "--interval", "1"
        )
    finally:
        processes.kill_tree(job)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    raised = [line for line in lines if line["type"] == "alert"]
    assert result.returncode == 3, lines[-3:]
    exit_alert = next(a for a in raised if a["kind"] in ("hang", "crashed", "missing"))
    assert (
        exit_alert["kind"] == "crashed"
        and exit_alert["ranks"] == [BAD]
        and "CUDA out of memory" in exit_alert["message"]
    ), raised

"""The hang black box end to end: 4 real ranks (torchrun, gloo on CPU) hang on purpose, `summarize`
names the culprit.

Each test injects one fault on rank 2 (tests/helpers/hang_workload.py), with
``OTEL_TITAN_STALL_AFTER_S=3`` and torch's flight recorder on, waits until
every rank's black box is on disk (within stall_after_s + 30 s), then runs the
real ``otel-titan summarize`` and checks that its first 15 lines name rank 2
and the culprit's frame, and that no rank's black box exceeds 1 MB.

The issue-18 checks below run 2 or 3 ranks the same way: an all_reduce on a
sub-group, a rank blocked between spans or before init, two culprits read
with ``--tail``, torch's own dump files, and a pause the run recovered from.
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

STALL_AFTER_S = 3
WORKLOAD = str(REPO / "tests" / "helpers" / "hang_workload.py")
BAD = 2


def line_of(marker: str) -> int:
    """The line of hang_workload.py that carries `marker` (a comment naming a culprit)."""
    for number, line in enumerate(open(WORKLOAD, encoding="utf-8"), 1):
        if marker in line:
            return number
    raise AssertionError(marker)


def launch(
    fault: str, output: Path, nproc: int = 4, bad: int = BAD, **extra: str
) -> subprocess.Popen[bytes]:
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "OTEL_TITAN_STALL_AFTER_S": str(STALL_AFTER_S),
        "TORCH_FR_BUFFER_SIZE": "200",
        **extra,
    }
    log = open(output / "torchrun.log", "wb")
    return subprocess.Popen(
        [
            launcher,
            "--standalone",
            f"--nproc_per_node={nproc}",
            WORKLOAD,
            fault,
            str(bad),
            str(output),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )


def black_boxes(output: Path) -> dict[int, dict[str, object]]:
    """Per rank: its stall records (parsed), the bytes they take, and its faulthandler side file."""
    out: dict[int, dict[str, object]] = {}
    for path in glob.glob(str(output / "structured_logs" / "*.jsonl")):
        rank = int(path.split("global_rank_")[1].split(".")[0])
        stalls, size = [], 0
        with open(path, "rb") as handle:
            for line in handle:
                if b'"log_type_name":"stall"' in line:
                    stalls.append(json.loads(line))
                    size += len(line)
        side = path[: -len(".jsonl")] + ".stacks"
        dump = open(side, encoding="utf-8", errors="replace").read() if os.path.exists(side) else ""
        out[rank] = {
            "stalls": stalls,
            "bytes": size + len(dump.encode()),
            "dumped": "most recent call first" in dump,
        }
    return out


def wait_for_black_boxes(
    output: Path, launcher: subprocess.Popen[bytes], ready, files: int = 4
) -> dict[int, dict[str, object]]:
    deadline = time.monotonic() + STALL_AFTER_S + 30
    boxes: dict[int, dict[str, object]] = {}
    while time.monotonic() < deadline:
        boxes = black_boxes(output)
        if len(boxes) == files and all(ready(rank, box) for rank, box in boxes.items()):
            return boxes
        if launcher.poll() is not None:
            break
        time.sleep(0.5)
    log = (output / "torchrun.log").read_text(errors="replace")[-3000:]
    raise AssertionError(
        f"black boxes not all written within {STALL_AFTER_S + 30} s: "
        f"{ ({r: (len(b['stalls']), b['dumped']) for r, b in boxes.items()}) }\n{log}"
    )


def summarize(output: Path, *args: str) -> str:
    result = processes.run(
        [sys.executable, "-m", "otel_titan.cli", "summarize", str(output), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def stalled(rank: int, box: dict[str, object]) -> bool:
    return bool(box["stalls"])


def check_named(output: Path, frame: str, why: str) -> str:
    text = summarize(output)
    head = "\n".join(text.splitlines()[:15])
    print(head)
    suspects = head[head.index("Suspects:") :]
    assert f"rank {BAD} (training): " in suspects and frame in suspects and why in suspects, head
    assert (
        "rank 0 (training)" not in suspects
        and "rank 1 (training)" not in suspects
        and "rank 3 (training)" not in suspects
    ), head
    hang = json.loads(summarize(output, "--json"))["hang"]
    assert [(s["source"], s["rank"]) for s in hang["suspects"]] == [("training", BAD)]
    assert frame in hang["suspects"][0]["where"]
    return head


def run_fault(
    tmp_path: Path, fault: str, ready, frame: str, why: str
) -> tuple[subprocess.Popen[bytes], str]:
    launcher = launch(fault, tmp_path)
    try:
        boxes = wait_for_black_boxes(tmp_path, launcher, ready)
        assert all(box["bytes"] <= 1 << 20 for box in boxes.values()), {
            r: b["bytes"] for r, b in boxes.items()
        }
        head = check_named(tmp_path, frame, why)
    except BaseException:
        processes.kill_tree(launcher, timeout=30)
        raise
    return launcher, head


def test_a_rank_sleeping_in_data_fetch_is_named_and_sigterm_still_ends_the_ranks_promptly(tmp_path):
    launcher, head = run_fault(
        tmp_path,
        "sleep",
        stalled,
        f"hang_workload.py:{line_of('culprit line of the `sleep`')} read_shard",
        "never entered seq 3",
    )
    assert "3 × ranks 0-1,3: wait in all_reduce (pg 0, seq 3, " in head
    try:
        started = time.monotonic()
        launcher.send_signal(signal.SIGTERM)  # what a scheduler's cancel does to torchrun
        launcher.wait(timeout=30)
        took = time.monotonic() - started
        print(f"torchrun and its ranks gone {took:.1f} s after SIGTERM")
        assert took < 15
        # Each rank wrote its SIGTERM black box on the way out, or, when a peer died first, its
        # collective failed (gloo: the connection closed) and it ended on its own, closing its file:
        # a race between torchrun's signals and gloo, seen once in a full run. Either way nothing is
        # lost.
        ended = {}
        for path in glob.glob(str(tmp_path / "structured_logs" / "*.jsonl")):
            names = [
                json.loads(line)["log_type_name"]
                for line in open(path, encoding="utf-8")
                if line.strip()
            ]
            ended[int(path.split("global_rank_")[1].split(".")[0])] = names[
                -1
            ] == "structured_logger_closed" and any(n.endswith("_error") for n in names)
        boxes = black_boxes(tmp_path)
        assert sorted(boxes) == [0, 1, 2, 3]
        assert all(
            any(s["reason"] == "SIGTERM" for s in box["stalls"]) or ended[rank]
            for rank, box in boxes.items()
        ), ended
        # the culprit never left read_shard: signalled
        assert any(s["reason"] == "SIGTERM" for s in boxes[BAD]["stalls"])
    finally:
        processes.kill_tree(launcher, timeout=30)


def test_a_rank_stuck_in_a_c_call_holding_the_interpreter_lock_is_named_from_its_faulthandler_dump(
    tmp_path,
):
    def ready(rank: int, box: dict[str, object]) -> bool:
        return bool(box["dumped"]) if rank == BAD else bool(box["stalls"])

    launcher, head = run_fault(
        tmp_path,
        "gil",
        ready,
        f"hang_workload.py:{line_of('culprit line of the `gil`')} hold_the_gil",
        "interpreter lock held",
    )
    processes.kill_tree(launcher, timeout=30)
    assert "the others wait in seq 3 all_reduce (pg 0)" in head


def test_a_rank_calling_another_collective_is_named_from_the_flight_recorder(tmp_path):
    launcher, head = run_fault(
        tmp_path,
        "mismatch",
        stalled,
        "hang_workload.py:",
        "desync in pg 0 seq 3: called broadcast [[16]] Float while 3 ranks called all_reduce "
        "[[16]] Float",
    )
    processes.kill_tree(launcher, timeout=30)
    # The export: stalls as instants carrying the stacks, collectives as slices on a per-rank track.
    result = processes.run(
        [sys.executable, "-m", "otel_titan.cli", "export", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    events = json.loads((tmp_path / "analysis" / "trace.json").read_text())["traceEvents"]
    stalls = [e for e in events if e.get("name") == "stall" and e.get("ph") == "i"]
    assert len({e["pid"] for e in stalls}) == 4 and all(
        e["args"]["threads"][0]["frames"] for e in stalls
    )
    collectives = [e for e in events if e.get("cat") == "collective"]
    assert {e["name"] for e in collectives} >= {
        "gloo:all_reduce #3",
        "gloo:broadcast #3",
        "gloo:all_reduce #1",
    }
    tracks = {
        (e["pid"], e["args"]["name"])
        for e in events
        if e.get("name") == "thread_name" and e["tid"] == collectives[0]["tid"]
    }
    assert len(tracks) == 4 and all(name == "collectives (flight recorder)" for _, name in tracks)


def test_two_threads_deadlocked_on_two_locks_are_named_with_both_stacks(tmp_path):
    launcher, head = run_fault(
        tmp_path,
        "deadlock",
        stalled,
        f"hang_workload.py:{line_of('culprit line of the `deadlock`')} deadlock",
        "never entered seq 3",
    )
    processes.kill_tree(launcher, timeout=30)
    writer_line = line_of("helper's side of the deadlock")
    assert "ckpt-writer: " in head and f"hang_workload.py:{writer_line} writer" in head


def test_a_healthy_run_with_steps_slower_than_the_floor_writes_no_stall(tmp_path):
    # Steps of 1.5 s with a 1 s floor: the automatic threshold (10 × the slowest gap) never fires.
    launcher = launch(
        "healthy",
        tmp_path,
        OTEL_TITAN_STALL_AFTER_S="",
        OTEL_TITAN_STALL_MIN_S="1",
        HANG_STEPS="5",
        HANG_STEP_S="1.5",
    )
    try:
        assert launcher.wait(timeout=120) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    finally:
        processes.kill_tree(launcher, timeout=30)
    boxes = black_boxes(tmp_path)
    assert len(boxes) == 4 and not any(box["stalls"] or box["dumped"] for box in boxes.values())
    # nothing dumped: side files removed at close
    assert not glob.glob(str(tmp_path / "structured_logs" / "*.stacks"))
    assert "Hang:" not in summarize(tmp_path)


def test_the_dump_signal_and_the_trigger_file_make_a_live_rank_write_its_black_box(tmp_path):
    trigger = tmp_path / "dump-now"
    launcher = launch(
        "live",
        tmp_path,
        OTEL_TITAN_STALL_AFTER_S="0",
        OTEL_TITAN_DUMP_SIGNAL="SIGUSR2",
        OTEL_TITAN_DUMP_TRIGGER=str(trigger),
    )
    try:
        deadline = time.monotonic() + 60
        while len(black_boxes(tmp_path)) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)
        workers = [
            pid
            for pid in processes.descendants(launcher.pid)
            if "hang_workload.py" in processes.cmdline(pid)
        ]
        assert len(workers) == 4
        os.kill(workers[0], signal.SIGUSR2)
        trigger.touch()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            boxes = black_boxes(tmp_path)
            reasons = sorted(s["reason"] for box in boxes.values() for s in box["stalls"])
            if reasons.count("trigger") == 4 and "signal" in reasons:
                break
            time.sleep(0.5)
        assert reasons.count("trigger") == 4 and reasons.count("signal") == 1, reasons
        assert launcher.poll() is None  # still training: the black box did not stop it
        box = next(s for b in boxes.values() for s in b["stalls"] if s["reason"] == "signal")
        assert box["threads"][0]["thread_name"] == "MainThread" and box["threads"][0]["frames"]
    finally:
        processes.kill_tree(launcher, timeout=30)


_NO_TORCH = """
import sys, time
from otel_titan import structured_logger as sl
rank = int(sys.argv[2])
sl.init_structured_logger("training", sys.argv[1], rank=rank, world_size=3, run_id="no-torch", stall_after_s=0.5)
def wait_for_peers():
    time.sleep(30)
def parse_batch():
    time.sleep(30)
with sl.log_trace_span("step"):
    if rank == 1:
        with sl.log_trace_span("data_fetch"):
            parse_batch()
    else:
        with sl.log_trace_span("sync"):
            wait_for_peers()
"""


def test_without_a_flight_recorder_the_odd_one_out_of_a_majority_is_the_suspect(tmp_path):
    """No torch: the ranks are grouped by span and frame, and the one elsewhere is named."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _NO_TORCH, str(tmp_path), str(rank)], env=env, cwd=REPO
        )
        for rank in range(3)
    ]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            len(black_boxes(tmp_path)) == 3
            and all(b["stalls"] for b in black_boxes(tmp_path).values())
        ):
            time.sleep(0.2)
        head = "\n".join(summarize(tmp_path).splitlines()[:15])
    finally:
        for worker in workers:
            processes.kill_tree(worker, timeout=30)
    print(head)
    assert " 2 × ranks 0,2: span sync; main thread at <string>:7 wait_for_peers" in head
    assert (
        "rank 1 (training): <string>:9 parse_batch in span data_fetch: elsewhere than the 2 "
        "others (in sync at <string>:7 wait_for_peers)" in head
    )


# -- issue 18: the analysis names the right rank on real jobs (2 and 3 ranks, sub-groups, missing
# ranks, --tail, recovery) --
def hang_of(output: Path, *args: str) -> dict[str, object]:
    return json.loads(summarize(output, "--json", *args))["hang"]


def test_a_collective_on_a_sub_group_names_the_rank_that_never_entered_it(tmp_path):
    """Every step's all_reduce on dist.new_group([0, 1]); rank 1 hangs in data_fetch: pg 0 holds
    only a stale barrier."""
    launcher = launch("subgroup", tmp_path, nproc=2, bad=1)
    try:
        wait_for_black_boxes(tmp_path, launcher, stalled, files=2)
        text = "\n".join(summarize(tmp_path).splitlines()[:12])
        hang = hang_of(tmp_path)
    finally:
        processes.kill_tree(launcher, timeout=30)
    print(text)
    assert [(s["rank"], s["rule"]) for s in hang["suspects"]] == [(1, "behind")], text
    assert (
        "behind in pg 1 (ranks 0-1): never entered seq 3 all_reduce" in hang["suspects"][0]["why"]
    )
    assert (
        f"hang_workload.py:{line_of('culprit line of the `sleep`')} read_shard"
        in hang["suspects"][0]["where"]
    )
    assert "1 × rank 0: waits in all_reduce (pg 1 (ranks 0-1), seq 3, scheduled)" in text
    # the culprit first, its victim after
    assert text.index(" ▶ 1 × rank 1") < text.index("1 × rank 0")


def test_a_rank_that_never_reached_init_is_listed_missing_first(tmp_path):
    launcher = launch("before_init", tmp_path, nproc=3, bad=2)
    try:
        wait_for_black_boxes(tmp_path, launcher, stalled, files=2)
        text = summarize(tmp_path)
        hang = hang_of(tmp_path)
        tail = summarize(tmp_path, "--tail")
    finally:
        processes.kill_tree(launcher, timeout=30)
    head = "\n".join(text.splitlines()[:10])
    print(head)
    assert head.splitlines()[0].startswith(
        "Hang: 3 of 3 processes did not finish: 1 missing (no file), 2 "
    )
    assert head.splitlines()[1] == " ▶ 1 × training rank 2: missing: no file (world_size 3)"
    assert [(s["rank"], s["rule"]) for s in hang["suspects"]] == [(2, "missing")]
    assert "Summary: 2 of 3 processes" in text and "▶ missing: training rank 2" in text
    assert (
        "rank 0 (training)" not in tail.split("Suspects:")[1].split("\n\n")[0]
        and "rank 2 (training): no stack: no file" in tail
    )


def test_summarize_tail_gives_the_same_hang_verdict_as_a_full_read(tmp_path):
    launcher = launch("sleep2", tmp_path, nproc=3, bad=1)
    try:
        wait_for_black_boxes(tmp_path, launcher, stalled, files=3)
        full, tail = hang_of(tmp_path), hang_of(tmp_path, "--tail")
        text = summarize(tmp_path, "--tail")
    finally:
        processes.kill_tree(launcher, timeout=30)
    print("\n".join(text.splitlines()[:10]))
    assert [s["rank"] for s in full["suspects"]] == [1, 2] and [
        s["rank"] for s in tail["suspects"]
    ] == [1, 2]
    assert [s["why"] for s in tail["suspects"]] == [s["why"] for s in full["suspects"]]
    assert "no black box" not in text and "black box from 3 of 3" in text


def test_a_run_that_recovered_from_a_long_pause_and_closed_has_no_hang_section(tmp_path):
    launcher = launch("recover", tmp_path, nproc=2, HANG_STEPS="4")
    try:
        assert launcher.wait(timeout=120) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    finally:
        processes.kill_tree(launcher, timeout=30)
    # each rank's watchdog did write a stall
    assert all(box["stalls"] for box in black_boxes(tmp_path).values())
    text = summarize(tmp_path)
    assert "Hang:" not in text and hang_of(tmp_path) is None
    assert (
        "Stalls that ended (the process resumed: history, not a hang): 2" in text
        and "in all_reduce at step 2, then resumed" in text
    )


@pytest.mark.parametrize("nproc", [2, 3])
def test_a_rank_blocked_between_spans_is_named_not_the_rank_waiting_for_it(tmp_path, nproc):
    """Issue 18 item 1 as found: rank 1 blocks before data_fetch opens (a data loader outside any
    span); the others wait in all_reduce."""
    launcher = launch("between", tmp_path, nproc=nproc, bad=1)
    try:
        wait_for_black_boxes(tmp_path, launcher, stalled, files=nproc)
        text = "\n".join(summarize(tmp_path).splitlines()[:12])
        hang, tail = hang_of(tmp_path), hang_of(tmp_path, "--tail")
    finally:
        processes.kill_tree(launcher, timeout=30)
    print(text)
    for report in (hang, tail):
        assert [s["rank"] for s in report["suspects"]] == [1], text
        assert (
            f"hang_workload.py:{line_of('culprit line of the `between`')} load_batch"
            in report["suspects"][0]["where"]
        )
        assert "behind in pg 0: never entered seq 3 all_reduce" in report["suspects"][0]["why"]
    assert (
        " ▶ 1 × rank 1: last collective all_reduce (pg 0, seq 2, completed); between spans at "
        "step 3; main thread at " in text
    )
    assert "stalled in its own code" not in text and "frame unknown" not in text


def test_torch_s_own_flight_recorder_dumps_beside_the_logs_name_the_rank_when_the_black_boxes_have_none(
    tmp_path,
):
    launcher = launch("frdump", tmp_path, nproc=3, bad=1)
    try:
        deadline = time.monotonic() + 60
        while (
            time.monotonic() < deadline
            and len(glob.glob(str(tmp_path / "flight_recorder" / "rank_*"))) < 3
        ):
            time.sleep(0.5)
        wait_for_black_boxes(tmp_path, launcher, stalled, files=3)
        boxes = black_boxes(tmp_path)
        text = "\n".join(summarize(tmp_path).splitlines()[:10])
        hang = hang_of(tmp_path)
    finally:
        processes.kill_tree(launcher, timeout=30)
    print(text)
    # the black boxes hold no recorder
    assert not any(s.get("flight_recorder") for box in boxes.values() for s in box["stalls"])
    assert [(s["rank"], s["rule"]) for s in hang["suspects"]] == [(1, "behind")], text
    assert "behind in pg 0: never entered seq 3 all_reduce" in hang["suspects"][0]["why"]
    assert all("torch flight-recorder dump rank_" in p["evidence"] for p in hang["places"])


def test_the_side_file_is_found_from_the_segments_read_as_from_a_listing_of_the_folder(tmp_path):
    """`side_file_of(base, oldest)`: the summary passes the oldest segment it read (no folder
    listing per process: O(ranks²) at 1,000 ranks); the opening record there names the side file, as
    a listing would find it."""
    from otel_titan.analysis.model.hang import side_file_of

    folder = tmp_path / "structured_logs"
    folder.mkdir()
    base = folder / "training.global_rank_0.20260101-000000-abc123.jsonl"
    opened = {
        "time_us": 1,
        "log_type": "instant",
        "log_type_name": "structured_logger_opened",
        "stacks_file": "named.stacks",
    }
    # the oldest segment holds the opening record
    (folder / (base.name + ".2")).write_text(json.dumps(opened) + "\n")
    (folder / (base.name + ".1")).write_text(
        json.dumps({"time_us": 2, "log_type_name": "x"}) + "\n"
    )
    base.write_text(json.dumps({"time_us": 3, "log_type_name": "y"}) + "\n")
    (folder / "named.stacks").write_text("")
    listed = side_file_of(str(base))
    assert listed == str(folder / "named.stacks")
    assert side_file_of(str(base), str(folder / (base.name + ".2"))) == listed


@pytest.mark.parametrize("heartbeat_s", [10.0, None])
def test_a_rank_stopped_between_spans_is_named_once_the_others_heartbeats_date_their_wait(
    tmp_path: Path, heartbeat_s
):
    """Rank 5 stops after its optimizer (host code outside any span: no heartbeat there), the others
    wait in the all_reduce, no black box yet. Their heartbeats, written after rank 5's last record,
    show them alive and waiting for it: `summarize` and `watch` both name it, `watch` within
    max(15 s, 3 × step) (it waited for the black boxes at 120 s: `model.hang._held_back` took only
    their times). Without heartbeats (an older writer) nothing says they were not killed mid-step:
    no one is named, by either."""
    from benchmarks.generate_run import RunSpec, generate_run
    from otel_titan.analysis import summarize_run
    from otel_titan.analysis.watch.replay import replay

    spec = RunSpec(ranks=16, steps=20, seed=1, hung=(5, 12), hung_between=True)
    spec.heartbeat_s = heartbeat_s
    truth = generate_run(str(tmp_path), spec)
    suspects = summarize_run(str(tmp_path), log_skipped=False).hang.suspects
    hangs = replay(str(tmp_path), tail_s=150).alerts("hang")
    if heartbeat_s is None:
        assert suspects == [] and all(h["ranks"] == [] for h in hangs), (suspects, hangs)
        return
    assert [(s.rank, s.rule) for s in suspects] == [(5, "behind in step")]
    assert [(h["ranks"], h["rule"]) for h in hangs] == [([5], "behind in step")], hangs
    assert 0 < hangs[0]["at"] - truth["onset_us"]["hang"] / 1e6 <= 15.0, hangs[0]

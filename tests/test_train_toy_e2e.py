"""End to end: the README's main job, a real 2-rank torchrun training run, and both ranks' files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.conftest import REPO, data_records, jsonl_files, read_records
from tests.helpers import processes

pytest.importorskip("torch")


def torchrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # processes.run: on a timeout, kill the workers too (each is in its own session, not torchrun's
    # group).
    return processes.run(
        [launcher, "--nproc_per_node=2", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


@pytest.mark.slow
def test_two_rank_toy_training_writes_one_complete_file_per_rank(tmp_path):
    result = torchrun(
        "examples/train_toy.py",
        "--output-dir",
        str(tmp_path),
        "--steps",
        "12",
        "--gc-every",
        "5",
        "--checkpoint-every",
        "6",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    files = jsonl_files(tmp_path)
    assert [os.path.basename(f).split(".")[1] for f in files] == ["global_rank_0", "global_rank_1"]
    per_rank = {}
    for path in files:
        records = read_records(path)
        assert records[0]["log_type_name"] == "structured_logger_opened"
        assert (
            records[-1]["log_type_name"] == "structured_logger_closed"
            and records[-1]["dropped_records"] == 0
        )
        data = data_records(records)
        rank = data[0]["rank"]
        per_rank[rank] = data
        assert {r["world_size"] for r in data} == {2} and {r["local_rank"] for r in data} == {rank}
        names = Counter(r["log_type_name"] for r in data)
        for phase in ("data_fetch", "fwd_bwd", "forward", "backward", "optimizer"):
            assert names[f"{phase}_start"] == names[f"{phase}_end"] == 12, phase
        assert (
            names["gc_collect_start"] == 2
            and names["checkpoint_end"] == 2
            and names["checkpoint_saved"] == 2
        )
        assert names["training_start"] == names["training_end"] == 1
        assert names["metric_value"] == 36  # loss, num_tokens, lr per step
        assert {r["step"] for r in data if "step" in r} == set(range(1, 13))
        assert all(r.get("step_tags") == ["gc"] for r in data if r.get("step") in (5, 10))
        assert all("step_tags" not in r for r in data if r.get("step") in (1, 6))
        forward = [r for r in data if r["log_type_name"] == "forward_start"]
        fwd_bwd = {r["span_id"]: r for r in data if r["log_type_name"] == "fwd_bwd_start"}
        assert all(f["parent_span_id"] in fwd_bwd for f in forward)
        fetch = [r for r in data if r["log_type_name"] == "data_fetch_start"][0]
        # `fetch` is decorated with sl.log_trace_span: its caller is the call site in main, as
        # torchtitan's (issue 28).
        assert fetch["caller"].startswith("examples/train_toy.py:") and fetch["caller"].endswith(
            ":main"
        )
    assert set(per_rank) == {0, 1}
    # Same run id on both ranks, so step N is one trace across ranks.
    assert {r["run_id"] for r in per_rank[0]} == {r["run_id"] for r in per_rank[1]}
    trace_of = {
        rank: {r["step"]: r["trace_id"] for r in data if r["log_type_name"] == "fwd_bwd_start"}
        for rank, data in per_rank.items()
    }
    assert trace_of[0] == trace_of[1] and len(set(trace_of[0].values())) == 12


@pytest.mark.slow
def test_a_hung_run_whose_launcher_alone_is_killed_leaves_no_worker_running(tmp_path):
    """Kill only torchrun (as `kill -9 <launcher>` or `killpg` of its group would): the workers do
    not live on.

    torchrun starts each worker in its own session, so they survive their
    launcher; the hung rank ends itself once orphaned, and its peer, blocked
    in the all-reduce, fails when the hung rank's connection closes.
    """
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [
        launcher,
        "--nproc_per_node=2",
        "examples/train_toy.py",
        "--output-dir",
        str(tmp_path),
        "--steps",
        "8",
        "--hang-rank",
        "1",
        "--hang-step",
        "3",
    ]
    with open(tmp_path / "torchrun.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=REPO)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not any(
            b'"data_fetch_start"' in line and b'"step":3' in line
            for path in jsonl_files(tmp_path)
            if "rank_1" in path
            for line in open(path, "rb")
        ):
            assert time.monotonic() < deadline and process.poll() is None, (
                tmp_path / "torchrun.log"
            ).read_text()[-3000:]
            time.sleep(0.1)
        workers = processes.descendants(process.pid)
        assert len(workers) >= 2, workers
        process.kill()  # the launcher only
        process.wait(30)
        assert processes.wait_gone(workers, timeout=30) == []
    finally:  # whatever happened, leave nothing running
        for pid in [process.pid, *workers]:
            processes.kill_tree(pid)
        process.wait(30)

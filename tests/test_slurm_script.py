"""docs/slurm.md's batch script works (issue 28 item 8): a healthy job ends with its training's
status, a hung one is stopped by ``watch --exit-on`` and requeued.

The script is taken from the page as it is and run by bash as ``sbatch`` would, with SLURM's
variables set and two stand-ins on the PATH: ``srun`` runs its command here (its options
dropped), ``scontrol`` answers ``show hostnames`` and records ``requeue``. Everything else is real:
torchrun with 2 ranks on gloo (examples/train_toy.py), otel-titan watch, the files.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import processes
from tests.helpers.collector import free_port

_SRUN = """#!/bin/bash
# srun's stand-in: drop its options, run the command here.
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in -w|-N|-n) shift 2 ;; *) shift ;; esac
done
exec "$@"
"""
_SCONTROL = """#!/bin/bash
# scontrol's stand-in: this machine is the job's one node; a requeue is recorded.
case $1 in
  show) echo localhost ;;
  requeue) echo "requeue $2" >> "$SCONTROL_LOG" ;;
esac
"""


def _script() -> str:
    text = (REPO / "docs" / "slurm.md").read_text(encoding="utf-8")
    match = re.search(r"```bash\n(#!/bin/bash\n.*?)```", text, flags=re.S)
    assert match, "docs/slurm.md has no batch script"
    return match.group(1)


def _run_job(
    tmp_path: Path, train_args: str, timeout: float
) -> tuple[processes.subprocess.CompletedProcess[str], Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", _SRUN), ("scontrol", _SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "train.sbatch"
    script.write_text(_script())
    log = tmp_path / "scontrol.log"
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.prefix) / 'bin'}{os.pathsep}/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(tmp_path / "cache")),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NNODES": "1",
        "SLURM_RESTART_COUNT": "0",
        "RUN_ROOT": str(tmp_path / "runs"),
        "TRAIN_SCRIPT": str(REPO / "examples" / "train_toy.py"),
        "NPROC": "2",
        "TRAIN_ARGS": train_args,
        "RDZV_PORT": str(free_port()),
        "SCONTROL_LOG": str(log),
        "OTEL_TITAN_PROCESS_FIGURES": "0",
    }
    done = processes.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=timeout,
    )
    return done, tmp_path / "runs" / "4242", log


@pytest.mark.slow
def test_a_healthy_job_ends_with_the_training_s_status_and_no_requeue(tmp_path):
    done, run, log = _run_job(tmp_path, "--steps 6", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert len(list((run / "structured_logs").glob("*.jsonl"))) == 2
    assert (run / "watch.0.out").exists() and not log.exists()
    records = [
        json.loads(line)
        for line in next((run / "structured_logs").glob("*rank_0*.jsonl")).read_text().splitlines()
    ]
    # every attempt one run: the job's id
    assert {r["run_id"] for r in records if "run_id" in r} == {"slurm-4242"}


@pytest.mark.slow
def test_a_hung_rank_is_named_by_watch_the_job_is_stopped_and_requeued(tmp_path):
    done, run, log = _run_job(tmp_path, "--steps 200 --hang-rank 1 --hang-step 3", timeout=400)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    assert log.read_text() == "requeue 4242\n"
    alerts = [
        record
        for record in map(json.loads, (run / "watch.0.out").read_text().splitlines())
        if record["type"] == "alert"
    ]
    hang = [alert for alert in alerts if alert["kind"] == "hang"]
    assert hang and hang[-1]["ranks"] == [1], alerts  # the culprit, not a victim
    assert "requeueing" in done.stderr

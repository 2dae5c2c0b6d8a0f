"""Configuration once per job, its hash on every rank, drift named (structured_logger/run_config.py,
analysis/config_drift.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from otel_titan import structured_logger as sl
from otel_titan.analysis.model.config_drift import find_config_drift
from tests.conftest import REPO, data_records, jsonl_files, read_records
from tests.helpers import processes

RANK = textwrap.dedent(
    """
    import sys
    from otel_titan import structured_logger as sl
    out, rank, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sl.init_structured_logger("training", out, rank=rank, world_size=6, local_rank=rank % 3, run_id="drift-run")
    config = {"model": {"layers": 32, "dim": 4096}, "lr": lr, "steps": 1000, "dataset": "c4" * 200}
    sl.log_run_config("job_config", config)
    sl.log_run_config("host_facts", {"cpu": "same everywhere"}, per="host")
    sl.shutdown_structured_logger()
    """
)


def run_ranks(out, lrs: dict[int, float]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(out), str(rank), str(lr)],
            env=env,
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, lr in lrs.items()
    ]
    try:
        for process in started:
            _, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
    finally:
        for process in started:
            processes.kill_tree(process)


def config_records(out) -> dict[int, list[dict]]:
    by_rank = {}
    for path in jsonl_files(out):
        records = [
            r for r in data_records(read_records(path)) if r["log_type_name"] == "run_config"
        ]
        by_rank[records[0]["rank"]] = records
    return by_rank


def test_six_ranks_write_the_content_once_every_rank_its_hash_and_the_odd_rank_is_named(tmp_path):
    out = tmp_path / "run"
    run_ranks(out, {rank: (3e-4 if rank != 4 else 1e-3) for rank in range(6)})
    by_rank = config_records(out)
    assert sorted(by_rank) == list(range(6))
    job = {
        rank: next(r for r in records if r["config_name"] == "job_config")
        for rank, records in by_rank.items()
    }
    hashes = {rank: r["config_hash"] for rank, r in job.items()}
    assert len({hashes[r] for r in range(6) if r != 4}) == 1 and hashes[4] != hashes[0]
    # The common content once (by whichever rank claimed it first), the odd one once (rank 4
    # itself).
    written = [rank for rank, r in job.items() if "config" in r]
    assert len(written) == 2 and 4 in written
    common = next(job[rank]["config"] for rank in written if rank != 4)
    assert common["lr"] == 3e-4 and common["model"] == {"layers": 32, "dim": 4096}
    assert all(r["config_bytes"] > 400 for r in job.values())
    # Host facts: one host here, so once in all.
    host = [
        next(r for r in records if r["config_name"] == "host_facts") for records in by_rank.values()
    ]
    assert sum("config" in r for r in host) == 1 and len({r["config_hash"] for r in host}) == 1
    # Drift, named with the key that differs.
    (finding,) = find_config_drift(str(out))
    assert (
        finding.name == "job_config"
        and finding.odd_ranks == [4]
        and finding.differing_keys == ["lr"]
    )
    assert (
        finding.message
        == "configuration 'job_config': rank 4 differs from the other 5 ranks (in lr)"
    )
    # summarize says it too, from its one read (serial and with workers), in its text and --json.
    from otel_titan.analysis.model.collect import summarize_run
    from otel_titan.analysis.summarize.text import format_summary

    for jobs in (1, 2):
        summary = summarize_run(str(out), jobs=jobs)
        assert summary.config_drift == [finding.message], jobs
    assert "Configuration drift\n  configuration 'job_config': rank 4 differs" in format_summary(
        summary
    )
    assert summary.to_dict()["config_drift"] == [finding.message]


def test_no_majority_says_it_cannot_tell(tmp_path):
    out = tmp_path / "run"
    run_ranks(out, {0: 1.0, 1: 1.0, 2: 2.0, 3: 2.0})
    (finding,) = find_config_drift(str(out))
    assert finding.odd_ranks == [] and "cannot tell which ranks are the odd ones" in finding.message


def test_the_same_config_everywhere_has_no_finding_and_volume_is_once(tmp_path):
    out = tmp_path / "run"
    run_ranks(out, {rank: 3e-4 for rank in range(4)})
    assert find_config_drift(str(out)) == []
    job = [
        next(r for r in records if r["config_name"] == "job_config")
        for records in config_records(out).values()
    ]
    # the content once in the job; three ranks wrote only its hash
    assert sum("config" in r for r in job) == 1
    with_content = max(len(json.dumps(r)) for r in job)
    assert all(len(json.dumps(r)) < with_content - 400 for r in job if "config" not in r)


def test_bad_arguments_and_no_logger(logged):
    assert sl.log_run_config("job_config", {"a": 1}) is None
    with pytest.raises(ValueError, match="name must be"):
        sl.log_run_config("job config", {})
    with pytest.raises(ValueError, match="per must be"):
        sl.log_run_config("job_config", {}, per="rank")
    logged()
    digest = sl.log_run_config("job_config", {"b": [1, 2], "a": {"x": None}})
    # key order does not matter
    assert digest == sl.log_run_config("job_config", {"a": {"x": None}, "b": [1, 2]})
    records = [r for r in logged.finish() if r["log_type_name"] == "run_config"]
    # the same content twice: written once
    assert [("config" in r) for r in records] == [
        True,
        False,
    ]

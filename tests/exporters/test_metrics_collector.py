"""A real 2-rank torchrun job's metrics through a real collector (rotel-agent) to a backend, over
OTLP.

rotel-agent listens on free loopback ports and forwards to `OtlpSignalsReceiver`
(the backend); the toy training (examples/train_toy.py) runs under torchrun on
CPU with ``OTEL_METRICS_EXPORTER=otlp``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.conftest import REPO, jsonl_files, read_records
from tests.helpers import processes
from tests.helpers.collector import RotelCollector
from tests.helpers.otlp_signals_receiver import OtlpSignalsReceiver

pytest.importorskip("torch")


@pytest.fixture
def backend():
    receiver = OtlpSignalsReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def collector(backend, tmp_path):
    agent = RotelCollector(backend.endpoint, tmp_path / "rotel").start()
    yield agent
    agent.kill()


def torchrun_toy(
    out, env_extra: dict[str, str], steps: int = 6, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "TORCHELASTIC_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))
    }
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env_extra})
    command = [
        launcher,
        "--nproc_per_node=2",
        "examples/train_toy.py",
        "--output-dir",
        str(out),
        "--steps",
        str(steps),
        "--gc-every",
        "0",
        *args,
    ]
    return processes.run(
        command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )


def by_rank(points, metric):
    out = defaultdict(list)
    for point in points:
        if point.metric == metric:
            out[point.resource["titan.rank"]].append(point)
    return out


@pytest.mark.slow
def test_a_two_rank_job_loss_phase_times_memory_and_logs_arrive_per_rank_through_the_collector(
    collector, backend, tmp_path
):
    result = torchrun_toy(
        tmp_path / "run",
        {
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.grpc_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "OTEL_TITAN_PROCESS_FIGURES": "1",
            "OTEL_TITAN_METRICS_PER_RANK": "fwd_bwd",
            "OTEL_LOGS_EXPORTER": "otlp",
            "OTEL_BLRP_SCHEDULE_DELAY": "200",
        },
        6,
        "--checkpoint-every",
        "3",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # The final export happens at shutdown: wait until both ranks' last loss arrived.
    assert backend.wait_for(lambda b: set(by_rank(b.points(), "loss")) == {0, 1}), [
        p.metric for p in backend.points()
    ][:50]
    points = backend.points()
    loss = by_rank(points, "loss")
    assert all(p.kind == "gauge" for ps in loss.values() for p in ps)
    # One Resource per process: the rank, the run, and a service.instance.id unique per (rank,
    # attempt).
    instances = {
        p.resource["titan.rank"]: p.resource["service.instance.id"]
        for p in points
        if p.metric == "loss"
    }
    assert len(set(instances.values())) == 2
    assert len({p.resource["titan.run_id"] for p in points}) == 1 and {
        p.resource["titan.attempt"] for p in points
    } == {0}
    # Phase times: the allowlisted phase bucketed (exponential, OTLP's default here), the others as
    # sum and count; the last export has every step.
    fwd = by_rank(points, "titan.span.duration")
    for rank in (0, 1):
        final = max(
            (p for p in fwd[rank] if p.attributes["titan.span.name"] == "fwd_bwd"),
            key=lambda p: p.count,
        )
        assert (
            final.count == 6
            and final.kind == "exponential_histogram"
            and final.raw.scale >= 2
            and final.exemplars
        )
        summary = {
            p.attributes["titan.span.name"]
            for p in by_rank(points, "titan.span.duration.summary")[rank]
        }
        assert {"data_fetch", "optimizer", "forward", "backward"} <= summary
        # memory/rss_bytes under its semantic-convention name
        memory = by_rank(points, "process.memory.usage")[rank]
        assert memory and all(p.value > 10_000_000 for p in memory)
        completed = max(p.value for p in by_rank(points, "titan.steps.completed")[rank])
        assert completed == 5
    # Never the step, a tag or an id as an attribute.
    assert not any({"titan.step", "titan.step_tags", "span_id"} & set(p.attributes) for p in points)

    # The training log: rank 0's lines as OTLP logs, the checkpoint ones with their span's trace and
    # span id.
    assert backend.wait_for(
        lambda b: sum("checkpoint saved" in str(log.body) for log in b.logs()) == 2
    )
    logs = backend.logs()
    assert any(str(log.body).startswith("step 6/6 loss") for log in logs)
    (rank0,) = [path for path in jsonl_files(tmp_path / "run") if "global_rank_0" in path]
    spans = {
        (r["trace_id"], r["span_id"])
        for r in read_records(rank0)
        if r["log_type_name"] == "checkpoint_start"
    }
    saved = [log for log in logs if "checkpoint saved" in str(log.body)]
    assert {(log.trace_id, log.span_id) for log in saved} == spans and len(spans) == 2
    assert {log.resource["titan.rank"] for log in saved} == {0}

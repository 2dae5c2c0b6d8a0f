"""OTLP through a real collector (rotel-agent) to a real OTLP/gRPC receiver, over gRPC and HTTP.

Each test runs an instrumented workload as a real process configured only by
the standard OTEL_* variables, then compares what reached the backend with
the JSONL file the same process wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO, data_records, jsonl_files, read_records
from tests.helpers import processes
from tests.helpers.collector import RotelCollector, free_port
from tests.helpers.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.slow


@pytest.fixture
def backend():
    receiver = OtlpReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def collector(backend, tmp_path):
    running = RotelCollector(backend.endpoint, tmp_path / "rotel").start()
    yield running
    running.stop()


def otel_env(endpoint: str, protocol: str, **extra: str) -> dict[str, str]:
    # the suite's settings (tests/conftest.py)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("OTEL_", "TITAN_", "TORCHELASTIC_", "RANK", "WORLD_SIZE", "LOCAL_RANK")
        )
        or k in ("OTEL_TITAN_PROCESS_FIGURES", "OTEL_TITAN_STEP_ROLLUPS")
    }
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "TORCHELASTIC_RUN_ID": "otlp-test-run",
        }
    )
    env.update(extra)
    return env


def run_workload(
    out: Path, env: dict[str, str], *args: str, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tests.helpers.workload", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )
    return result, time.monotonic() - started


def jsonl_spans(out: Path) -> dict[str, list[dict]]:
    """span_id → that span's records, from the single JSONL file in `out`."""
    (path,) = jsonl_files(out)
    by_span: dict[str, list[dict]] = defaultdict(list)
    for record in data_records(read_records(path)):
        by_span[record["span_id"]].append(record)
    return by_span


@pytest.mark.parametrize(
    "protocol, endpoint_of", [("grpc", "grpc_endpoint"), ("http/protobuf", "http_endpoint")]
)
def test_a_run_reaches_the_backend_through_the_collector_as_in_the_jsonl(
    collector, backend, tmp_path, protocol, endpoint_of
):
    out = tmp_path / "run"
    result, _ = run_workload(
        out,
        otel_env(
            getattr(collector, endpoint_of),
            protocol,
            OTEL_SERVICE_NAME="toy-trainer",
            OTEL_RESOURCE_ATTRIBUTES="deployment.environment=ci",
        ),
        "--steps",
        "4",
    )
    assert result.returncode == 0, result.stderr
    expected = 1 + 4 * 5  # training_start; per step the four spans and the top-level loss scalar
    spans = backend.wait_for(lambda s: len(s) >= expected)
    time.sleep(0.3)  # anything beyond the expected count would show up in the Counter below
    spans = backend.spans()
    names = Counter(s.name for s in spans)
    # Spans; instants and scalars inside a span arrive as its events, top-level ones as zero-length
    # spans.
    assert names == Counter(
        {"step": 4, "data_fetch": 4, "fwd_bwd": 4, "optimizer": 4, "loss": 4, "training_start": 1}
    ), names
    by_id = {s.span_id: s for s in spans}

    # The Resource: service name from OTEL_SERVICE_NAME, identity, OTEL_RESOURCE_ATTRIBUTES merged.
    resource = spans[0].resource
    assert resource["service.name"] == "toy-trainer" and resource["deployment.environment"] == "ci"
    assert (
        resource["titan.rank"],
        resource["titan.world_size"],
        resource["titan.source"],
        resource["titan.run_id"],
    ) == (0, 1, "training", "otlp-test-run")
    assert resource["service.instance.id"] and resource["host.name"] and resource["process.pid"] > 0
    assert all(s.scope == "otel_titan" for s in spans)

    # Parent links and one trace per step.
    for span in spans:
        if span.name in ("data_fetch", "fwd_bwd", "optimizer"):
            parent = by_id[span.parent_span_id]
            assert parent.name == "step" and parent.trace_id == span.trace_id
            assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns
    steps = sorted((s for s in spans if s.name == "step"), key=lambda s: s.attributes["titan.step"])
    assert len({s.trace_id for s in steps}) == 4
    assert all(s.parent_span_id is None for s in steps)
    assert [s.attributes["titan.step"] for s in steps] == [1, 2, 3, 4]
    assert (
        steps[1].attributes["titan.step_tags"] == ("gc",)
        and "titan.step_tags" not in steps[0].attributes
    )
    assert all(s.attributes["titan.relative_step"] == s.attributes["titan.step"] for s in steps)

    # Durations: data_fetch sleeps 2 ms.
    assert all(s.duration_ms >= 2.0 for s in spans if s.name == "data_fetch")
    loss = [s for s in spans if s.name == "loss"]
    assert all(
        s.start_ns == s.end_ns and s.attributes["titan.record_kind"] == "scalar" for s in loss
    )

    # Events for instants and scalars on the enclosing span.
    for fwd in (s for s in spans if s.name == "fwd_bwd"):
        assert [e[0] for e in fwd.events] == ["grads_ready", "grad_norm"]
        assert fwd.events[1][2]["titan.metric.value"] == 1.5

    # The error: status ERROR with message, and an exception event.
    failed = [s for s in spans if s.name == "optimizer" and s.status_code == 2]
    assert len(failed) == 1 and failed[0].attributes["titan.step"] == 3
    assert failed[0].status_message == "RuntimeError: nan in optimizer state"
    (exception,) = failed[0].events
    assert exception[0] == "exception" and exception[2]["exception.type"] == "RuntimeError"
    assert failed[0].attributes["error.type"] == "RuntimeError"

    # The JSONL file holds the same spans with the same ids.
    records = jsonl_spans(out)
    for span in spans:
        mine = records[span.span_id]
        assert {r["trace_id"] for r in mine} == {span.trace_id}
        assert {r["parent_span_id"] for r in mine} == {span.parent_span_id}
        if span.name in ("step", "data_fetch", "fwd_bwd", "optimizer"):
            end = [r for r in mine if r["log_type_name"] == f"{span.name}_end"][0]
            assert end["value"] == pytest.approx(span.duration_ms, abs=0.002)
            assert mine[0]["time_us"] == span.start_ns // 1000
    instants = [r for rs in records.values() for r in rs if r["log_type_name"] == "grads_ready"]
    assert len(instants) == 4 and all(
        records[i["parent_span_id"]][0]["log_type_name"] == "fwd_bwd_start" for i in instants
    )


@pytest.mark.skipif(
    not os.path.exists(os.path.join(os.path.dirname(sys.executable), "torchrun")),
    reason="needs torch",
)
def test_two_torchrun_ranks_share_one_trace_per_step(collector, backend, tmp_path):
    env = otel_env(collector.grpc_endpoint, "grpc", OMP_NUM_THREADS="1")
    env.pop("TORCHELASTIC_RUN_ID")  # torchrun sets it, the same for both ranks
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    result = processes.run(  # on a timeout, kills the workers too: each is in its own session
        [
            torchrun,
            "--nproc_per_node=2",
            "examples/train_toy.py",
            "--output-dir",
            str(tmp_path / "run"),
            "--steps",
            "5",
            "--gc-every",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    spans = backend.wait_for(lambda s: sum(x.name == "fwd_bwd" for x in s) >= 10)
    fwd = [s for s in spans if s.name == "fwd_bwd"]
    assert len(fwd) == 10
    by_step = defaultdict(set)
    for span in fwd:
        by_step[span.attributes["titan.step"]].add((span.trace_id, span.resource["titan.rank"]))
    for step, members in by_step.items():
        assert {rank for _, rank in members} == {0, 1}, step
        assert len({trace for trace, _ in members}) == 1, step  # both ranks, one trace
    assert len({next(iter(m))[0] for m in by_step.values()}) == 5
    assert len({s.resource["service.instance.id"] for s in spans}) == 2
    children = [s for s in spans if s.name in ("forward", "backward")]
    fwd_ids = {s.span_id: s for s in fwd}
    assert all(fwd_ids[c.parent_span_id].trace_id == c.trace_id for c in children)


def test_killing_the_collector_mid_run_costs_training_nothing_and_jsonl_loses_nothing(
    collector, backend, tmp_path
):
    out = tmp_path / "run"
    ready = tmp_path / "ready"
    env = otel_env(collector.grpc_endpoint, "grpc")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.helpers.workload",
            str(out),
            "--steps",
            "150",
            "--sleep-ms",
            "15",
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    started = time.monotonic()
    while not ready.exists() and process.poll() is None:
        time.sleep(0.05)
    backend.wait_for(lambda s: len(s) > 0, timeout=10)
    delivered_before = len(backend.spans())
    collector.kill()
    stdout, stderr = process.communicate(timeout=120)
    elapsed = time.monotonic() - started
    assert process.returncode == 0, stderr
    loop_s = json.loads(stdout.strip().splitlines()[-1])["loop_s"]
    assert delivered_before > 0  # streaming worked until the kill

    records = read_records(jsonl_files(out)[0])
    closing = records[-1]
    assert (
        closing["log_type_name"] == "structured_logger_closed"
        and closing["dropped_records"] == 0
        and closing["failed_records"] == 0
    )
    step_ends = [r for r in records if r["log_type_name"] == "step_end"]
    assert len(step_ends) == 150
    # Full speed: a step is a 15 ms sleep plus microseconds of logging; an exporter
    # waiting for the dead collector would show up as steps of seconds (its timeout is 10 s).
    assert max(r["value"] for r in step_ends) < 1000
    assert loop_s < 150 * 0.015 + 10
    # And the process did not hang at exit on the dead collector (shutdown gives it 3 s).
    assert elapsed - loop_s < 20


def test_shutdown_with_an_unreachable_collector_is_bounded(tmp_path):
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result, elapsed = run_workload(
        tmp_path / "run", otel_env(nobody, "grpc", OTEL_BSP_SCHEDULE_DELAY="60000"), "--steps", "20"
    )
    assert result.returncode == 0, result.stderr
    loop_s = json.loads(result.stdout.strip().splitlines()[-1])["loop_s"]
    assert elapsed - loop_s < 15  # interpreter start + at most ~3 s for the OTLP exporter at exit
    closing = read_records(jsonl_files(tmp_path / "run")[0])[-1]
    assert closing["log_type_name"] == "structured_logger_closed" and closing["written_records"] > 0
    assert result.stderr.count("Failed to export") <= 2  # not a flood


def test_sdk_disabled_keeps_jsonl_and_sends_nothing(collector, backend, tmp_path):
    result, _ = run_workload(
        tmp_path / "run",
        otel_env(collector.grpc_endpoint, "grpc", OTEL_SDK_DISABLED="true"),
        "--steps",
        "2",
    )
    assert result.returncode == 0, result.stderr
    time.sleep(1.0)
    assert backend.spans() == []
    assert len(jsonl_spans(tmp_path / "run")) > 0


def test_console_exporter_prints_spans_as_json(tmp_path):
    env = otel_env("http://unused:1", "grpc", OTEL_TRACES_EXPORTER="console")
    result, _ = run_workload(tmp_path / "run", env, "--steps", "1")
    assert result.returncode == 0, result.stderr
    assert '"name": "data_fetch"' in result.stdout and '"titan.step": 1' in result.stdout


def test_explicit_handler_list_wins_over_otel_traces_exporter(collector, backend, tmp_path):
    env = otel_env(
        collector.grpc_endpoint,
        "grpc",
        OTEL_TITAN_HANDLERS="otel_titan.exporters.jsonl.register_jsonl_handler",
    )
    result, _ = run_workload(tmp_path / "run", env, "--steps", "2")
    assert result.returncode == 0, result.stderr
    time.sleep(1.0)
    assert backend.spans() == []


def test_slow_backend_does_not_slow_training(tmp_path):
    slow = OtlpReceiver(delay_s=2.0)  # answers every export after 2 s
    try:
        env = otel_env(
            slow.endpoint,
            "grpc",
            OTEL_BSP_SCHEDULE_DELAY="100",
            OTEL_BSP_MAX_EXPORT_BATCH_SIZE="16",
        )
        result, _ = run_workload(tmp_path / "run", env, "--steps", "60", "--sleep-ms", "10")
        assert result.returncode == 0, result.stderr
        step_ends = [
            r
            for r in read_records(jsonl_files(tmp_path / "run")[0])
            if r["log_type_name"] == "step_end"
        ]
        assert len(step_ends) == 60 and max(r["value"] for r in step_ends) < 1000
        assert len(slow.spans()) > 0
    finally:
        slow.stop()


def test_sigterm_sends_the_hung_phase_to_the_backend_marked_incomplete(
    collector, backend, tmp_path
):
    import signal

    code = """
import sys, time
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1])
sl.set_step(812)
with sl.log_trace_span("optimizer"):
    pass
with sl.log_trace_span("data_fetch"):
    print("hung", flush=True)
    time.sleep(120)
"""
    env = otel_env(collector.grpc_endpoint, "grpc", OTEL_BSP_SCHEDULE_DELAY="60000")
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert process.stdout.readline().strip() == "hung"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    spans = backend.wait_for(lambda s: {"optimizer", "data_fetch"} <= {x.name for x in s})
    fetch = [s for s in spans if s.name == "data_fetch"][0]
    assert fetch.attributes["titan.incomplete"] is True and fetch.attributes["titan.step"] == 812
    optimizer = [s for s in spans if s.name == "optimizer"][0]
    assert "titan.incomplete" not in optimizer.attributes and optimizer.trace_id == fetch.trace_id


def test_blackholed_collector(tmp_path):
    # A collector that accepts connections and never answers (a black hole).
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted = []
    stop = threading.Event()

    def accept_and_ignore():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept_and_ignore, daemon=True)
    thread.start()
    try:
        for protocol in ("grpc", "http/protobuf"):
            out = tmp_path / protocol.replace("/", "-")
            env = otel_env(f"http://127.0.0.1:{server.getsockname()[1]}", protocol)
            result, elapsed = run_workload(out, env, "--steps", "60", "--sleep-ms", "10")
            assert result.returncode == 0, result.stderr
            loop_s = json.loads(result.stdout.strip().splitlines()[-1])["loop_s"]
            step_ends = [
                r for r in read_records(jsonl_files(out)[0]) if r["log_type_name"] == "step_end"
            ]
            assert len(step_ends) == 60 and max(r["value"] for r in step_ends) < 1000
            assert elapsed - loop_s < 20  # exit is bounded even though every request hangs
        assert accepted  # the exporters did connect to the black hole
    finally:
        stop.set()
        thread.join(5)
        for connection in accepted:
            connection.close()
        server.close()


_BAD_NAMES = r"""
import os, sys
from otel_titan import structured_logger as sl

sl.init_structured_logger("training", sys.argv[1])
sl.set_step(1)
for i in range(50):
    with sl.log_trace_span(f"load_{i}"):
        pass
# A file name that is not UTF-8, as os.listdir / os.fsdecode give it (surrogateescape):
bad = os.fsdecode(b"shard_\xff\xfe.bin")
with sl.log_trace_span(bad, description=bad):
    sl.log_trace_instant("opened " + bad)  # becomes an event of the span
sl.shutdown_structured_logger()
"""


@pytest.mark.parametrize(
    "protocol, endpoint_of", [("grpc", "grpc_endpoint"), ("http/protobuf", "http_endpoint")]
)
def test_one_span_name_that_is_not_utf8_loses_nothing_else_and_arrives_escaped(
    collector, backend, tmp_path, protocol, endpoint_of
):
    # Issue 18 item 15: one such name used to fail the whole batch (0 of 51 spans arrived).
    out = tmp_path / "run"
    # one batch, sent at shutdown
    env = otel_env(getattr(collector, endpoint_of), protocol, OTEL_BSP_SCHEDULE_DELAY="60000")
    result = processes.run(
        [sys.executable, "-c", _BAD_NAMES, str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    spans = backend.wait_for(lambda s: len(s) >= 51)
    time.sleep(0.3)
    spans = backend.spans()
    assert len(spans) == 51, sorted(s.name for s in spans)
    escaped = (
        "shard_\\udcff\\udcfe.bin"  # the text the JSONL file holds for it once read back, escaped
    )
    (bad,) = [s for s in spans if s.name.startswith("shard_")]
    assert bad.name == escaped and bad.attributes["titan.description"] == escaped
    assert [e[0] for e in bad.events] == ["opened " + escaped]
    assert {s.name for s in spans} - {bad.name} == {f"load_{i}" for i in range(50)}
    assert "could not be encoded" not in result.stderr  # nothing was left out
    # The JSONL file has the same 51 spans, the name as its JSON escape.
    names = {r["log_type_name"] for rs in jsonl_spans(out).values() for r in rs}
    assert (
        os.fsdecode(b"shard_\xff\xfe.bin") + "_end" in names
        and len([n for n in names if n.endswith("_end")]) == 51
    )

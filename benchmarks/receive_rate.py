"""How many records a second `otel-titan watch --otlp` takes in, and what each costs its process.

The real command (``watch --otlp 127.0.0.1:0 --spool DIR --json``) in a fresh process; `--senders`
client processes post OTLP/HTTP protobuf log requests of `--batch` records each (the records
stream's shape: a JSONL line of ~330 bytes as the body, its file, seq and kind as attributes; the
SDK's exporter sends 512 a request), on keep-alive connections, as fast as the answers come, for
`--seconds`. Reported: records/s answered (written to the spool: an answer means written), and the
watch process's CPU per record (decode + spool + its refreshes following the spool), as the median
of `--rounds` rounds; and, on the rank's side, the CPU a record of the records stream's sender
thread, its bytes written directly and through the SDK. Timings are on whatever machine runs it,
with whatever else runs there: the load average is printed beside them.

Usage::

    python benchmarks/receive_rate.py                       # 3 rounds of 10 s
    python benchmarks/receive_rate.py --senders 4 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def request_body(rank: int, first_seq: int, count: int) -> bytes:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    request = ExportLogsServiceRequest()
    scope = request.resource_logs.add().scope_logs.add()
    scope.scope.name = "otel_titan.records"
    name = f"training.global_rank_{rank}.20260101-000000-bench{rank:02d}.jsonl"
    for seq in range(first_seq, first_seq + count):
        record = {
            "time": 1767225600,
            "time_ms": 1767225600000,
            "time_us": 1767225600000000 + seq,
            "log_type": "event",
            "log_type_name": "data_fetch_end",
            "event_name": None,
            "log_level": "INFO",
            "message": "data_fetch",
            "value": 12.5,
            "step": seq // 4,
            "span_id": f"{seq:016x}",
            "parent_span_id": None,
            "trace_id": "0" * 32,
            "caller": "train.py:42:main",
            "seq_id": seq,
            "schema_version": 1,
            "rank": rank,
            "global_rank": rank,
            "local_rank": rank % 8,
            "world_size": 1024,
            "source": "training",
            "host_name": "node-001",
            "pid": 4242,
            "run_id": "bench",
            "attempt": 0,
            "job_id": None,
            "logger_name": "otel_titan.structured_logger",
        }
        log = scope.log_records.add()
        log.time_unix_nano = record["time_us"] * 1000
        log.body.string_value = json.dumps(record, separators=(",", ":"))
        for key, value in (("otel_titan.file", name), ("otel_titan.record", "data_fetch_end")):
            attribute = log.attributes.add()
            attribute.key, attribute.value.string_value = key, value
        attribute = log.attributes.add()
        attribute.key, attribute.value.int_value = "otel_titan.seq", seq
    return request.SerializeToString()


def sender(
    endpoint: str,
    rank: int,
    batch: int,
    seconds: float,
    max_requests: int,
    ready: Any,
    out: multiprocessing.Queue,
) -> None:
    import requests

    session = requests.Session()
    # Built before the clock starts (the senders share the machine with the watch: their encoding is
    # not its cost).
    bodies = [request_body(rank, 1 + n * batch, batch) for n in range(max_requests)]
    ready.wait()
    sent = 0
    deadline = time.monotonic() + seconds
    for body in bodies:
        if time.monotonic() >= deadline:
            break
        response = session.post(
            endpoint + "/v1/logs",
            data=body,
            headers={"Content-Type": "application/x-protobuf"},
            timeout=30,
        )
        response.raise_for_status()
        sent += batch
    out.put((sent, time.monotonic()))


def one_round(senders: int, batch: int, seconds: float, max_requests: int) -> tuple[float, float]:
    spool = tempfile.mkdtemp(prefix="receive-rate-")
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "otel_titan.cli",
            "watch",
            "--otlp",
            "127.0.0.1:0",
            "--spool",
            spool,
            "--json",
            "--interval",
            "1",
            "--no-trigger",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    try:
        line = watch.stderr.readline()  # type: ignore[union-attr]
        endpoint = line.split(" on ", 1)[1].split(";", 1)[0]
        out: multiprocessing.Queue = multiprocessing.Queue()
        ready = multiprocessing.Event()
        workers = [
            multiprocessing.Process(
                target=sender, args=(endpoint, rank, batch, seconds, max_requests, ready, out)
            )
            for rank in range(senders)
        ]
        for worker in workers:
            worker.start()
        time.sleep(1.0 + max_requests * batch / 40_000)  # the senders build their requests
        before = _cpu(watch.pid)
        started = time.monotonic()
        ready.set()
        results = [out.get() for _ in workers]
        total = sum(sent for sent, _ in results)
        elapsed = max(end for _, end in results) - started
        for worker in workers:
            worker.join()
        cpu = _cpu(watch.pid) - before
    finally:
        watch.terminate()
        watch.wait(10)
        subprocess.run(["rm", "-rf", spool], check=False)
    return total / elapsed, cpu / total * 1e6


def rank_side(rounds: int = 7, batch: int = 512) -> tuple[float, float]:
    """CPU µs a record of a rank's records-stream sender thread: its bytes written directly, and
    through the SDK's log records (medians)."""
    import orjson
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.sdk.resources import Resource

    from otel_titan.core.identity import discover_identity
    from otel_titan.exporters.otlp_records import OtlpRecordsExporter

    class Wire:
        fast = True

        def export_request(self, count: int, data: bytes) -> bool:
            return True

        def shutdown(self) -> None:
            pass

    class Sdk:
        def export(self, records: Any) -> Any:
            encode_logs(records).SerializeToString()
            return type("Result", (), {"name": "SUCCESS"})()

        def shutdown(self) -> None:
            pass

    identity = discover_identity(
        "training", environ={"RANK": "3", "WORLD_SIZE": "1024", "TORCHELASTIC_RUN_ID": "bench"}
    )
    line = (
        orjson.dumps(
            {
                "time": 1,
                "time_ms": 1,
                "time_us": 1767225600000000,
                "log_type": "event",
                "log_type_name": "data_fetch_end",
                "event_name": None,
                "log_level": "INFO",
                "message": "data_fetch",
                "value": 12.5,
                "step": 4,
                "span_id": "a" * 16,
                "parent_span_id": None,
                "trace_id": "0" * 32,
                "caller": "train.py:42:main",
                "seq_id": 9,
                "rank": 3,
                "world_size": 1024,
                "source": "training",
                "host_name": "node-001",
                "pid": 4242,
                "run_id": "bench",
            }
        )
        + b"\n"
    )
    exporters = [
        OtlpRecordsExporter(
            transport,
            Resource.create({"service.name": "bench"}),
            identity,
            "training.global_rank_3.bench.jsonl",
            opened={},
        )
        for transport in (Wire(), Sdk())
    ]
    samples: list[list[float]] = [[], []]
    for _ in range(rounds):  # interleaved rounds: a load change hits both alike
        for index, exporter in enumerate(exporters):
            started = time.process_time()
            for _ in range(10):
                exporter._send([line] * batch)
            samples[index].append((time.process_time() - started) / (10 * batch) * 1e6)
    for exporter in exporters:
        exporter.discard()
    return statistics.median(samples[0]), statistics.median(samples[1])


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--requests",
        type=int,
        default=200,
        help="requests built per sender (the most it sends in a round)",
    )
    args = parser.parse_args()
    rates, costs = [], []
    for _ in range(args.rounds):
        rate, cost = one_round(args.senders, args.batch, args.seconds, args.requests)
        rates.append(rate)
        costs.append(cost)
        print(f"  round: {rate:,.0f} records/s, {cost:.1f} µs of watch CPU per record", flush=True)
    wire, sdk = rank_side()
    print(
        f"rank: the records stream's sender thread, {wire:.1f} µs of CPU a record (its OTLP bytes "
        f"written directly; {sdk:.1f} µs through the SDK's log records)"
    )
    print(
        f"watch --otlp: {statistics.median(rates):,.0f} records/s (median of {args.rounds} "
        f"rounds, {args.senders} senders, {args.batch} records a request), "
        f"{statistics.median(costs):.1f} µs of its CPU per record; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()

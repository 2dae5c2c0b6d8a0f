"""A real Prometheus server scrapes the ``prometheus`` exporter of a real 2-rank torchrun job.

Debian's ``prometheus`` package (scripts/setup-prometheus.sh installs it) runs on
a free loopback port with its own scrape config: one target per rank (the
exporter's port plus the local rank). The test then asks Prometheus's HTTP API,
as a Grafana panel would, for the loss and the phase durations of each rank,
joining ``target_info`` for the rank label (docs/collectors.md).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from otel_titan.core.host_figures import HostFigures
from tests.exporters.test_metrics_collector import torchrun_toy
from tests.helpers import processes
from tests.helpers.collector import free_port

pytest.importorskip("torch")

PROMETHEUS = shutil.which("prometheus")


def _two_free_ports() -> int:
    """A port P with P+1 free too (rank 0 and rank 1 of the host)."""
    for _ in range(50):
        base = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base
    raise RuntimeError("no two adjacent free ports on loopback")


class PrometheusServer:
    def __init__(self, workdir: Path, targets: list[str]) -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n"
            "scrape_configs:\n  - job_name: titan\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        self.log = open(workdir / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
        self.workdir = workdir
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start: {(workdir / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)
        # Ready is not scraping: Prometheus hands discovered targets to its scrapers at most every 5 s, so a
        # job shorter than that (a quiet machine runs the toy in under 2 s) would end before its first scrape.
        # Wait until every target has been tried once (down, as nothing listens yet) before the job starts.
        deadline = time.monotonic() + 30
        while not self._all_tried(len(targets)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus never scraped its targets: {(workdir / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def _all_tried(self, count: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/targets", timeout=1) as response:
                active = json.load(response)["data"]["activeTargets"]
        except OSError:
            return False
        return len(active) == count and all(not t.get("lastScrape", "").startswith("0001-") for t in active)

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.process.poll() is None:
            processes.kill_tree(self.process, timeout=10)
        self.log.close()


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary: scripts/setup-prometheus.sh installs Debian's package (as root with apt-get)")
def test_prometheus_scrapes_loss_and_phase_times_of_each_rank(tmp_path):
    base = _two_free_ports()
    server = PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"])
    try:
        # Long enough for several scrapes at 250 ms (each rank's endpoint lives as long as its process).
        result = torchrun_toy(
            tmp_path / "run",
            {
                "OTEL_METRICS_EXPORTER": "prometheus",
                "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                "OTEL_EXPORTER_PROMETHEUS_PORT": str(base),
                "OTEL_TITAN_PROCESS_FIGURES": "1",
                "OTEL_TITAN_METRICS_PER_RANK": "fwd_bwd",
            },
            steps=400,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        rank_of = 'on (job, instance) group_left (titan_rank) last_over_time(target_info[10m])'
        loss = server.query(f"last_over_time(loss[10m]) * {rank_of}")
        assert sorted(r["metric"]["titan_rank"] for r in loss) == ["0", "1"], loss
        assert all(0 <= float(r["value"][1]) < 100 for r in loss)
        # p99 of the allowlisted phase by rank, from the buckets (a Grafana recipe of docs/collectors.md).
        p99 = server.query(f"histogram_quantile(0.99, sum by (le, instance, job) (last_over_time(titan_span_duration_milliseconds_bucket{{titan_span_name='fwd_bwd'}}[10m]))) * {rank_of}")
        assert sorted(r["metric"]["titan_rank"] for r in p99) == ["0", "1"], p99
        assert all(0 < float(r["value"][1]) < 60_000 for r in p99)
        # The other phases: count and mean per rank.
        counts = server.query(f"last_over_time(titan_span_duration_summary_milliseconds_count{{titan_span_name='data_fetch'}}[10m]) * {rank_of}")
        assert sorted(r["metric"]["titan_rank"] for r in counts) == ["0", "1"] and all(float(r["value"][1]) >= 1 for r in counts), counts
        memory = server.query(f"last_over_time(memory_rss_bytes[10m]) * {rank_of}")
        assert sorted(r["metric"]["titan_rank"] for r in memory) == ["0", "1"] and all(float(r["value"][1]) > 10e6 for r in memory)
        # The host's figures: once per host (local rank 0), one series each. They are both a gauge of the host's
        # (host_metrics.py, `host.cpu_pressure_some_pct`) and a scalar of each step (`host/cpu_pressure_some_pct`):
        # both names become `host_cpu_pressure_some_pct` here, and must not arrive as two series of one figure.
        if HostFigures().read().get("host/cpu_pressure_some_pct") is not None:  # Linux PSI readable here
            pressure = server.query(f"last_over_time(host_cpu_pressure_some_pct[10m]) * {rank_of}")
            assert [r["metric"]["titan_rank"] for r in pressure] == ["0"], pressure
    finally:
        server.stop()

"""A real Prometheus server scrapes the ``prometheus`` exporter of a real 2-rank torchrun job.

Debian's ``prometheus`` package (scripts/setup-prometheus.sh installs it) runs on
a free loopback port with its own scrape config: one target per rank (the
exporter's port plus the local rank). The test then asks Prometheus's HTTP API,
as a Grafana panel would, for the loss and the phase durations of each rank,
joining ``target_info`` for the rank label (docs/collectors.md).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from otel_titan import structured_logger as sl
from otel_titan.core.host_figures import HostFigures
from tests.conftest import REPO
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
    """A real Prometheus on a free port scraping `targets` every 250 ms; `rules`: a rule file's text
    (evaluated every 250 ms); `federate`: scrape the targets' ``/federate`` for the per-host
    aggregates (collector-config/prometheus/central-prometheus.yaml)."""

    def __init__(
        self, workdir: Path, targets: list[str], rules: str | None = None, federate: bool = False
    ) -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        text = "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n  evaluation_interval: 250ms\n"
        if rules is not None:
            (workdir / "rules.yaml").write_text(rules)
            text += "rule_files:\n  - rules.yaml\n"
        text += "scrape_configs:\n  - job_name: titan\n"
        if federate:
            text += "    honor_labels: true\n    metrics_path: /federate\n    params:\n      'match[]': ['{__name__=~\"host:.*\"}']\n"
        text += f"    static_configs:\n      - targets: {json.dumps(targets)}\n"
        config.write_text(text)
        self.log = open(workdir / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
        self.workdir = workdir
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/-/ready", timeout=1
                ) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"prometheus did not start: {(workdir / 'prometheus.log').read_text()[-2000:]}"
                )
            time.sleep(0.2)
        # Ready is not scraping: Prometheus hands discovered targets to its scrapers at most every 5
        # s, so a job shorter than that (a quiet machine runs the toy in under 2 s) would end before
        # its first scrape. Wait until every target has been tried once (down, as nothing listens
        # yet) before the job starts.
        deadline = time.monotonic() + 30
        while not self._all_tried(len(targets)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    "prometheus never scraped its targets: "
                    f"{(workdir / 'prometheus.log').read_text()[-2000:]}"
                )
            time.sleep(0.2)

    def _all_tried(self, count: int) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/api/v1/targets", timeout=1
            ) as response:
                active = json.load(response)["data"]["activeTargets"]
        except OSError:
            return False
        return len(active) == count and all(
            not t.get("lastScrape", "").startswith("0001-") for t in active
        )

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.process.poll() is None:
            processes.kill_tree(self.process, timeout=10)
        self.log.close()


def doc_recipes() -> list[tuple[str, str]]:
    """(comment, query) of every recipe in docs/metrics.md's promql blocks, in order."""
    text = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    out: list[tuple[str, str]] = []
    for block in re.findall(r"```promql\n(.*?)```", text, flags=re.S):
        for chunk in block.strip().split("\n\n"):
            lines = chunk.strip().splitlines()
            comment = " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))
            out.append((comment, "\n".join(line for line in lines if not line.startswith("#"))))
    return out


@pytest.mark.slow
@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary: scripts/setup-prometheus.sh installs Debian's package (as root with apt-get)",
)
def test_prometheus_scrapes_loss_and_phase_times_of_each_rank(tmp_path):
    """Every recipe of docs/metrics.md against a real Prometheus scraping a 2-rank job whose rank 1
    is slow in data_fetch; that Prometheus also evaluates the per-host rules of
    collector-config/prometheus/, federated by a second (central) one; the series of a rank are
    those docs/metrics.md counts."""
    recipes = doc_recipes()
    assert len(recipes) >= 10 and any("straggler" in comment for comment, _ in recipes)
    base = _two_free_ports()
    rules = (
        (REPO / "collector-config" / "prometheus" / "host-rules.yaml")
        .read_text()
        .replace("interval: 15s", "interval: 250ms")
    )
    server = PrometheusServer(
        tmp_path / "prometheus", [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"], rules=rules
    )
    central = PrometheusServer(tmp_path / "central", [f"127.0.0.1:{server.port}"], federate=True)
    finished: list[Any] = []
    env = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(base),
        "OTEL_TITAN_PROCESS_FIGURES": "1",
        "OTEL_TITAN_METRICS_PER_RANK": "fwd_bwd,data_fetch",
    }
    # Each rank's endpoint lives as long as its process: the recipes are asked while the job runs
    # (at least 400 x 30 ms of rank 1's data_fetch), as a dashboard would.
    job = threading.Thread(
        target=lambda: finished.append(
            torchrun_toy(tmp_path / "run", env, 400, "--slow-rank", "1", "--slow-ms", "30")
        )
    )
    job.start()
    try:
        rank_of = "on (job, instance) group_left (titan_rank) target_info"
        progress = _wait_for(
            server,
            f"titan_steps_completed_total * {rank_of}",
            lambda r: len(r) == 2 and all(float(x["value"][1]) >= 40 for x in r) or bool(finished),
            timeout=240,
        )
        assert not finished, "the job ended before Prometheus saw 40 steps of both ranks"
        assert len(progress) == 2, progress
        answers = {}
        for comment, query in recipes:
            result = server.query(query)  # raises unless Prometheus accepted the query
            answers[comment] = result
            if not comment.startswith("(alert)"):
                assert result, f"{comment}: no series for\n{query}"
        assert (
            not answers["(alert) Ranks that dropped records"]
            and not answers["(alert) A NaN or infinite loss now"]
        )
        loss = answers["Loss by rank"]
        assert sorted(r["metric"]["titan_rank"] for r in loss) == ["0", "1"] and all(
            0 <= float(r["value"][1]) < 100 for r in loss
        ), loss
        p99 = next(
            result
            for comment, result in answers.items()
            if comment.startswith("p99 of fwd_bwd by rank")
        )
        assert sorted(r["metric"]["titan_rank"] for r in p99) == ["0", "1"] and all(
            0 < float(r["value"][1]) < 60 for r in p99
        ), p99
        (straggler,) = next(
            result for comment, result in answers.items() if comment.startswith("The straggler")
        )
        # 30 ms added on rank 1
        assert straggler["metric"]["titan_rank"] == "1" and float(straggler["value"][1]) >= 0.025, (
            straggler
        )
        memory = answers["Resident memory by rank"]
        assert sorted(r["metric"]["titan_rank"] for r in memory) == ["0", "1"] and all(
            float(r["value"][1]) > 10e6 for r in memory
        )
        by_host = next(
            result
            for comment, result in answers.items()
            if comment.startswith("Mean time of every other phase")
        )
        assert {"optimizer", "forward"} <= {r["metric"]["titan_span_name"] for r in by_host}, (
            by_host
        )
        # The host's figures: once per host (local rank 0), one series each. They are both a gauge
        # of the host's (host_metrics.py, `host.cpu_pressure_some_pct`) and a scalar of each step
        # (`host/cpu_pressure_some_pct`): both names become `host_cpu_pressure_some_pct` here, and
        # must not arrive as two series of one figure.
        # Linux PSI readable here
        if HostFigures().read().get("host/cpu_pressure_some_pct") is not None:
            pressure = server.query(f"host_cpu_pressure_some_pct * {rank_of}")
            assert [r["metric"]["titan_rank"] for r in pressure] == ["0"], pressure
        # The series of one rank (rank 1: no host figures), as docs/metrics.md counts them.
        rank1 = f'instance="127.0.0.1:{base + 1}"'
        own = {
            r["metric"]["__name__"]
            for r in server.query(f'{{{rank1}, __name__=~"titan_.*|process_.*|target_info"}}')
        }
        scalars = len(
            server.query(
                f'{{{rank1}, __name__!~"titan_.*|process_.*|target_info|up|scrape_.*|host:.*"}}'
            )
        )
        figures = len(server.query(f'{{{rank1}, __name__=~"process_.*|titan_process_.*"}}'))
        allowlisted = len(server.query(f"titan_span_duration_seconds_count{{{rank1}}}"))
        others = len(server.query(f"titan_span_duration_summary_seconds_count{{{rank1}}}"))
        # scraped, not the rules' outputs
        series = server.query(f'{{{rank1}, __name__!~"up|scrape_.*|host:.*"}}')
        total = len(series)
        names = sorted({r["metric"]["__name__"] for r in series})
        assert allowlisted == 2 and others >= 3 and figures == 5 and scalars >= 2, (
            own,
            scalars,
            figures,
            allowlisted,
            others,
        )
        assert total == scalars + figures + 2 + 4 + 66 + 66 * allowlisted + 3 * others + 1, (
            total,
            scalars,
            others,
            names,
        )
        # The per-host aggregates, federated: the central server holds the host's slow rank and its
        # step-time buckets. (One series per host and phase; when the slowest rank changes, the
        # previous one's goes stale a scrape later.)
        slowest = _wait_for(
            central,
            'topk(1, host:titan_span_duration_seconds:slowest_rank_mean1m{titan_span_name="data_fetch"})',
            bool,
            timeout=30,
        )
        assert [r["metric"]["titan_rank"] for r in slowest] == ["1"], slowest
        p99 = central.query(
            "histogram_quantile(0.99, host:titan_step_duration_seconds_bucket:rate1m)"
        )
        assert len(p99) == 1 and 0 < float(p99[0]["value"][1]) < 60, p99
        held = float(central.query('count({__name__=~"host:.*"})')[0]["value"][1])
        assert held < 66 * 4 + 20, held  # per host, whatever its ranks: not the ranks' thousands
        # no per-rank series reach the central server
        assert not central.query("titan_step_duration_seconds_bucket")
    finally:
        job.join(300)
        server.stop()
        central.stop()
    assert finished and finished[0].returncode == 0, (
        finished[0].stderr[-3000:] if finished else "torchrun did not finish"
    )


def _wait_for(
    server: PrometheusServer, promql: str, ready: Any, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Query until `ready(result)` holds (a scrape every 250 ms), and return the last result."""
    deadline = time.monotonic() + timeout
    while True:
        result = server.query(promql)
        if ready(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.25)


@pytest.fixture
def scraped_logger(tmp_path, monkeypatch):
    """A logger in this process serving /metrics on a free port, and a real Prometheus scraping
    it."""
    port = free_port()
    server = PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{port}"])
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
    monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
    try:
        yield server, tmp_path / "run"
    finally:
        sl.shutdown_structured_logger(10)
        server.stop()


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary: scripts/setup-prometheus.sh installs Debian's package (as root with apt-get)",
)
def test_a_nan_loss_and_an_infinite_grad_norm_reach_the_alert(scraped_logger):
    """The SDK's gauge discards non-finite values: /metrics kept the last good loss and `loss !=
    loss` never fired."""
    server, run_dir = scraped_logger
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="nan-alert")
    sl.set_step(1)
    sl.log_trace_scalar({"loss": 2.5, "grad_norm": 1.0})
    sl.set_step(2)
    sl.log_trace_scalar({"loss": float("nan"), "grad_norm": float("inf")})
    assert sl.flush_structured_logger(10)
    # The alert expressions of docs/metrics.md, as Prometheus evaluates them.
    nan = _wait_for(server, "loss != loss", bool)
    assert [r["value"][1] for r in nan] == ["NaN"], nan
    inf = server.query("grad_norm == +Inf")
    assert [r["value"][1] for r in inf] == ["+Inf"], inf
    counted = {
        r["metric"]["titan_scalar_name"]: float(r["value"][1])
        for r in server.query("titan_scalar_nonfinite_total")
    }
    assert counted == {"loss": 1.0, "grad_norm": 1.0}
    # A finite value later is exported as usual.
    sl.set_step(3)
    sl.log_trace_scalar({"loss": 2.0})
    assert sl.flush_structured_logger(10)
    assert _wait_for(server, "loss", lambda r: r and r[0]["value"][1] == "2")[0]["value"][1] == "2"
    # The counter still says it after a finite value replaced the NaN: `increase(...) > 0` alerts
    # between scrapes.
    assert (
        float(server.query('titan_scalar_nonfinite_total{titan_scalar_name="loss"}')[0]["value"][1])
        == 1.0
    )


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary: scripts/setup-prometheus.sh installs Debian's package (as root with apt-get)",
)
def test_1200_grad_norms_before_loss_keep_loss_and_the_loggers_own_figures(scraped_logger, caplog):
    """The cap dropped whatever came last: loss and the memory figure were never exported, the
    warning named a grad norm."""
    server, run_dir = scraped_logger
    with caplog.at_level(logging.WARNING, logger="otel_titan"):
        sl.init_structured_logger(
            "training", run_dir, rank=0, world_size=1, run_id="cap", process_figures=True
        )
        for step in (1, 2, 3):
            sl.set_step(step)
            sl.log_trace_scalar(
                {f"grad_norm/layers.{i // 8}.param{i % 8}": 0.1 for i in range(1200)}
            )
            sl.log_trace_scalar({"loss": 3.0 / step, "lr": 0.1})
            # the processor sees each step end: the per-step figures are read
            assert sl.flush_structured_logger(10)
    loss = _wait_for(server, "loss", lambda r: r and r[0]["value"][1] == "1")
    assert [r["value"][1] for r in loss] == ["1"], loss
    assert (
        server.query("lr")
        and float(_wait_for(server, "process_memory_usage_bytes", bool)[0]["value"][1]) > 10e6
    )
    assert _wait_for(server, 'process_cpu_time_seconds_total{cpu_mode="user"}', bool)
    # Half the cap (1,000) for one prefix: the first 500 grad norms are kept, the other 700 are
    # dropped, named by prefix.
    kept = server.query('count({__name__=~"grad_norm_.*"})')
    assert float(kept[0]["value"][1]) == 500, kept
    overflow = _wait_for(
        server, "titan_metrics_overflow_total", lambda r: r and float(r[0]["value"][1]) >= 2100
    )
    assert [
        (r["metric"]["kind"], r["metric"]["titan_metric_prefix"], float(r["value"][1]))
        for r in overflow
    ] == [("scalar", "grad_norm", 3 * 700.0)]
    warnings = [
        r.getMessage() for r in caplog.records if "titan.metrics.overflow" in r.getMessage()
    ]
    assert (
        len(warnings) == 1 and "'grad_norm'" in warnings[0] and "layers.62.param4" in warnings[0]
    ), warnings


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary: scripts/setup-prometheus.sh installs Debian's package (as root with apt-get)",
)
def test_a_20_percent_straggler_shows_in_the_per_rank_p50_and_p99(tmp_path):
    """Two ranks' exporters, exact durations: rank 1's fwd_bwd 20 % slower. 1-2-5 buckets gave both
    ranks p50 = 75, p99 = 99.5."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, TraceFlags

    from otel_titan.exporters.metric_readers import build_readers
    from otel_titan.exporters.metrics import MetricsSpanExporter, summary_views

    base = _two_free_ports()
    server = PrometheusServer(
        tmp_path / "prometheus", [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    )
    exporters = []
    try:
        for rank in (0, 1):
            readers = build_readers(
                ["prometheus"],
                rank,
                {
                    "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                    "OTEL_EXPORTER_PROMETHEUS_PORT": str(base),
                },
            )
            resource = Resource(
                {
                    "service.name": "training",
                    "service.instance.id": f"rank-{rank}",
                    "titan.rank": rank,
                }
            )
            exporter = MetricsSpanExporter(
                MeterProvider(
                    resource=resource, metric_readers=readers.readers, views=summary_views()
                ),
                per_rank=["fwd_bwd"],
                readers=readers,
            )
            exporters.append(exporter)
            spans = []
            for i in range(200):
                # 57-63 ms, and 20 % more on rank 1
                duration_ms = (57 + 6 * i / 199) * (1.2 if rank == 1 else 1.0)
                start = 1_000_000_000 * (i + 1)
                context = SpanContext(
                    trace_id=i + 1,
                    span_id=i + 1,
                    is_remote=False,
                    trace_flags=TraceFlags(TraceFlags.SAMPLED),
                )
                spans.append(
                    ReadableSpan(
                        name="fwd_bwd",
                        context=context,
                        start_time=start,
                        end_time=start + int(duration_ms * 1e6),
                    )
                )
            exporter.export(spans)
        rank_of = "on (job, instance) group_left (titan_rank) last_over_time(target_info[10m])"
        quantiles = {}
        for q in (0.5, 0.99):
            # The "p99 by rank" recipe of docs/metrics.md.
            promql = f"histogram_quantile({q}, sum by (le, job, instance) (last_over_time(titan_span_duration_seconds_bucket{{titan_span_name='fwd_bwd'}}[10m]))) * {rank_of}"
            result = _wait_for(server, promql, lambda r: len(r) == 2)
            quantiles[q] = {r["metric"]["titan_rank"]: float(r["value"][1]) for r in result}
        for by_rank in quantiles.values():
            assert set(by_rank) == {"0", "1"}, quantiles
            # the straggler, about as slow as it is
            assert 1.1 < by_rank["1"] / by_rank["0"] < 1.3, quantiles
        # seconds
        assert 0.055 < quantiles[0.5]["0"] < 0.065 and 0.066 < quantiles[0.5]["1"] < 0.078, (
            quantiles
        )
    finally:
        for exporter in exporters:
            exporter.shutdown()
        server.stop()


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary: scripts/setup-prometheus.sh installs Debian's package (as root with apt-get)",
)
def test_scalar_names_that_collide_in_prometheus_are_all_kept_under_distinct_names(
    scraped_logger, caplog
):
    """train/loss and train.loss, Loss and loss, a user's titan.step: one Prometheus name each pair;
    the first was kept, silently."""
    import hashlib

    server, run_dir = scraped_logger
    with caplog.at_level(logging.WARNING, logger="otel_titan"):
        sl.init_structured_logger(
            "training", run_dir, rank=0, world_size=1, run_id="collide", process_figures=False
        )
        sl.set_step(7)
        with sl.log_trace_span("fwd_bwd"):  # a span moves the logger's own titan.step
            pass
        sl.log_trace_scalar(
            {"train/loss": 1.0, "train.loss": 2.0, "Loss": 3.0, "loss": 4.0, "titan.step": 5.0}
        )
        assert sl.flush_structured_logger(10)

    def renamed(name: str, exposed: str) -> str:
        return f"{exposed}_{hashlib.sha1(name.encode()).hexdigest()[:6]}"

    # OpenTelemetry instrument names are case-insensitive: the SDK exports "Loss" as "loss".
    expected = {
        "train_loss": 1.0,
        renamed("train.loss", "train_loss"): 2.0,
        "loss": 3.0,
        renamed("loss", "loss"): 4.0,
        renamed("titan.step", "titan_step"): 5.0,
        "titan_step": 7.0,
    }
    query = "{__name__=~'" + "|".join(expected) + "'}"
    got = _wait_for(server, query, lambda r: len(r) == len(expected))
    assert {r["metric"]["__name__"]: float(r["value"][1]) for r in got} == expected
    warnings = [r.getMessage() for r in caplog.records if "are one metric name" in r.getMessage()]
    assert (
        len(warnings) == 3
        and "'train.loss' and 'train/loss'" in warnings[0]
        and "the logger's own titan.step" in warnings[2]
    ), warnings


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary: scripts/setup-prometheus.sh installs Debian's package (as root with apt-get)",
)
def test_a_taken_port_moves_to_the_next_free_one_said_once_and_written_in_the_opened_record(
    tmp_path, monkeypatch, caplog
):
    """Another job on the host (or a process that outlived its rank) holds the port: the rank served
    nothing."""
    from tests.conftest import jsonl_files, read_records

    base = _two_free_ports()
    taken = socket.socket()
    taken.bind(("127.0.0.1", base))
    taken.listen(1)
    server = PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{base + 1}"])
    try:
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
        monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
        monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(base))
        monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        with caplog.at_level(logging.WARNING, logger="otel_titan"):
            sl.init_structured_logger(
                "training", tmp_path / "run", rank=0, world_size=1, run_id="taken-port"
            )
        sl.set_step(1)
        sl.log_trace_scalar({"loss": 0.25})
        assert sl.flush_structured_logger(10)
        assert [r["value"][1] for r in _wait_for(server, "loss", bool)] == ["0.25"]
        opened = read_records(jsonl_files(tmp_path / "run")[0])[0]
        assert (
            opened["log_type_name"] == "structured_logger_opened"
            and opened["metrics_endpoint"] == f"http://127.0.0.1:{base + 1}/metrics"
        ), opened
        moved = [r.getMessage() for r in caplog.records if "cannot listen" in r.getMessage()]
        assert len(moved) == 1 and f"serving on {base + 1}" in moved[0], moved
    finally:
        sl.shutdown_structured_logger(10)
        server.stop()
        taken.close()

"""Host figures once per host (exporters/host_metrics.py, core/host_figures.py): local rank 0
only."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_titan import structured_logger as sl
from otel_titan.core.host_figures import HostFigures, cgroup_cpu_stat_path, read_pressure
from otel_titan.exporters.host_metrics import HostMetrics
from otel_titan.exporters.metrics import MetricsSpanExporter
from tests.exporters.test_metrics import points


def test_pressure_and_cgroup_throttling_are_read_from_the_kernels_files(tmp_path):
    pressure = tmp_path / "pressure"
    pressure.mkdir()
    (pressure / "cpu").write_text(
        "some avg10=41.50 avg60=30.00 avg300=10.00 total=123\nfull avg10=0.00 avg60=0.00 "
        "avg300=0.00 total=0\n"
    )
    (pressure / "io").write_text(
        "some avg10=2.25 avg60=1.00 avg300=0.50 total=9\nfull avg10=1.50 avg60=0.50 avg300=0.10 "
        "total=3\n"
    )
    cgroup = tmp_path / "cpu.stat"
    cgroup.write_text("usage_usec 100\nnr_periods 50\nnr_throttled 7\nthrottled_usec 2500000\n")
    figures = HostFigures(pressure_root=str(pressure), cpu_stat=str(cgroup)).read()
    assert figures == {
        "host/cpu_pressure_some_pct": 41.5,
        "host/io_pressure_some_pct": 2.25,
        "host/io_pressure_full_pct": 1.5,
        "host/cgroup_throttled_periods": 7,
        "host/cgroup_throttled_s": 2.5,
    }
    # cgroup v1 counts nanoseconds; v1's cpu controller wins on a hybrid host.
    (tmp_path / "cgroup").write_text("1:cpu,cpuacct:/job/42\n0::/user.slice\n")
    v1 = tmp_path / "fs" / "cpu,cpuacct" / "job" / "42"
    v1.mkdir(parents=True)
    (v1 / "cpu.stat").write_text("nr_periods 9\nnr_throttled 3\nthrottled_time 1500000000\n")
    (tmp_path / "fs" / "user.slice").mkdir()
    (tmp_path / "fs" / "user.slice" / "cpu.stat").write_text("nr_throttled 0\nthrottled_usec 0\n")
    path = cgroup_cpu_stat_path(str(tmp_path / "cgroup"), str(tmp_path / "fs"))
    assert path == str(v1 / "cpu.stat")
    assert HostFigures(pressure_root=str(tmp_path / "none"), cpu_stat=path).read() == {
        "host/cgroup_throttled_periods": 3,
        "host/cgroup_throttled_s": 1.5,
    }
    assert read_pressure("memory", str(tmp_path / "none")) == {}


def test_the_host_instruments_report_system_pressure_and_say_why_there_is_no_gpu():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    host = HostMetrics(provider)
    try:
        got, _ = points(reader)
        assert host.system_status is None
        assert {"system.memory.usage", "system.cpu.utilization", "system.network.io"} <= set(got)
        assert all(p.value > 0 for p in got["system.memory.usage"])
        for name in HostFigures().read():  # whatever this kernel offers
            assert name.replace("/", ".") in got
        # No GPU on this machine: reported, nothing registered, nothing raised.
        assert host.nvml_status and "gpu.clock.sm" not in got
    finally:
        host.close()
        provider.shutdown()


def test_only_local_rank_0_attaches_the_host_figures(run_dir, monkeypatch):
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000")
    for local_rank, expected in ((1, False), (0, True)):
        sl.init_structured_logger(
            "training",
            run_dir / str(local_rank),
            rank=local_rank,
            world_size=2,
            local_rank=local_rank,
            run_id="host",
        )
        (exporter,) = [e for e in sl.get_exporters() if isinstance(e, MetricsSpanExporter)]
        assert (exporter.host is not None) is expected
        sl.shutdown_structured_logger()
    monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
    sl.init_structured_logger("training", run_dir / "off", rank=0, world_size=1, run_id="host")
    (exporter,) = [e for e in sl.get_exporters() if isinstance(e, MetricsSpanExporter)]
    assert exporter.host is None

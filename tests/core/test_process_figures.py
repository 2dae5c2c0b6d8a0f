"""Per-step memory and CPU figures (core/process_figures.py, core/step_sampler.py), written by the
background thread."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from otel_titan import structured_logger as sl
from otel_titan.core.process_figures import ProcessFigures, cuda_device
from tests.conftest import run_python

BASE = {
    "memory/rss_bytes",
    "memory/rss_peak_bytes",
    "process/cpu_user_s",
    "process/cpu_system_s",
    "process/threads",
}


def figures_by_step(records):
    out = defaultdict(dict)
    for record in records:
        if record["log_type_name"] == "metric_value" and record["event_name"].startswith(
            ("memory/", "process/")
        ):
            out[record["step"]][record["event_name"]] = record
    return out


def test_each_step_gets_its_figures_once_as_scalars_of_that_step_written_by_the_background_thread(
    logged,
):
    logged(process_figures=True)
    import threading

    main = threading.get_ident()
    for step in range(1, 5):
        sl.set_step(step)
        if step == 3:
            sl.add_step_tag("gc")
        with sl.log_trace_span("fwd_bwd"):
            # resident memory that step 2 touched
            ballast = bytearray(8 << 20) if step == 2 else None
            if ballast is not None:
                ballast[::4096] = b"x" * len(ballast[::4096])
        sl.log_trace_scalar({"loss": 1.0})
        assert sl.flush_structured_logger(5)
    records = logged.finish()
    by_step = figures_by_step(records)
    assert sorted(by_step) == [1, 2, 3, 4]  # 1-3 at the next step's start, 4 at shutdown
    for step, figures in by_step.items():
        assert set(figures) == BASE, step
        assert all(r["tid"] != main for r in figures.values())  # the logger's own thread wrote them
        assert all(r["caller"].endswith(":_sample") for r in figures.values())
    assert by_step[3]["memory/rss_bytes"].get("step_tags") == ["gc"]
    # The high-water mark remembers step 2's 8 MB after they were freed (the kernel's counters are
    # approximate, a few pages either way, so no exact monotonicity is asserted).
    assert (
        by_step[4]["memory/rss_peak_bytes"]["value"] - by_step[4]["memory/rss_bytes"]["value"]
        >= 6 << 20
    )
    assert all(
        by_step[s]["memory/rss_bytes"]["value"] <= by_step[s]["memory/rss_peak_bytes"]["value"]
        for s in by_step
    )
    cpu = [
        by_step[s]["process/cpu_user_s"]["value"] + by_step[s]["process/cpu_system_s"]["value"]
        for s in (1, 2, 3, 4)
    ]
    assert cpu == sorted(cpu) and cpu[0] > 0


def test_off_with_one_option(logged):
    logged(process_figures=False)
    sl.set_step(1)
    with sl.log_trace_span("a"):
        pass
    sl.set_step(2)
    with sl.log_trace_span("a"):
        pass
    assert not figures_by_step(logged.finish())


def test_the_variable_decides_when_the_option_is_not_given(logged, monkeypatch):
    monkeypatch.setenv("OTEL_TITAN_PROCESS_FIGURES", "1")
    logged()
    sl.set_step(1)
    with sl.log_trace_span("a"):
        pass
    assert sorted(figures_by_step(logged.finish())) == [1]


def test_no_step_no_figures(logged):
    logged(process_figures=True)
    with sl.log_trace_span("setup"):
        pass
    assert not figures_by_step(logged.finish())


def test_a_process_that_imported_torch_without_using_cuda_never_gets_cuda_initialised():
    pytest.importorskip("torch")
    result = run_python(
        """
        import tempfile, torch
        from otel_titan import structured_logger as sl
        from otel_titan.core.process_figures import ProcessFigures
        sl.init_structured_logger("training", tempfile.mkdtemp(), rank=0, world_size=1, run_id="r", process_figures=True)
        for step in (1, 2, 3):
            sl.set_step(step)
            with sl.log_trace_span("fwd"):
                torch.ones(4).sum()
            sl.flush_structured_logger(5)
        sl.shutdown_structured_logger()
        figures = ProcessFigures(local_rank=0).read()
        print("initialized", torch.cuda.is_initialized(), "cuda figures", sorted(k for k in figures if "cuda" in k))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "initialized False cuda figures []" in result.stdout


class _FakeCuda:
    """Stands in for torch.cuda of a process that uses a GPU (none here): records what was asked."""

    def __init__(self, initialized: bool, count: int = 8, current: int = 0) -> None:
        self.initialized, self.count, self.current = initialized, count, current
        self.asked: list[tuple[str, object]] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return self.current

    def _read(self, name, device=None):
        if device is None:
            raise AssertionError(f"{name}() without a device reads GPU 0 from every rank")
        self.asked.append((name, device))
        return 1000 + device

    def memory_allocated(self, device=None):
        return self._read("memory_allocated", device)

    def memory_reserved(self, device=None):
        return self._read("memory_reserved", device)

    def max_memory_allocated(self, device=None):
        return self._read("max_memory_allocated", device)

    def max_memory_reserved(self, device=None):
        return self._read("max_memory_reserved", device)

    def memory_stats(self, device=None):
        self._read("memory_stats", device)
        return {"allocated_bytes.all.peak": 77}

    def reset_peak_memory_stats(self, device=None):
        self._read("reset_peak_memory_stats", device)


class _FakeTorch:
    def __init__(self, cuda: _FakeCuda) -> None:
        self.cuda = cuda


def test_cuda_figures_read_only_the_ranks_own_device_and_only_once_cuda_is_in_use():
    idle = _FakeCuda(initialized=False)
    assert (
        "memory/cuda_allocated_bytes"
        not in ProcessFigures(3, modules={"torch": _FakeTorch(idle)}).read()
        and idle.asked == []
    )
    # torch never imported: no CUDA figures, no import
    assert ProcessFigures(3, modules={}).read().keys() >= BASE
    busy = _FakeCuda(initialized=True)
    figures = ProcessFigures(3, step_peak=False, modules={"torch": _FakeTorch(busy)}).read()
    assert (
        figures["memory/cuda_allocated_bytes"] == figures["memory/cuda_peak_reserved_bytes"] == 1003
    )
    assert {device for _, device in busy.asked} == {3} and not any(
        name == "reset_peak_memory_stats" for name, _ in busy.asked
    )
    # One visible device per process (CUDA_VISIBLE_DEVICES): the current one, not local_rank 3.
    assert cuda_device(_FakeTorch(_FakeCuda(True, count=1, current=0)), 3) == 0
    # The per-step peak only when asked: it resets the allocator's peak.
    stepped = _FakeCuda(initialized=True)
    figures = ProcessFigures(2, step_peak=True, modules={"torch": _FakeTorch(stepped)}).read()
    assert (
        figures["memory/cuda_step_peak_allocated_bytes"] == 77
        and ("reset_peak_memory_stats", 2) in stepped.asked
    )


def _host_names(records):
    return {
        r["event_name"]
        for r in records
        if r["log_type_name"] == "metric_value" and r["event_name"].startswith("host/")
    }


def test_host_pressure_figures_are_written_by_local_rank_0_only(logged, run_dir):
    from otel_titan.core.host_figures import HostFigures

    offered = {name for name in HostFigures().read()}
    logged(process_figures=True, rank=1, world_size=2, local_rank=1)
    sl.set_step(1)
    with sl.log_trace_span("a"):
        pass
    assert not _host_names(logged.finish())
    sl.shutdown_structured_logger()
    import shutil

    shutil.rmtree(run_dir)
    logged(process_figures=True, rank=0, world_size=2, local_rank=0)
    sl.set_step(1)
    with sl.log_trace_span("a"):
        pass
    assert _host_names(logged.finish()) == offered


def test_the_figures_are_counters_of_the_exported_trace(logged, run_dir, tmp_path):
    import json
    import subprocess
    import sys

    logged(process_figures=True)
    for step in (1, 2, 3):
        sl.set_step(step)
        with sl.log_trace_span("fwd_bwd"):
            pass
    logged.finish()
    out = tmp_path / "trace.json"
    result = subprocess.run(
        [sys.executable, "-m", "otel_titan.cli", "export", str(run_dir), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    events = json.loads(out.read_text())["traceEvents"]
    counters = {e["name"] for e in events if e.get("ph") == "C"}
    assert BASE <= counters


def test_a_figure_that_cannot_be_read_costs_no_record_and_is_reported_once(
    logged, monkeypatch, caplog
):
    import logging

    def broken(self):
        raise OSError("no /proc here")

    monkeypatch.setattr(ProcessFigures, "read", broken)
    logged(process_figures=True)
    with caplog.at_level(logging.ERROR, logger="otel_titan"):
        for step in (1, 2, 3, 4):
            sl.set_step(step)
            with sl.log_trace_span("fwd_bwd"):
                pass
            assert sl.flush_structured_logger(5)
        records = logged.finish()
    assert [r["log_type_name"] for r in records].count("fwd_bwd_end") == 4 and not figures_by_step(
        records
    )
    assert len([r for r in caplog.records if "per-step process figures" in r.getMessage()]) == 1


def test_memory_allocated_at_the_start_of_a_step_is_that_steps_not_the_one_before(run_dir):
    """Read on the background thread, step N's figures came up to a processor interval into step
    N+1: memory allocated at the start of step 10 showed as step 9's memory/rss_bytes. Now read at
    set_step itself."""
    from tests.conftest import data_records, jsonl_files, read_records

    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, run_id="boundary", process_figures=True
    )
    held = []
    for step in range(1, 13):
        sl.set_step(step)
        if step == 10:
            # resident at once: 200 MiB, at the very start of step 10
            held.append(b"\x01" * (200 << 20))
        with sl.log_trace_span("fwd_bwd"):
            time.sleep(0.15)  # longer than the processor's interval: it wakes inside this step
    sl.shutdown_structured_logger(10)
    rss = {
        r["step"]: r["value"]
        for r in data_records(read_records(jsonl_files(run_dir)[0]))
        if r["log_type_name"] == "metric_value" and r["event_name"] == "memory/rss_bytes"
    }
    assert {8, 9, 10, 11} <= set(rss), sorted(rss)
    mib = 1 << 20
    assert abs(rss[9] - rss[8]) < 50 * mib, (rss[8], rss[9])  # step 9 did not allocate
    assert rss[10] - rss[9] > 150 * mib, (rss[9], rss[10])  # step 10 did
    del held

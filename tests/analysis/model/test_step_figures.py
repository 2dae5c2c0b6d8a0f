"""summarize names a slow step next to a memory peak or a busy host (analysis/step_figures.py), from
a real run's figures."""

from __future__ import annotations

import pytest

from otel_titan.analysis.model.collect import summarize_run
from otel_titan.analysis.model.step_figures import StepFigures
from otel_titan.analysis.summarize.text import format_summary
from tests.conftest import run_python

WORKLOAD = """
import sys, time
from otel_titan import structured_logger as sl
rank = int(sys.argv[2]) if len(sys.argv) > 2 else 0
sl.init_structured_logger("training", sys.argv[1], rank=rank, world_size=2 if len(sys.argv) > 2 else 1, local_rank=rank, run_id="figures", process_figures=True)
keep = []
for step in range(1, 13):
    sl.set_step(step)
    with sl.log_trace_span("fwd_bwd"):
        time.sleep(0.06)
        if step == 6 and rank == 0:  # slow, and 300 MB more resident memory than ever before
            block = bytearray(300 << 20)
            block[::4096] = b"x" * len(block[::4096])
            time.sleep(0.3)
            del block
        if step == 9 and rank == 0:  # slow for no reason the figures show
            time.sleep(0.3)
sl.shutdown_structured_logger()
"""


def test_summarize_says_a_slow_step_reached_a_memory_peak_and_says_nothing_of_an_unexplained_one(
    tmp_path,
):
    result = run_python(WORKLOAD, str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    summary = summarize_run(tmp_path)
    (note,) = [n for n in summary.slow_steps if n.startswith("training rank 0, step 6: ")]
    assert "its resident memory reached a new peak of" in note
    # Step 9 was as slow with no memory change: no memory reason (a loaded test machine's CPU
    # pressure may be one).
    assert not any("memory" in n for n in summary.slow_steps if ", step 9:" in n)
    text = format_summary(summary)
    assert "Slow steps and the machine" in text and "  training rank 0, step 6: " in text
    assert summary.to_dict()["slow_steps"] == summary.slow_steps


def test_a_busy_host_is_named_for_the_ranks_on_it():
    figures = StepFigures()
    for rank, host in ((0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")):
        for step in range(1, 9):
            figures.observe(
                {"event_name": "memory/rss_peak_bytes", "value": 1 << 30, "step": step},
                "training",
                0,
                rank,
                host,
            )
            if rank in (0, 2):  # local rank 0 of each host writes the host's figures
                pressure = 55.0 if host == "n2" and step == 4 else 1.0
                figures.observe(
                    {"event_name": "host/cpu_pressure_some_pct", "value": pressure, "step": step},
                    "training",
                    0,
                    rank,
                    host,
                )
    step_ms = {
        ("training", 0): {
            rank: {s: 100.0 + (300.0 if (rank == 3 and s == 4) else 0.0) for s in range(1, 9)}
            for rank in range(4)
        }
    }
    assert figures.notes(step_ms) == [
        "training rank 3, step 4: 400 ms (median 100 ms); its host n2 was under CPU pressure (55 "
        "% of the time tasks waited for CPU)"
    ]
    # No figures at all (process_figures off): nothing is said.
    assert StepFigures().notes(step_ms) == []


def test_summary_workers_merge_the_figures_of_their_processes(tmp_path):
    for rank in (0, 1):
        result = run_python(WORKLOAD, str(tmp_path), str(rank), timeout=120)
        assert result.returncode == 0, result.stderr
    one, two = (
        summarize_run(tmp_path, jobs=1, cache=False),
        summarize_run(tmp_path, jobs=2, cache=False),
    )
    assert any(
        n.startswith("training rank 0, step 6: ") and "resident memory" in n for n in two.slow_steps
    )
    assert one.slow_steps == two.slow_steps


def test_the_report_lists_the_same_slow_steps(tmp_path):
    import html

    pytest.importorskip("plotly")
    pytest.importorskip("duckdb")
    from otel_titan.analysis.report import write_report

    result = run_python(WORKLOAD, str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    page = open(write_report(tmp_path).path, encoding="utf-8").read()
    assert "<h3>Slow steps and the machine</h3>" in page
    for note in summarize_run(tmp_path).slow_steps:
        assert f"<li>{html.escape(note)}</li>" in page
    assert "training rank 0, step 6: " in page

"""The benchmark harness runs end to end (a --quick smoke run: its figures mean nothing and are not
checked)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.conftest import REPO
from tests.helpers import processes

pytest.importorskip("torch")


@pytest.mark.slow
def test_quick_benchmark_run_produces_every_row_and_target(tmp_path):
    out = tmp_path / "bench.json"
    result = processes.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["span_cost"]) == {
        "floor",
        "logging_queue",
        "logging_sync",
        "otel_sdk",
        "otel_sdk_jsonl",
        "otel_titan",
        "otel_titan_otlp",
        "otel_titan_otlp_sdk",
    }
    assert all(
        case["caller_us"] > 0 and case["cpu_us"] > 0 for case in results["span_cost"].values()
    )
    assert {"bare", "disabled", "jsonl", "jsonl_otlp"} <= set(results["training_step_ms"])
    assert set(results["training_step_ms"]["overhead_pct"]) == {
        "bare",
        "disabled",
        "jsonl",
        "jsonl_otlp",
    }
    assert all(case["caller_cpu_us"] > 0 for case in results["span_cost"].values())
    assert results["throughput"]["spans_emitted"] > 0
    assert (
        results["throughput"]["records_written"] + results["throughput"]["records_dropped"]
        == 2 * results["throughput"]["spans_emitted"]
    )
    # issue 30 item 7 adds the two ratios to the baseline revision
    assert len(results["targets"]) == 11
    assert (
        "| (6) otel-titan, JSONL |" in result.stdout
        and "| target | met | measured |" in result.stdout
    )
    # the default revision, measured side by side (this checkout has its history)
    baseline = results["span_cost_baseline"]
    assert (
        baseline["ref"] == "93dec39"
        and baseline["otel_titan"]["caller_us"] > 0
        and baseline["otel_titan"]["cpu_us"] > 0
    )
    assert (
        "| (6) otel-titan, JSONL, at 93dec39 (before) |" in result.stdout
        and "| caller time ≤ 0.8 × 93dec39's |" in result.stdout
    )
    assert set(results["start_latency"]["cases"]) == {"spinning_0", "spinning_4"}
    assert "| 4 threads spinning for the interpreter lock |" in result.stdout


@pytest.mark.slow
def test_start_latency_measures_each_case_in_fresh_processes():
    """benchmarks/start_latency.py: one sample per span, read by another process; figures not
    checked (no timed tests)."""
    result = processes.run(
        [
            sys.executable,
            "-m",
            "benchmarks.start_latency",
            "--rounds",
            "2",
            "--probes",
            "2",
            "--spinners",
            "0,2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["rounds"] == 2 and data["probes_per_process"] == 2
    assert set(data["cases"]) == {"spinning_0", "spinning_2"}
    for case in data["cases"].values():
        samples = case["samples_ms"]
        assert len(samples) == 4 and all(0 < s < 60_000 for s in samples)
        assert (
            case["min_ms"] <= case["median_ms"] <= case["p95_ms"] <= case["max_ms"] == max(samples)
        )
    assert "threads spinning for the interpreter lock" in result.stderr


@pytest.mark.slow
def test_summarize_scale_measures_every_command_side_by_side(tmp_path):
    """benchmarks/summarize_scale.py on a tiny run: every command measured, the table printed, the
    runs deleted; figures not checked."""
    out = tmp_path / "scale.json"
    result = processes.run(
        [
            sys.executable,
            "benchmarks/summarize_scale.py",
            "--ranks",
            "8",
            "--steps",
            "10",
            "--repeat",
            "1",
            "--workdir",
            str(tmp_path),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert {"summarize", "tail", "export"} <= set(row) and row["ranks"] == 8
    assert "| 8 | " in result.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["scale.json"]  # the generated run is gone


def test_step_table_benchmark_checks_both_tables_equal_then_measures(tmp_path):
    """benchmarks/step_table.py on a tiny run: both paths taken (rollups, spans), their tables
    equal, figures written; figures not checked."""
    out = tmp_path / "figures.json"
    result = processes.run(
        [
            sys.executable,
            "benchmarks/step_table.py",
            "--ranks",
            "8",
            "--steps",
            "6",
            "--repeat",
            "1",
            "--workdir",
            str(tmp_path),
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert (
        figures["rows"] == 8 * 6 and figures["rollups"]["parsed_mb"] < figures["spans"]["parsed_mb"]
    )
    assert [p.name for p in tmp_path.iterdir()] == ["figures.json"]  # the runs are deleted


def test_the_run_generator_has_help_and_refuses_a_bad_fault():
    result = processes.run(
        [sys.executable, "benchmarks/generate_run.py", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0 and "--straggler RANK:PHASE:PCT" in result.stdout
    result = processes.run(
        [sys.executable, "benchmarks/generate_run.py", "/tmp/unused", "--straggler", "1:nope:5"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert (
        result.returncode == 2 and "PHASE one of data_fetch, fwd, bwd, optimizer" in result.stderr
    )


def test_sql_scale_measures_sql_and_summarize_side_by_side(tmp_path):
    """benchmarks/sql_scale.py on a tiny run it generates: both commands measured, the figures
    written, the run deleted; figures not checked."""
    pytest.importorskip("duckdb")
    out = tmp_path / "sql.json"
    run = tmp_path / "run"
    result = processes.run(
        [
            sys.executable,
            "benchmarks/sql_scale.py",
            str(run),
            "--ranks",
            "8",
            "--steps",
            "10",
            "--rounds",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert (
        len(figures["times"]["sql"]) == len(figures["times"]["summarize"]) == 1
        and figures["bytes"] > 0
    )
    assert "sql/summarize" in result.stdout
    assert not run.exists()  # the generated run is gone


@pytest.mark.slow
def test_the_stall_watchdog_benchmark_compares_on_and_off_in_one_run(tmp_path):
    """benchmarks/stall_watchdog.py end to end (figures not checked: no timed tests)."""
    out = tmp_path / "stall.json"
    result = processes.run(
        [
            sys.executable,
            "-m",
            "benchmarks.stall_watchdog",
            "--rounds",
            "1",
            "--spans",
            "2000",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["median"]) == {"on", "off"} and set(results["ratio_on_off"]) == {
        "caller_us",
        "cpu_us",
    }
    assert "| on / off |" in result.stdout


def test_default_trace_granularity_keeps_a_1024_rank_step_within_tempo_and_jaeger_limits(tmp_path):
    """benchmarks/trace_sizes.py: 1,024 real loggers (one per rank) produce one step; its traces,
    grouped by their real trace ids, fit."""
    out = tmp_path / "sizes.json"
    result = processes.run(
        [sys.executable, "-m", "benchmarks.trace_sizes", "--ranks", "1024", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sizes = json.loads(out.read_text())
    measured, limits = sizes["measured"], sizes["limits"]
    assert sizes["spans_per_rank"] >= 20  # a realistic step, not an empty one
    assert measured["traces_per_step"] == 1024 // 32 and measured["max_ranks_per_trace"] == 32
    assert measured["max_bytes_per_trace"] <= limits["tempo_max_bytes_per_trace"] == 5_000_000
    assert measured["max_spans_per_trace"] <= limits["jaeger_ui_spans_per_trace"] == 2_000
    # And why the default is not one trace per step: all 1,024 ranks in one trace break both limits.
    whole = next(row for row in sizes["other_group_sizes"] if row["ranks_per_trace"] == 1024)
    assert (
        whole["max_bytes_per_trace"] > limits["tempo_max_bytes_per_trace"]
        and whole["max_spans_per_trace"] > limits["jaeger_ui_spans_per_trace"]
    )


@pytest.mark.slow
def test_the_metrics_benchmark_compares_off_figures_and_metrics_in_one_run(tmp_path):
    """benchmarks/metrics_cost.py: every mode measured, ratios and both targets printed (figures not
    checked)."""
    out = tmp_path / "metrics.json"
    result = processes.run(
        [
            sys.executable,
            "-m",
            "benchmarks.metrics_cost",
            "--rounds",
            "1",
            "--steps",
            "10",
            "--work",
            "2000",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    assert set(summary) == {"jsonl", "figures", "metrics"} and summary["jsonl"]["cpu_ratio"] == 1.0
    assert all(
        row["cpu_ms_per_step"] > 0 and row["thread_cpu_ms_per_step"] > 0 for row in summary.values()
    )
    assert (
        "target: training thread within +10 %" in result.stdout
        and "target: process CPU within 1.3x" in result.stdout
    )


@pytest.mark.slow
def test_analysis_scale_quick_measures_every_command_against_duckdb(tmp_path):
    """benchmarks/analysis_scale.py --quick: every command, each size, a median and a peak; figures
    not checked (no timed tests)."""
    out = tmp_path / "analysis.json"
    result = processes.run(
        [
            sys.executable,
            "benchmarks/analysis_scale.py",
            "--quick",
            "--workdir",
            str(tmp_path),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [row["ranks"] for row in data["rows"]] == [8, 16] and data["repeat"] == 1
    for row in data["rows"]:
        assert row["bytes"] > 0
        assert set(row["commands"]) == {
            "duckdb",
            "summarize",
            "summarize --jobs 2",
            "export",
            "export --jobs 1",
            "report",
            "sql",
        }
        assert all(
            c["median_s"] > 0
            and c["median_cpu_s"] > 0
            and c["peak_mb"] > 10
            and len(c["rounds_s"]) == 1
            for c in row["commands"].values()
        )
    assert (
        "| ranks | MB | command | median s | MB/s | × DuckDB's rate | CPU s | peak MB |"
        in result.stdout
    )
    # the row of the 16-rank run (its size, under a megabyte, rounds either way)
    assert re.search(r"^\| 16 \| [01] \| summarize --jobs 2 \|", result.stdout, re.M)
    assert list(tmp_path.iterdir()) == [out]  # the generated runs are deleted


@pytest.mark.slow
def test_analysis_scale_baseline_measures_the_same_commands_from_another_checkout(tmp_path):
    """--baseline DIR: each command also from that checkout (here this one), interleaved, named
    '<command> (baseline)'."""
    out = tmp_path / "analysis.json"
    result = processes.run(
        [
            sys.executable,
            "benchmarks/analysis_scale.py",
            "--quick",
            "--commands",
            "summarize",
            "--baseline",
            REPO,
            "--workdir",
            str(tmp_path),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for row in json.loads(out.read_text())["rows"]:
        assert set(row["commands"]) == {"duckdb", "summarize", "summarize (baseline)"}
    assert re.search(r"^\| 16 \| [01] \| summarize \(baseline\) \|", result.stdout, re.M)


@pytest.mark.slow
def test_parse_speed_quick_measures_every_decoder():
    """benchmarks/parse_speed.py --quick: a row per case, DuckDB the reference; figures not
    checked."""
    result = processes.run(
        [sys.executable, "benchmarks/parse_speed.py", "--quick"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [
        line.split("|")[1].strip()
        for line in result.stdout.splitlines()
        if line.startswith("| ") and "---" not in line
    ][1:]
    assert rows[:2] == ["duckdb", "orjson"] and rows[-3:] == [
        "reader",
        "reader trimmed",
        "summarize",
    ]
    assert "| duckdb | " in result.stdout and " | 1.00 |" in result.stdout


@pytest.mark.slow
def test_the_receive_benchmark_measures_the_watch_and_the_rank_side():
    """benchmarks/receive_rate.py: the real watch --otlp fed by sender processes; figures not
    checked (no timed tests)."""
    result = processes.run(
        [
            sys.executable,
            "-m",
            "benchmarks.receive_rate",
            "--seconds",
            "1",
            "--rounds",
            "1",
            "--requests",
            "4",
            "--batch",
            "64",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "records/s (median of 1 rounds" in result.stdout
        and "µs of CPU a record (its OTLP bytes written directly;" in result.stdout
    ), result.stdout


@pytest.mark.parametrize(
    "fault",
    [
        {},
        {"crashed": (2, 3)},
        {"hung": (1, 4)},
        {"restart": (3, 4)},
        {"straggler": (1, "fwd", 30.0)},
    ],
)
def test_generated_runs_have_the_librarys_rollups_equal_to_their_spans(tmp_path, fault):
    """benchmarks/generate_run.py writes rollups as the library does (docs/schema.md): one per rank
    and step, equal to the spans."""
    from benchmarks.generate_run import RunSpec, generate_run
    from otel_titan.analysis.read.records import read_run
    from otel_titan.analysis.read.rollups import read_rollups
    from tests.helpers.rollups import closing_of, rollups_by_step, spans_by_step

    generate_run(str(tmp_path / "run"), RunSpec(ranks=4, steps=6, seed=2, **fault))
    run = read_run(tmp_path / "run", log_skipped=False)
    parsed = read_rollups(run)
    for process in run.processes:
        records = [
            json.loads(line)
            for path in process.segments
            for line in open(path, "rb")
            if line.endswith(b"\n")
        ]
        truth, rollups = spans_by_step(records), rollups_by_step(records)
        stopped = records[-1]["log_type_name"] != "structured_logger_closed"
        signalled = any(r["log_type_name"] == "signal_received" for r in records)
        # A step a rank crashed or hung in has none (nothing wrote it); one it was killed in by
        # SIGTERM has its totals so far.
        assert set(rollups) == (
            set(truth) - {max(truth)} if stopped and not signalled else set(truth)
        ), process.label
        for step, rollup in rollups.items():
            assert (
                rollup["phases"] == truth[step]["phases"]
                and rollup["begin_us"] == truth[step]["begin_us"]
            ), (process.label, step)
            assert closing_of(rollup) == truth[step]["closing"]
            last = step == max(truth)
            assert rollup["complete"] is not last and rollup["ended_by"] == (
                "next_step" if not last else "signal" if signalled else "close"
            )
            if not last:
                assert (
                    rollup["end_us"] == truth[step]["end_us"]
                    and closing_of(rollup)[0] == "all_reduce"
                )
        assert sorted(parsed.get((process.source, process.rank, process.attempt), {})) == sorted(
            rollups
        )
    if not fault:
        closed = [
            json.loads(open(p.segments[0], "rb").read().splitlines()[-1]) for p in run.processes
        ]
        # opened, closing and rollup lines are the logger's own
        assert all(c["written_records"] == c["seq_id"] - 2 - 6 for c in closed)


def test_the_run_generator_writes_no_rollups_when_told(tmp_path):
    from benchmarks.generate_run import RunSpec, generate_run

    generate_run(str(tmp_path / "run"), RunSpec(ranks=2, steps=3, rollups=False))
    assert not [
        line
        for path in (tmp_path / "run" / "structured_logs").iterdir()
        for line in path.read_bytes().splitlines()
        if b"step_rollup" in line
    ]
    result = processes.run(
        [sys.executable, "benchmarks/generate_run.py", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert "--no-rollups" in result.stdout

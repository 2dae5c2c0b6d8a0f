"""Clock alignment: one offset per host, piecewise when the clocks drift, refused (and then never
taken for simultaneous) when nothing fits."""

from __future__ import annotations

import json

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis import summarize_run
from otel_titan.analysis.model.clocks import MAX_RESIDUAL_US, ClosingSpans, estimate_offsets


def _drifting(tmp_path, seed=0, **spec):
    run = str(tmp_path / "run")
    truth = generate_run(
        run,
        RunSpec(
            ranks=64,
            steps=30,
            seed=seed,
            noise=0.05,
            offset_ms=5.0,
            drift_hosts=(1, 5),
            drift_ms=3.0,
            **spec,
        ),
    )
    return run, truth


def test_drifting_clocks_are_aligned_piecewise_and_the_drift_is_found(tmp_path):
    # Issue 18 item 10: two hosts drifting 3 ms over the run: one offset per host does not fit
    # (residual > 1 ms).
    run, _ = _drifting(tmp_path)
    clock = summarize_run(run, log_skipped=False).clock
    assert (
        clock.applied
        and clock.simultaneous
        and clock.anchor == "all_reduce"
        and len(clock.windows) >= 2
    )
    assert clock.residual_p95_us <= MAX_RESIDUAL_US
    drift = clock.drift_us
    steady = sorted(value for host, value in drift.items() if host not in ("node-001", "node-005"))
    baseline = steady[len(steady) // 2]
    # the steady hosts move together ...
    assert all(abs(value - baseline) < 200 for value in steady)
    # ... and the two drifting hosts move by the share of 3 ms between the first and the last
    # window's middle.
    windows = len(clock.windows)
    span = (windows - 1) / windows  # equal windows: their middles are (k - 1)/k of the run apart
    for host in ("node-001", "node-005"):
        assert drift[host] - baseline == pytest.approx(3000 * span, abs=400)
    middle = clock.windows[0]["center_us"]
    assert clock.offset_at("node-001", middle) == pytest.approx(
        clock.windows[0]["offsets_us"]["node-001"]
    )
    assert "aligned piecewise on the end of all_reduce" in clock.describe()


def test_one_offset_per_host_fits_clocks_that_do_not_drift():
    # A collective: whoever arrives later (its start) waits less; all leave at one moment (the end).
    a = ClosingSpans("h1", 0, [1, 2, 3, 4], ["ar"] * 4, [10, 150, 205, 290], [100, 200, 300, 400])
    b = ClosingSpans("h2", 1, [1, 2, 3, 4], ["ar"] * 4, [120, 170, 230, 380], [150, 250, 350, 450])
    alignment = estimate_offsets([a, b])
    assert (
        alignment.applied
        and alignment.simultaneous
        and alignment.windows == []
        and alignment.offset_at("h2", 10**9) == alignment.offset("h2") == 25.0
    )


def test_ends_that_agree_under_no_model_are_refused_and_not_taken_for_simultaneous():
    # Each rank ends its last span whenever it is done (an optimizer step): milliseconds apart at
    # random.
    import random

    rng = random.Random(3)
    spans = [
        ClosingSpans(
            f"h{rank}",
            rank,
            list(range(1, 31)),
            ["optimizer"] * 30,
            [0] * 30,
            [step * 100_000 + int(rng.uniform(0, 20_000)) for step in range(1, 31)],
        )
        for rank in range(8)
    ]
    alignment = estimate_offsets(spans)
    assert not alignment.applied and not alignment.simultaneous and alignment.windows == []
    assert "no step-closing span ends at the same moment on every rank" in alignment.reason


def test_the_json_has_the_windows(tmp_path):
    run, _ = _drifting(tmp_path, seed=1)
    data = json.loads(json.dumps(summarize_run(run, log_skipped=False).to_dict()))
    assert (
        data["clock"]["simultaneous"] is True
        and len(data["clock"]["windows"]) >= 2
        and set(data["clock"]["drift_us"]) == set(data["clock"]["offsets_us"])
    )


def test_the_closing_visitor_finds_the_step_closing_spans_the_summarys_collector_finds(tmp_path):
    """One rule, two gatherers: the export's tail alignment walks with `ClosingVisitor` alone, the
    summary's collector inline; on a restarted run with host offsets both give the same spans,
    attempt by attempt."""
    from benchmarks.generate_run import RunSpec, generate_run
    from otel_titan.analysis.model.clocks import ClosingVisitor
    from otel_titan.analysis.model.collect import _Collector, _new_summary
    from otel_titan.analysis.model.timeline import walk_process
    from otel_titan.analysis.read.lines import SkippedLines
    from otel_titan.analysis.read.records import read_run

    run = str(tmp_path / "run")
    generate_run(run, RunSpec(ranks=8, steps=16, seed=5, restart=(2, 9)))
    processes = read_run(run, log_skipped=False).processes
    collector, visitor = _Collector(), ClosingVisitor()
    for process in processes:
        collector.begin(process, _new_summary(process))
        walk_process(process.records(SkippedLines(log=False), trimmed=True), collector)
        visitor.begin(process.host_name or process.label, process.label, process.attempt)
        walk_process(process.records(SkippedLines(log=False), trimmed=True), visitor)
    assert [spans for _, spans in collector.closing] == visitor.closing
    # the restart's steps, apart
    assert any(step >= 1 << 40 for spans in visitor.closing for step in spans.steps)

"""model/rules.py: each rule written once, and SQL (query/sql.py) and Python (model/) give the same
answer by it.

Issue 19 item: the attempt stride, what begins a step, the step-closing span and the robust
spread were written in Python and again in SQL, and had drifted apart (SQL's steps began at
the logger's own records and at ``_end``\\ s; its step-closing spans left out each process's last
step; its list of the logger's records had no ``stall``). Compared here on generated runs with
restarts, a hang (black boxes: ``stall`` records), a crash and offset clocks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis.model import rules
from otel_titan.analysis.model.collect import collect_run, read_model, summarize_run
from otel_titan.analysis.read.records import read_run
from otel_titan.analysis.read.runs import select_run
from otel_titan.analysis.read.selection import RunSelection

duckdb = pytest.importorskip("duckdb")

from otel_titan.analysis.query.sql import CLOSING_SPANS_QUERY, open_run  # noqa: E402 - after importorskip: without duckdb the module is skipped, not failed

START = 1_796_000_000_000_000
RUNS = {
    "restart": RunSpec(ranks=8, steps=14, seed=2, restart=(3, 6), start_us=START),
    "hung": RunSpec(ranks=8, steps=14, seed=3, hung=(5, 9), black_boxes=True, start_us=START),
    "crashed": RunSpec(
        ranks=8,
        steps=14,
        seed=4,
        crashed=(2, 7),
        straggler=(6, "fwd", 30.0),
        ranks_per_host=2,
        start_us=START,
    ),
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(request.param)
    generate_run(str(out), RUNS[request.param])
    return out


def _identity(db, process_id: int) -> tuple:
    return tuple(
        db.con.execute(
            "SELECT source, attempt, rank FROM process_info WHERE process_id = ?", [process_id]
        ).fetchone()
    )


def test_steps_begin_and_end_alike(run) -> None:
    """The `steps` view (SQL) and the model's steps (model/timeline.py): the same steps, begun at
    the same µs, the same times."""
    _, grid = read_model(RunSelection.of(run, align=False))
    db = open_run(run, align=False)
    db.load()
    sql_starts: dict[tuple, dict[int, int]] = {}
    sql_ms: dict[tuple, dict[int, float]] = {}
    for source, attempt, rank, step, start_us, ms in db.con.execute(
        "SELECT source, attempt, rank, step, start_us, duration_ms FROM steps"
    ).fetchall():
        sql_starts.setdefault((source, attempt, rank), {})[step] = start_us
        if ms is not None:
            sql_ms.setdefault((source, attempt, rank), {})[step] = ms
    model_starts = {
        (source, attempt, rank): steps
        for (source, attempt), per_rank in grid.step_starts.items()
        for rank, steps in per_rank.items()
    }
    model_ms = {
        (source, attempt, rank): steps
        for (source, attempt), per_rank in grid.step_ms.items()
        for rank, steps in per_rank.items()
        if steps
    }
    assert sql_starts == model_starts and len(model_starts) >= 8
    assert sql_ms.keys() == model_ms.keys()
    for key, steps in model_ms.items():
        assert sql_ms[key] == pytest.approx(steps, abs=1e-9), key


def test_step_closing_spans_alike(run) -> None:
    """SQL's step-closing spans (what `sql` aligns clocks on) are the model's, every step (the last
    included), by the same attempt stride."""
    logs, _ = select_run(read_run(run, log_skipped=False), None)
    collector, _ = collect_run(
        logs.processes, logs.run_dir, logs.log_dir, logs.skipped, cache=False, log_skipped=False
    )
    model = {}
    for process, spans in collector.closing:
        for step, name, start_us, end_us in zip(spans.steps, spans.names, spans.starts, spans.ends):
            model[(process.source, process.attempt, process.rank, step)] = (name, start_us, end_us)
    db = open_run(run, align=False)
    db.load()
    sql = {}
    for process_id, _, attempt, step, name, start_us, end_us in db.con.execute(
        CLOSING_SPANS_QUERY
    ).fetchall():
        source, attempt, rank = _identity(db, process_id)
        sql[(source, attempt, rank, rules.attempt_step(attempt, step))] = (name, start_us, end_us)
    assert sql == model and len(model) >= 8 * 6


def test_clock_offsets_alike(tmp_path) -> None:
    """Hosts 5 ms apart: `sql` subtracts the offsets `summarize` finds (the same spans, the same
    estimate)."""
    generate_run(
        str(tmp_path),
        RunSpec(
            ranks=8,
            steps=14,
            seed=6,
            ranks_per_host=2,
            host_offsets_us=[0, 5000, -3000, 12000],
            start_us=START,
        ),
    )
    summary = summarize_run(tmp_path)
    db = open_run(tmp_path)
    db.load()
    offsets = dict(db.con.execute("SELECT host_name, offset_us FROM clock_offsets").fetchall())
    assert summary.clock.applied and len(offsets) == 4
    assert offsets == pytest.approx(summary.clock.offsets_us, abs=0.5)


def test_logger_records_alike(run) -> None:
    """The logger's own records (a ``stall`` black box among them) are never a process's last event,
    in SQL as in summarize."""
    summary = summarize_run(run, align=False)
    db = open_run(run, align=False)
    db.load()
    sql = {
        (s, a, r): last
        for s, a, r, last in db.con.execute(
            "SELECT source, attempt, rank, last_event FROM processes"
        ).fetchall()
    }
    model = {(p.source, p.attempt, p.rank): p.last_event for p in summary.processes}
    assert sql == model
    flagged = {
        name
        for (name,) in db.con.execute(
            "SELECT DISTINCT name FROM instants WHERE logger_record"
        ).fetchall()
    }
    assert flagged <= rules.LOGGER_RECORDS and "structured_logger_opened" in flagged


def test_robust_spread_alike(run) -> None:
    """SQL's `robust_sd(x)` and `rules.robust_sd` (the spread a robust z is measured in), over every
    phase's span times."""
    db = open_run(run, align=False)
    db.load()
    rows = db.con.execute(
        "SELECT name, robust_sd(duration_ms), list(duration_ms) FROM spans WHERE NOT incomplete "
        "GROUP BY name"
    ).fetchall()
    assert len(rows) >= 4
    for name, spread, values in rows:
        assert spread == pytest.approx(rules.robust_sd(values), rel=1e-12, abs=1e-12), name
    odd, even = [1.0, 2.0, 4.0, 8.0, 100.0], [1.0, 2.0, 4.0, 8.0]
    for values in (odd, even):
        (spread,) = db.con.execute("SELECT robust_sd(v) FROM unnest(?) t(v)", [values]).fetchone()
        assert spread == pytest.approx(rules.robust_sd(values))


def test_rules_are_what_they_say() -> None:
    assert (
        rules.attempt_step(2, 7) == 2 * rules.ATTEMPT_STRIDE + 7 and rules.ATTEMPT_STRIDE > 1 << 32
    )
    assert (
        "stall" in rules.LOGGER_RECORDS
        and not rules.begins_step("stall")
        and not rules.begins_step("bwd_error")
    )
    assert rules.begins_step("loss") and rules.begins_step("fwd_start")
    assert rules.robust_sd([]) == 0.0 and math.isclose(
        rules.robust_sd([0.0, 1.0, 2.0]), rules.MAD_TO_SD
    )
    assert json.dumps(rules.sql_in_list(["x'y"])) == json.dumps("('x''y')")

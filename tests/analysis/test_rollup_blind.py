"""The analysis answers the same with the writer's ``step_rollup`` records as without them.

Rollups are totals of spans already in the file: no command may count them
again, draw them, take them for an instant or for progress. Checked on a real
2-rank torchrun run with rollups, against the same files with the rollup
lines taken out (docs/schema.md, "Step rollups").
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from otel_titan.analysis import generate_gantt_trace, summarize_run
from otel_titan.analysis.summarize.json_form import summary_json
from otel_titan.analysis.summarize.text import format_summary
from tests.helpers.analysis import TOY_STEPS
from tests.helpers.rollups import strip_rollups, toy_run_with_rollups

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


#: What differs, rightly, between the two copies: the lines and bytes read, and the line numbers
#: (``seq_id``).
_COUNTS = {"records", "input_bytes", "seq_id"}


def _comparable(value: Any, run: str) -> Any:
    """`value` with the run's path made neutral and the line counts taken out (`_COUNTS`)."""
    if isinstance(value, dict):
        return {key: _comparable(item, run) for key, item in value.items() if key not in _COUNTS}
    if isinstance(value, list):
        return [_comparable(item, run) for item in value]
    return value.replace(run, "<run>") if isinstance(value, str) else value


def test_summarize_and_export_answer_the_same_with_rollups(tmp_path):
    with_rollups = toy_run_with_rollups()
    without = strip_rollups(with_rollups, tmp_path / "without")
    rollups = sum(
        line.count(b'"log_type_name":"step_rollup"')
        for path in (with_rollups / "structured_logs").iterdir()
        for line in [path.read_bytes()]
    )
    assert rollups == 2 * TOY_STEPS  # one per rank and step
    now = 4e15
    answers, records = {}, {}
    for run in (with_rollups, without):
        summary = summarize_run(run, log_skipped=False)
        stats = generate_gantt_trace(run, tmp_path / f"{run.name}.json", log_skipped=False)
        trace = json.loads((tmp_path / f"{run.name}.json").read_text())
        # The text says how long ago the last record was (now is the moment it is printed): not
        # compared.
        text = re.sub(
            r"last record [0-9.]+ \w+ before now",
            "last record <ago>",
            format_summary(summary).replace(f"{summary.records} records", "<n> records"),
        )
        answers[run] = (
            _comparable(summary_json(summary, now_us=now), str(run)),
            _comparable(text, str(run)),
            _comparable(trace, str(run)),
            stats.instants,
            stats.spans,
        )
        records[run] = summary.records
    assert answers[with_rollups] == answers[without]
    # Read, not counted as anything: the records read are the only difference.
    assert records[with_rollups] == records[without] + rollups
    assert "step_rollup" not in json.dumps(answers[with_rollups][2])


def test_sql_answers_the_same_with_rollups(tmp_path):
    pytest.importorskip("duckdb")
    from otel_titan.analysis.query.sql import open_run

    with_rollups = toy_run_with_rollups()
    without = strip_rollups(with_rollups, tmp_path / "without")
    answers = {}
    for run in (with_rollups, without):
        db = open_run(run)
        try:
            db.load()
            answers[run] = {
                view: db.con.execute(
                    f"SELECT * EXCLUDE (process_id) FROM {view} ORDER BY ALL"
                ).fetchall()
                for view in ("spans", "instants", "scalars", "steps")
            }
            answers[run]["processes"] = db.con.execute(
                "SELECT rank, last_record, last_event, last_step, closed, records FROM processes "
                "ORDER BY rank"
            ).fetchall()
        finally:
            db.con.close()
    rollups = 2 * TOY_STEPS  # one per rank and step, in `records` only
    for view in ("spans", "instants", "scalars", "steps"):
        assert answers[with_rollups][view] == answers[without][view], view
    assert [row[:5] for row in answers[with_rollups]["processes"]] == [
        row[:5] for row in answers[without]["processes"]
    ]
    assert (
        sum(row[5] for row in answers[with_rollups]["processes"])
        == sum(row[5] for row in answers[without]["processes"]) + rollups
    )

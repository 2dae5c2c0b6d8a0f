"""`RunAnalysis`, the front: one run read once, the same answers as the commands."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis import (
    HangGroup,
    HangReport,
    RankPlace,
    RunAnalysis,
    RunSelection,
    StepRange,
    Suspect,
)
from otel_titan.analysis.report import write_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_hung_run_is_answered_from_one_read_and_agrees_with_summarize(tmp_path):
    run = str(tmp_path / "run")
    generate_run(run, RunSpec(ranks=8, steps=12, seed=1, hung=(5, 9), black_boxes=True))
    analysis = RunAnalysis(run, log_skipped=False)
    assert "not read yet" in repr(analysis)
    hang = analysis.hang()
    assert hang is not None and "read" in repr(analysis)
    # The model is kept: with the files gone, every later question is still answered, the same way.
    shutil.rmtree(run)
    assert analysis.hang() is hang
    assert any(
        line.startswith("hung:") or "rank 5" in line for line in analysis.headline()["diagnosis"]
    ), analysis.headline()["diagnosis"]
    assert "rank 5" in analysis.text()
    assert [p.rank for p in analysis.processes()] == list(range(8))
    assert analysis.missing() == []


def test_hang_is_the_exported_report_and_has_the_attributes_its_docstrings_name(tmp_path):
    run = str(tmp_path / "run")
    generate_run(run, RunSpec(ranks=8, steps=12, seed=1, hung=(5, 9), black_boxes=True))
    analysis = RunAnalysis(run, log_skipped=False)
    hang = analysis.hang()
    assert type(hang) is HangReport
    assert hang.verdict == "named" and [type(s) for s in hang.suspects] == [Suspect] * len(
        hang.suspects
    )
    assert hang.suspects[0].rank == 5 and hang.suspects[0].rule, hang.suspects
    assert hang.groups and all(type(g) is HangGroup for g in hang.groups)
    assert sorted(p.rank for p in hang.places if type(p) is RankPlace) == list(range(8))
    # Every attribute (a lowercase name in single backticks) that `hang()`'s and `HangReport`'s
    # docstrings name is a field.
    named = set(
        re.findall(
            r"(?<!`)`([a-z_]+)`(?!`)", inspect.getdoc(RunAnalysis.hang) + (HangReport.__doc__ or "")
        )
    )
    fields = {
        f.name
        for cls in (HangReport, Suspect, HangGroup, RankPlace)
        for f in dataclasses.fields(cls)
    }
    assert {
        "verdict",
        "suspects",
        "groups",
        "places",
        "notes",
        "rule",
        "where",
    } <= named and named <= fields, named - fields
    as_json = json.loads(json.dumps(analysis.to_json()["hang"], default=str))
    assert as_json == json.loads(json.dumps(dataclasses.asdict(hang), default=str))


def test_the_front_gives_what_the_commands_give(tmp_path):
    run = str(tmp_path / "run")
    generate_run(run, RunSpec(ranks=16, steps=30, seed=3, noise=0.05, straggler=(11, "bwd", 25.0)))
    analysis = RunAnalysis(run, log_skipped=False)
    findings = analysis.stragglers(headline_only=True)
    assert {f.rank for f in findings if f.verdict == "straggler"} == {11}
    assert "rank 11" in analysis.text().split("Look first at", 1)[1]
    command = subprocess.run(
        [sys.executable, "-m", "otel_titan.cli", "summarize", run, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert command.returncode == 0, command.stderr
    printed = json.loads(command.stdout)
    mine = json.loads(json.dumps(analysis.to_json(), default=str))
    assert printed["headline"]["diagnosis"] == mine["headline"]["diagnosis"]
    assert list(printed)[0] == list(mine)[0] == "headline"
    assert printed["stragglers"] == mine["stragglers"]


def test_tail_mode_answers_where_each_rank_stopped(tmp_path):
    run = str(tmp_path / "run")
    generate_run(run, RunSpec(ranks=8, steps=12, seed=2, hung=(3, 7), black_boxes=True))
    full, tail = RunAnalysis(run, log_skipped=False), RunAnalysis(run, tail=True, log_skipped=False)
    assert tail.summary.tail_only and not full.summary.tail_only
    assert tail.headline()["groups"] == full.headline()["groups"]


def test_a_second_analysis_of_a_run_that_grew_answers_as_a_full_read(tmp_path):
    """`cache` (default on): the second `RunAnalysis` reads only what was appended; ``cache=False``
    reads it all."""
    run = tmp_path / "run"
    generate_run(str(run), RunSpec(ranks=4, steps=12, seed=2, straggler=(1, "fwd", 40.0)))
    files = sorted((run / "structured_logs").glob("*.jsonl"))
    whole = {path: path.read_bytes() for path in files}
    for path, data in whole.items():
        path.write_bytes(data[: data.rindex(b"\n", 0, len(data) // 2) + 1])
    RunAnalysis(str(run), log_skipped=False).to_json()
    assert (run / "analysis" / "cache").is_dir()
    for path, data in whole.items():
        path.write_bytes(data)
    cached = RunAnalysis(str(run), log_skipped=False).to_json()
    full = RunAnalysis(str(run), log_skipped=False, cache=False).to_json()
    assert full["stragglers"] and _timeless(cached) == _timeless(full)


def test_the_report_is_drawn_from_the_model_the_other_questions_were_answered_from(tmp_path):
    """`RunAnalysis.report` reads nothing the model holds: with the files gone after the first
    question, the page is the one ``write_report`` draws from a read of its own."""
    pytest.importorskip("plotly")
    run = tmp_path / "run"
    generate_run(str(run), RunSpec(ranks=8, steps=20, seed=4, straggler=(6, "fwd", 30.0)))
    alone = write_report(run, tmp_path / "alone.html")
    analysis = RunAnalysis(run, log_skipped=False)
    assert {f.rank for f in analysis.stragglers(headline_only=True)} == {6}
    shutil.rmtree(run / "structured_logs")
    said: list[str] = []
    held = analysis.report(tmp_path / "held.html", progress=said.append)
    assert said == ["drawing ..."]  # no "reading the run ...": it was read
    assert (held.figures, held.ranks, held.steps, held.binning) == (
        alone.figures,
        alone.ranks,
        alone.steps,
        alone.binning,
    )
    assert (tmp_path / "held.html").read_bytes() == (tmp_path / "alone.html").read_bytes()


def test_a_selection_is_narrowed_by_the_options_given_beside_it(tmp_path):
    run = tmp_path / "run"
    generate_run(str(run), RunSpec(ranks=4, steps=5, seed=5))
    selection = RunSelection.of(run, ranks=[0, 1, 2], align=False)
    analysis = RunAnalysis(selection, ranks=[2, 1])
    assert analysis.selection == selection.with_(ranks=[1, 2]) and analysis.path == str(run)
    assert [p.rank for p in analysis.processes()] == [1, 2]
    assert analysis.choice().how == "only"
    db = analysis.database()
    db.load()
    assert db.con.execute("SELECT DISTINCT rank FROM spans ORDER BY rank").fetchall() == [
        (1,),
        (2,),
    ]


def test_options_that_cannot_go_together_are_refused_before_anything_is_read(tmp_path):
    nowhere = tmp_path / "nowhere"
    with pytest.raises(ValueError, match="tail"):
        RunAnalysis(nowhere, tail=True, steps=StepRange(1, 5))
    with pytest.raises(ValueError, match="jobs: must be at least 1"):
        RunAnalysis(nowhere, jobs=0)
    with pytest.raises(ValueError, match="tail=True reads only the files' ends"):
        RunAnalysis(nowhere, tail=True).report(tmp_path / "r.html")
    assert not nowhere.exists() and not (tmp_path / "r.html").exists()


def test_summarize_refuses_no_workers_as_export_and_report_do(tmp_path):
    # Once summarize alone let `--jobs 0` through (as one job); the one selection checks it for all.
    for command in ("summarize", "export", "report"):
        result = subprocess.run(
            [sys.executable, "-m", "otel_titan.cli", command, str(tmp_path), "--jobs", "0"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        assert result.returncode == 2, (command, result.stderr)
        assert "--jobs: must be at least 1, got 0" in result.stderr, (command, result.stderr)


def _timeless(value):
    """Without the ages relative to now (``*_s_before_now``), which differ by the time between two
    calls."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if not k.endswith("_before_now")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value

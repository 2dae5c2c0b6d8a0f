"""Every command answers as it did: golden outputs of generated runs, so "nothing the analysis did
is lost" stays checked.

Issue 19 ("Tests and benchmarks") asks that every command give the same answer
before and after the analysis redesign. That was checked once against the
checkout before it (a5b5110, the equivalence report of the `equiv` branch);
this module keeps it checked without the old checkout: each command's output
on a set of deterministic generated runs (benchmarks/generate_run.py, fixed
seed and start time) is compared with the output stored in
``tests/analysis/golden/<run>.json``, normalised (`normalise`: the run's path,
times measured against now, the read's speed; floats to 9 significant
digits). Traces and the report's figures are stored as digests (`_trace_digest`,
`_perfetto_digest`, `_report_digest`): per-name counts and sums a reader can
diff, plus a hash of every event or point, so a golden file stays a few KB.

Runs: healthy, a straggler, a hang (with and without the watchdog's black
boxes), a crash, a restart, clock offsets and drift, a pipeline mesh, two
runs in one folder, and torchtitan's own files (no span ids, a torn line, a
lone surrogate, a line that is no UTF-8); each without and with the writer's step rollups (which
must not change an answer: the rollup runs are compared with the same golden,
less the counts of lines and bytes read, `_COUNTED`).

When an output changes on purpose, regenerate the goldens and review the diff
(``git diff tests/analysis/golden``) before committing::

    .venv/bin/python -m tests.analysis.test_equivalence --regenerate

A mismatch fails naming the run, the command, the path in its output and both
values (`assert_matches`; `test_a_changed_answer_fails_loudly` checks it does).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import re
import shutil
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.cli import main

GOLDEN = Path(__file__).parent / "golden"
#: A fixed wall-clock start (µs), so that every record, and so every output, is the same on every
#: machine.
START_US = 1_796_015_820_000_000

#: Run kinds: RunSpec fields on top of `_BASE` (9 ranks on 3 hosts of 3, 10 steps: more than 8, so
#: summarize groups them and --all does not).
_BASE: dict[str, Any] = {
    "ranks": 9,
    "steps": 10,
    "seed": 3,
    "ranks_per_host": 3,
    "start_us": START_US,
}
RUNS: dict[str, dict[str, Any]] = {
    "healthy": {},
    "straggler": {"straggler": (5, "data_fetch", 150.0)},
    "hung": {"hung": (3, 6)},
    "hung_black_boxes": {"hung": (3, 6), "black_boxes": True},
    "crashed": {"crashed": (7, 5)},
    "restart": {"restart": (2, 6)},
    "clock_drift": {"offset_ms": 40.0, "drift_ms": 8.0, "drift_hosts": (1,)},
    "pp_mesh": {"pp": 3, "last_stage_fwd_pct": 15.0},
    "two_runs": {},  # `_make_run`: a healthy run-a, then a later run-b with a straggler, in one folder
    "torchtitan_files": {},  # `_torchtitan_files`: as torchtitan writes them (no span ids, no run id), a torn line, a lone surrogate
}

#: Output keys that count lines and bytes read: the rollup lines add to them, and nothing else may
#: change.
_COUNTED = {"records", "input_bytes", "bytes", "seq_id", "lines"}


def _torchtitan_files(out: Path) -> None:
    """4 ranks × 8 steps of torchtitan's records (tests/helpers/analysis.py), rank 2 slower in
    data_fetch; rank 3's last line torn mid-write, rank 1's last record named with a lone surrogate,
    a line of rank 0 not UTF-8 at all."""
    from tests.helpers.analysis import titan_file, titan_record, titan_span

    (out / "structured_logs").mkdir(parents=True)
    for rank in range(4):
        records, late = [], 30.0 if rank == 2 else 0.0
        for step in range(1, 9):
            t = (step - 1) * 100.0
            records += titan_span("data_fetch", t, t + 5 + late, rank=rank, step=step)
            records += titan_span("fwd_bwd", t + 5 + late, t + 60 + late, rank=rank, step=step)
            records.append(
                titan_record(
                    "metric_value",
                    t + 61 + late,
                    log_type="scalar",
                    rank=rank,
                    step=step,
                    event_name="loss",
                    value=2.5 - step / 10,
                )
            )
            records += titan_span("optimizer", t + 61 + late, t + 70 + late, rank=rank, step=step)
        records.append(
            titan_record(
                "note\udcff" if rank == 1 else "note", 800.0, log_type="instant", rank=rank, step=8
            )
        )
        # the surrogate as JSON writes it: "\udcff"
        lines = [json.dumps(record).encode() for record in records]
        if rank == 0:
            # not UTF-8: skipped, said
            lines.insert(10, b'{"log_type": "event", "log_type_name": "bad\xff\xfe"}')
        text = b"\n".join(lines) + (b"\n" + lines[-2][:40] if rank == 3 else b"\n")
        titan_file(out, rank).write_bytes(text)


def _make_run(kind: str, out: Path, rollups: bool) -> Path:
    """Write run `kind` under `out` (deterministic: the same bytes every time)."""
    if kind == "torchtitan_files":
        _torchtitan_files(out)
    elif kind == "two_runs":
        generate_run(
            str(out), RunSpec(**{**_BASE, "run_id": "run-a", "seed": 1, "rollups": rollups}), jobs=1
        )
        later = out.parent / f"{out.name}-b"
        generate_run(
            str(later),
            RunSpec(
                **{
                    **_BASE,
                    "run_id": "run-b",
                    "seed": 2,
                    "start_us": START_US + 3_600_000_000,
                    "straggler": (2, "fwd", 60.0),
                    "rollups": rollups,
                }
            ),
            jobs=1,
        )
        for path in (later / "structured_logs").iterdir():
            path.rename(out / "structured_logs" / path.name)
        shutil.rmtree(later)
    else:
        generate_run(str(out), RunSpec(**{**_BASE, **RUNS[kind], "rollups": rollups}), jobs=1)
    (out / "ground_truth.json").unlink(missing_ok=True)
    # Files last written long ago (two hours after the start), not seconds before the command:
    # `watch` and the process states read liveness from the files' times, which must not depend on
    # how fast this machine is.
    written = START_US / 1e6 + 7200
    for path in (out / "structured_logs").iterdir():
        os.utime(path, (written, written))
    return out


# -- normalising -----------------------------------------------------------------------------------
_TEXT_RULES = [
    # Times measured against the clock of the machine that runs the command.
    (re.compile(r"\d+(?:\.\d+)?\s?(?:µs|ms|s|min|h|d)( ago| before now)"), r"<age>\1"),
    (re.compile(r"written \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"), "written <now> UTC"),
    (re.compile(r"no progress for [\d,]+(?:\.\d+)? (s|min|h)\b"), r"no progress for <age> \1"),
    # The read's own speed.
    (re.compile(r"in \d+(?:\.\d+)? s \(\d+(?:\.\d+)? MB/s\)"), "in <s> s (<rate> MB/s)"),
    (re.compile(r"read in \d+(?:\.\d+)? s"), "read in <s> s"),
    # A trace's size: it holds the run's path, whose length is the machine's.
    (re.compile(r"at most; [\d.]+ [kMG]?B\b"), "at most; <size>"),
    (re.compile(r"\.html \([\d.]+ [kMG]?B,"), ".html (<size>,"),
]
_COUNT_RULES = [
    (re.compile(r"[\d,]+ records\b"), "<n> records"),
    (re.compile(r"\(?[\d.]+ [kMG]?B\)?( of JSONL)?"), r"<size>\1"),
    # A tail is the last bytes of each file: with rollup lines in them, it starts at another record.
    (re.compile(r"files' ends, [^;]*;"), "files' ends, <window>;"),
    # Line numbers: the rollup lines come before.
    (re.compile(r"\.jsonl:\d+:"), ".jsonl:<line>:"),
]
#: With `_COUNTED` also out: where a tail's window begins (the first record of the last bytes read).
_TAIL_WINDOW = {"first_us", "first_utc", "duration_s"}
#: JSON keys whose value is measured against now or by the read itself (a hang alert's cost grows
#: with the time since it stopped).
_CLOCK_KEYS = re.compile(
    r"(_before_now|^age_s|^time_utc|^detected_utc|^since_utc|^cpu_s|^elapsed_s|^read_s|^stopped_s|^rank_seconds_lost)$"
)


def normalise_text(text: str, run: Path, counted: bool = True) -> str:
    """`text` with the run's path as ``<run>``, times against now and the read's speed as
    placeholders."""
    text = text.replace(str(run), "<run>")
    for pattern, replacement in _TEXT_RULES + ([] if counted else _COUNT_RULES):
        text = pattern.sub(replacement, text)
    return text


def normalise(value: Any, run: Path, counted: bool = True) -> Any:
    """A JSON value normalised as `normalise_text` does, floats to 9 significant digits;
    ``counted=False`` drops `_COUNTED`."""
    if isinstance(value, dict):
        return {
            key: "<now>"
            if _CLOCK_KEYS.search(key) and item is not None
            else normalise(item, run, counted)
            for key, item in value.items()
            if counted or key not in _COUNTED
        }
    if isinstance(value, list):
        return [normalise(item, run, counted) for item in value]
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else float(f"{value:.9g}")
    if isinstance(value, str):
        return normalise_text(value, run, counted)
    return value


def _drop(value: Any, keys: set[str]) -> Any:
    """`value` without `keys`, at any depth."""
    if isinstance(value, dict):
        return {key: _drop(item, keys) for key, item in value.items() if key not in keys}
    if isinstance(value, list):
        return [_drop(item, keys) for item in value]
    return value


def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _trace_digest(path: Path, run: Path, counted: bool = True) -> dict[str, Any]:
    """A Chrome trace as (process, event name, phase) → count, total duration and first time, plus
    the hash of every event."""
    trace = normalise(json.loads(path.read_text()), run, counted)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    rows: dict[str, list[float]] = {}
    for event in events:
        key = f"{processes.get(event.get('pid'), event.get('pid'))} | {event.get('name')} | {event.get('ph')}"
        row = rows.setdefault(key, [0, 0.0, math.inf])
        row[0] += 1
        row[1] += float(event.get("dur") or 0)
        row[2] = min(row[2], float(event.get("ts") or 0))
    other = (
        {key: value for key, value in trace.items() if key != "traceEvents"}
        if isinstance(trace, dict)
        else {}
    )
    return {
        "events": {key: [n, float(f"{d:.9g}"), t] for key, (n, d, t) in sorted(rows.items())},
        "other": other,
        "hash": _hash(sorted(json.dumps(e, sort_keys=True) for e in events)),
    }


def _perfetto_digest(path: Path, run: Path) -> dict[str, Any]:
    """A native Perfetto trace decoded with Perfetto's own protos: track names, slice name → count
    and total length, a hash of all slices."""
    # a test dependency, only here
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
        Trace,
    )

    trace = Trace()
    trace.ParseFromString(path.read_bytes())
    packets = []
    for packet in trace.packet:
        if packet.HasField("compressed_packets"):
            inner = Trace()
            inner.ParseFromString(zlib.decompress(packet.compressed_packets))
            packets.extend(inner.packet)
        else:
            packets.append(packet)
    # the decoder those tests check the format with
    from tests.analysis.export.test_perfetto import (
        slices,
    )

    found = slices(packets)
    rows: dict[str, list[float]] = {}
    for _pid, name, begin, end in found:
        row = rows.setdefault(name, [0, 0])
        row[0] += 1
        row[1] += (end - begin) if end is not None else 0
    tracks = sorted(
        {
            normalise_text(
                p.track_descriptor.name
                or p.track_descriptor.process.process_name
                or p.track_descriptor.thread.thread_name,
                run,
            )
            for p in packets
            if p.HasField("track_descriptor")
        }
    )
    return {
        "tracks": tracks,
        "slices": {name: row for name, row in sorted(rows.items())},
        "hash": _hash(sorted(repr(s) for s in found)),
    }


def _report_digest(path: Path, run: Path) -> dict[str, Any]:
    """The report's page text (no markup, no scripts) and, per figure, its title, its traces' names,
    types and sizes, a hash of its data."""
    page = path.read_text()
    figures = []
    for payload in re.findall(r"var f = (\{.*?\}); Plotly\.newPlot", page, flags=re.S):
        figure = normalise(_plain_arrays(json.loads(payload)), run)
        title = (figure.get("layout", {}).get("title") or {}).get("text")
        traces = [
            {
                "type": t.get("type"),
                "name": t.get("name"),
                "points": len(t.get("y") or t.get("z") or t.get("x") or []),
            }
            for t in figure["data"]
        ]
        figures.append({"title": title, "traces": traces, "hash": _hash(figure["data"])})
    body = re.sub(r"<(script|style)\b.*?</\1>|<meta[^>]*>", "", page, flags=re.S)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)).strip()
    return {"figures": figures, "text": normalise_text(text, run)}


def _plain_arrays(value: Any) -> Any:
    """Plotly's typed arrays (``{"dtype", "bdata"[, "shape"]}``, base64) as plain lists: one form
    whatever Plotly chose."""
    import base64

    import numpy as np

    if isinstance(value, dict) and "bdata" in value and "dtype" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        if "shape" in value:
            array = array.reshape([int(n) for n in str(value["shape"]).split(",")])
        return array.tolist()
    if isinstance(value, dict):
        return {key: _plain_arrays(item) for key, item in value.items() if key != "template"}
    if isinstance(value, list):
        return [_plain_arrays(item) for item in value]
    return value


# -- the commands ----------------------------------------------------------------------------------
_SQL = {
    "sql_views": None,
    "sql_steps": "SELECT run_id, attempt, step, count(*) AS ranks, min(start_us), max(end_us), sum(end_us - start_us) AS us FROM steps GROUP BY ALL ORDER BY ALL",
    "sql_processes": "SELECT * EXCLUDE (file, bytes, records) FROM processes ORDER BY ALL",
    "sql_spans": "SELECT run_id, attempt, name, count(*) AS n, sum(end_us - start_us) AS us, count(*) FILTER (WHERE incomplete) AS open, "
    "list(DISTINCT rank ORDER BY rank) FILTER (WHERE incomplete) AS open_on, min(step), max(step) "
    "FROM spans GROUP BY ALL ORDER BY ALL",
    "sql_instants": "SELECT run_id, attempt, name, logger_record, signal, count(*) AS n, list(DISTINCT rank ORDER BY rank) AS ranks, min(step), max(step), "
    "min(time_us), max(time_us) FROM instants GROUP BY ALL ORDER BY ALL",
    "sql_scalars": "SELECT run_id, rank, name, count(*) AS n, min(value), max(value), min(step), max(step) FROM scalars GROUP BY ALL ORDER BY ALL",
    "sql_clock": "SELECT * FROM clock_offsets ORDER BY ALL",
}

#: Commands whose whole answer would make a golden file large, and mostly repeat `summarize_json`:
#: their headline (or first lines) kept as they are, the rest as a hash (a change fails;
#: `summarize_json` shows where).
_DIGESTED = {"summarize_no_align", "summarize_ranks", "tail_json", "summarize_all"}
#: Of summarize's per-process rows (most of its JSON), what the golden keeps in the open; the rest
#: is in the rows' hash.
_PROCESS_KEYS = (
    "label",
    "attempt",
    "state",
    "last_step",
    "last_event",
    "last_phase",
    "open_spans",
    "signal",
    "clock_offset_ms",
    "behind_s",
    "hang_suspect",
)


def _commands(
    run: Path, out: Path, counted: bool
) -> dict[str, tuple[list[str], Callable[[], Any] | None]]:
    """Command name → (its arguments, what to read from the file it writes, or None: its stdout)."""
    commands: dict[str, tuple[list[str], Callable[[], Any] | None]] = {
        "summarize_json": (["summarize", str(run), "--json"], None),
        "summarize_text": (["summarize", str(run)], None),
        "summarize_all": (["summarize", str(run), "--all"], None),
        "summarize_no_align": (["summarize", str(run), "--json", "--no-align"], None),
        "summarize_ranks": (["summarize", str(run), "--json", "--ranks", "0-3"], None),
        "tail_text": (["summarize", str(run), "--tail"], None),
        "tail_json": (["summarize", str(run), "--tail", "--json"], None),
        "export_json": (
            ["export", str(run), "-o", str(out / "trace.json")],
            lambda: _trace_digest(out / "trace.json", run, counted),
        ),
        "export_steps": (
            ["export", str(run), "-o", str(out / "steps.json"), "--steps", "3:5"],
            lambda: _trace_digest(out / "steps.json", run, counted),
        ),
        "export_perfetto": (
            ["export", str(run), "-o", str(out / "trace.pftrace")],
            lambda: _perfetto_digest(out / "trace.pftrace", run),
        ),
        "report": (
            ["report", str(run), "-o", str(out / "report.html")],
            lambda: _report_digest(out / "report.html", run),
        ),
        "watch": (["watch", str(run), "--once", "--json", "--no-trigger"], None),
    }
    for name, query in _SQL.items():
        if query is None and run.name != "healthy":
            continue  # the views and their columns: the same for every run
        commands[name] = (["sql", str(run), *([query, "--format", "json"] if query else [])], None)
    return commands


def outputs(run: Path, out: Path, counted: bool = True) -> dict[str, Any]:
    """Every command's answer on `run`, normalised: exit code, stdout (parsed when JSON) and stderr,
    or the file it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    answers = {}
    for name, (args, written) in _commands(run, out, counted).items():
        # summarize --json writes to stdout.buffer
        stdout, stderr = (
            io.TextIOWrapper(io.BytesIO(), encoding="utf-8"),
            io.StringIO(),
        )
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = int(main([*args, "--no-progress"] if name != "watch" else args))
        stdout.flush()
        text = stdout.buffer.getvalue().decode("utf-8")
        try:
            parsed: Any = (
                [json.loads(line) for line in text.splitlines()]
                if name == "watch"
                else json.loads(text)
            )
        except ValueError:
            parsed = text.splitlines()
        answer = {"exit": code, "stdout": parsed, "stderr": stderr.getvalue().splitlines()}
        if written is not None:
            answer["stdout"] = text.replace(str(out), "<out>").splitlines()
            answer["written"] = written() if code == 0 else None
        answer = normalise(answer, run, counted)
        if not counted and name.startswith("tail_"):
            answer = _drop(answer, _TAIL_WINDOW)
        if name in _DIGESTED and isinstance(answer["stdout"], dict):
            answer["stdout"] = {
                "headline": answer["stdout"].get("headline"),
                "hash": _hash(answer["stdout"]),
            }
        elif name in _DIGESTED:  # text: its first lines (the verdict) and a hash of all
            answer["stdout"] = {
                "head": answer["stdout"][:6],
                "lines": len(answer["stdout"]),
                "hash": _hash(answer["stdout"]),
            }
        elif name == "summarize_json" and isinstance(answer["stdout"], dict):
            summary = answer["stdout"]
            summary["processes"] = {
                "hash": _hash(summary.get("processes")),
                "each": [
                    {key: p.get(key) for key in _PROCESS_KEYS}
                    for p in summary.get("processes") or []
                ],
            }
        answers[name] = answer
    return answers


# -- comparing -------------------------------------------------------------------------------------
def differences(actual: Any, golden: Any, path: str = "", limit: int = 20) -> list[str]:
    """Where `actual` differs from `golden`: one line per difference (path, golden value, actual
    value), at most `limit`."""
    found: list[str] = []

    def walk(a: Any, g: Any, where: str) -> None:
        if len(found) >= limit:
            return
        if isinstance(a, dict) and isinstance(g, dict):
            for key in sorted(set(a) | set(g), key=str):
                if key not in a:
                    found.append(f"{where}/{key}: golden {json.dumps(g[key])[:300]}, now missing")
                elif key not in g:
                    found.append(
                        f"{where}/{key}: not in the golden, now {json.dumps(a[key])[:300]}"
                    )
                else:
                    walk(a[key], g[key], f"{where}/{key}")
        elif isinstance(a, list) and isinstance(g, list) and len(a) == len(g):
            for index, (x, y) in enumerate(zip(a, g)):
                walk(x, y, f"{where}[{index}]")
        elif a != g:
            found.append(f"{where}: golden {json.dumps(g)[:300]}, now {json.dumps(a)[:300]}")

    walk(actual, golden, path)
    return found


def assert_matches(
    actual: dict[str, Any],
    golden: dict[str, Any],
    label: str,
    against: str = "tests/analysis/golden/",
) -> None:
    """Fail naming every command whose answer differs from the golden one (or `against`'s), with
    where and how (`differences`)."""
    report = []
    for command in sorted(set(actual) | set(golden)):
        lines = differences(actual.get(command), golden.get(command), command)
        if lines:
            report.append(f"  {command}:\n" + "\n".join(f"    {line}" for line in lines))
    if report:
        hint = (
            " (if on purpose: `.venv/bin/python -m tests.analysis.test_equivalence --regenerate`, "
            "then review `git diff tests/analysis/golden`)"
            if against.startswith("tests/analysis/golden")
            else ""
        )
        raise AssertionError(
            f"{label}: {len(report)} command(s) answer differently from {against}{hint}:\n"
            + "\n".join(report)
        )


def _golden(kind: str) -> dict[str, Any]:
    path = GOLDEN / f"{kind}.json"
    if not path.exists():
        raise AssertionError(
            f"no golden output for run {kind!r} ({path}): write it with `.venv/bin/python -m "
            "tests.analysis.test_equivalence --regenerate`"
        )
    return json.loads(path.read_text())


# -- the tests -------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch):
    """No variable of the user's may change an answer (a terminal's width, a dump trigger)."""
    for name in list(os.environ):
        if name.startswith("OTEL_TITAN_") and name not in (
            "OTEL_TITAN_STEP_ROLLUPS",
            "OTEL_TITAN_PROCESS_FIGURES",
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "160")


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_every_command_answers_as_its_golden(kind, tmp_path):
    run = _make_run(kind, tmp_path / kind, rollups=False)
    assert_matches(outputs(run, tmp_path / "out"), _golden(kind), f"run {kind}")


@pytest.mark.parametrize("kind", ["hung_black_boxes", "restart"])
def test_rollups_change_no_answer(kind, tmp_path):
    """The writer's step rollups (on by default) are the logger's own lines: only the counts of
    lines and bytes read may change.

    Compared with the same run written without them, both read now (the golden's hashes include the
    counts).
    """
    with_rollups = _make_run(kind, tmp_path / "with" / kind, rollups=True)
    without = _make_run(kind, tmp_path / "without" / kind, rollups=False)
    assert_matches(
        outputs(with_rollups, tmp_path / "out-with", counted=False),
        outputs(without, tmp_path / "out-without", counted=False),
        f"run {kind} with rollups",
        against="the same run without rollups",
    )


def test_a_changed_answer_fails_loudly(tmp_path):
    """A golden that no longer matches fails naming the command, the path in its output and both
    values; a missing golden fails too."""
    golden = _golden("straggler")
    changed = json.loads(json.dumps(golden))
    changed["summarize_json"]["stdout"]["run_id"] = "a different answer"
    changed["sql_steps"]["stdout"] = changed["sql_steps"]["stdout"][:-1]
    with pytest.raises(AssertionError) as failure:
        assert_matches(golden, changed, "run straggler")
    message = str(failure.value)
    assert "2 command(s)" in message
    assert 'summarize_json/stdout/run_id: golden "a different answer", now "gen-run"' in message
    assert "sql_steps/stdout:" in message
    assert "--regenerate" in message
    with pytest.raises(AssertionError, match="no golden output for run 'nowhere'"):
        _golden("nowhere")


def _dumps(value: Any, indent: str = "") -> str:
    """JSON with every list or object that fits in 120 characters on one line: small files, diffs
    that still point at a line."""
    flat = json.dumps(value, sort_keys=True, ensure_ascii=False)
    if len(flat) + len(indent) <= 120 or not isinstance(value, (dict, list)) or not value:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [
            f"{inner}{json.dumps(key, ensure_ascii=False)}: {_dumps(value[key], inner).lstrip()}"
            for key in sorted(value)
        ]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    return (
        "[\n"
        + ",\n".join(inner + _dumps(item, inner).lstrip() for item in value)
        + "\n"
        + indent
        + "]"
    )


def regenerate(kinds: list[str]) -> None:
    """Write the golden outputs of `kinds` (all runs when empty) from the code as it is now."""
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    os.environ["COLUMNS"] = "160"
    for name in [
        n
        for n in os.environ
        if n.startswith("OTEL_TITAN_")
        and n not in ("OTEL_TITAN_STEP_ROLLUPS", "OTEL_TITAN_PROCESS_FIGURES")
    ]:
        del os.environ[name]
    os.environ["OTEL_TITAN_STEP_ROLLUPS"] = os.environ["OTEL_TITAN_PROCESS_FIGURES"] = "0"
    for kind in kinds or sorted(RUNS):
        with tempfile.TemporaryDirectory() as folder:
            run = _make_run(kind, Path(folder) / kind, rollups=False)
            answers = outputs(run, Path(folder) / "out")
        (GOLDEN / f"{kind}.json").write_text(_dumps(answers) + "\n")
        print(f"wrote {GOLDEN / kind}.json")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Regenerate tests/analysis/golden/ from the code as it is now (review the diff before committing)."
    )
    parser.add_argument(
        "--regenerate", action="store_true", required=True, help="write the golden outputs"
    )
    parser.add_argument(
        "kinds",
        nargs="*",
        metavar="RUN",
        help=f"only these runs (default: all of {', '.join(RUNS)})",
    )
    chosen = parser.parse_args().kinds
    if unknown := sorted(set(chosen) - set(RUNS)):
        parser.error(f"no such run: {', '.join(unknown)} (runs: {', '.join(RUNS)})")
    regenerate(chosen)
    sys.exit(0)

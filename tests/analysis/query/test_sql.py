"""`otel-titan sql`: the views over generated runs whose answers are known
(benchmarks/generate_run.py), torn lines, rotated segments, output formats."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest

pytest.importorskip("duckdb")

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis import generate_gantt_trace, summarize_run
from otel_titan.analysis.query.sql import VIEWS, open_run, open_saved
from tests.conftest import REPO
from tests.helpers.analysis import titan_file, titan_record, titan_span, write_jsonl

RANKS, STEPS = 16, 20
STRAGGLER, HUNG = (5, "fwd", 30.0), (9, 15)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("sql-run")
    truth = generate_run(
        str(out),
        RunSpec(
            ranks=RANKS,
            steps=STEPS,
            seed=3,
            straggler=STRAGGLER,
            hung=HUNG,
            start_us=1_796_000_000_000_000,
        ),
    )
    return out, truth


@pytest.fixture(scope="module")
def db(run):
    database = open_run(run[0])
    database.load()
    return database


def rows(db, sql: str) -> list[tuple]:
    return db.con.execute(sql).fetchall()


def test_clock_offsets_are_the_injected_ones(db, run) -> None:
    truth = run[1]["host_offsets_us"]
    found = dict(rows(db, "SELECT host_name, offset_us FROM clock_offsets"))
    assert sorted(found) == sorted(truth)
    # Only differences between clocks can be known: compare both relative to host node-000.
    for host in truth:
        assert abs((found[host] - found["node-000"]) - (truth[host] - truth["node-000"])) < 50, host
    # Aligned: the collective's ends agree across hosts within µs; as written they were milliseconds
    # apart.
    spread = rows(
        db,
        "SELECT max(p) FROM (SELECT step, max(end_us) - min(end_us) AS p FROM spans WHERE name = "
        "'all_reduce' AND NOT incomplete GROUP BY step)",
    )[0][0]
    raw = rows(
        db,
        "SELECT max(p) FROM (SELECT s.step, max(r.host_time_us) - min(r.host_time_us) AS p FROM "
        "records r JOIN spans s USING (process_id, span_id) "
        "WHERE r.log_type_name = 'all_reduce_end' GROUP BY s.step)",
    )[0][0]
    assert spread < 100 and raw > 1000


def test_spans_match_summarize(db, run) -> None:
    summary = summarize_run(run[0])
    by_sql = {
        name: (count, incomplete)
        for name, count, incomplete in rows(
            db, "SELECT name, count(*), count(*) FILTER (WHERE incomplete) FROM spans GROUP BY name"
        )
    }
    for phase in summary.phases:
        count, incomplete = by_sql[phase.name]
        assert (count, incomplete) == (phase.count + phase.incomplete, phase.incomplete), phase.name
        p50 = rows(
            db,
            f"SELECT quantile_disc(duration_ms, 0.5) FROM spans WHERE name = '{phase.name}' AND "
            "NOT incomplete",
        )[0][0]
        assert p50 == pytest.approx(phase.p50_ms, rel=0.02), phase.name


def test_straggler_and_hang_are_found(db) -> None:
    rank, phase, pct = STRAGGLER
    per_rank = rows(
        db,
        f"SELECT rank, median(duration_ms) FROM spans WHERE name = '{phase}' GROUP BY rank ORDER "
        "BY 2 DESC",
    )
    assert per_rank[0][0] == rank
    others = median(v for r, v in per_rank if r != rank)
    assert per_rank[0][1] / others == pytest.approx(1 + pct / 100, rel=0.05)
    hung_rank, hung_step = HUNG
    open_spans = rows(
        db, "SELECT rank, step, name FROM spans WHERE incomplete AND parent_span_id IS NOT NULL"
    )
    assert open_spans == [(hung_rank, hung_step, "bwd")]
    waiting = rows(
        db,
        "SELECT count(DISTINCT rank), min(step), max(step) FROM spans WHERE incomplete AND name = "
        "'all_reduce'",
    )
    assert waiting == [(RANKS - 1, hung_step, hung_step)]
    processes = rows(
        db,
        "SELECT count(*), count(*) FILTER (WHERE closed), max(last_step), min(last_step) FROM "
        "processes",
    )
    assert processes == [(RANKS, 0, hung_step, hung_step)]
    assert rows(db, f"SELECT last_event FROM processes WHERE rank = {hung_rank}") == [
        ("bwd_start",)
    ]


def test_steps_and_scalars(db) -> None:
    # steps: every rank has steps 1..15 (the hang's step has no end); step time ≈ the sum of the
    # phases.
    assert rows(
        db,
        "SELECT count(DISTINCT rank), min(step), max(step), count(*) FILTER (WHERE duration_ms IS "
        "NULL) FROM steps",
    ) == [(RANKS, 1, HUNG[1], RANKS)]
    step_ms = rows(db, "SELECT median(duration_ms) FROM steps")[0][0]
    assert 100 < step_ms < 130
    assert rows(db, "SELECT DISTINCT name FROM scalars") == [("loss",)]
    assert rows(db, "SELECT count(*) FROM scalars WHERE value IS NULL") == [(0,)]


def _split(path: Path, parts: int) -> None:
    """Rotate one file into `parts` segments as the writer does: X.jsonl.<n> oldest … X.jsonl
    newest."""
    lines = path.read_bytes().splitlines(keepends=True)
    size = len(lines) // parts + 1
    chunks = [lines[i : i + size] for i in range(0, len(lines), size)]
    for index, chunk in enumerate(chunks):
        number = len(chunks) - 1 - index
        target = path if number == 0 else path.with_name(f"{path.name}.{number}")
        target.write_bytes(b"".join(chunk))


def test_rotated_segments_and_torn_lines(tmp_path, run) -> None:
    spec = RunSpec(ranks=4, steps=8, seed=5, crashed=(2, 6), start_us=1_796_000_000_000_000)
    whole, rotated = tmp_path / "whole", tmp_path / "rotated"
    generate_run(str(whole), spec)
    generate_run(str(rotated), spec)
    files = sorted((rotated / "structured_logs").glob("*.jsonl"))
    for path in files:
        _split(path, 3)
    # A line torn in the middle of an older segment (a crash that a restart appended after).
    older = files[0].with_name(files[0].name + ".2")
    text = older.read_bytes().splitlines(keepends=True)
    older.write_bytes(b"".join(text[:3] + [text[3][:40] + b"\n"] + text[3:]))
    query = "SELECT rank, name, step, start_us, end_us, incomplete FROM spans ORDER BY ALL"
    a, b = open_run(whole), open_run(rotated)
    a.load()
    b.load()
    assert len(b.paths) == 3 * len(files)
    assert rows(a, query) == rows(b, query)
    # The crashed rank's torn last line and the inserted one are counted, not read.
    torn = dict(rows(b, "SELECT rank, unreadable_lines FROM processes"))
    first_rank = int(files[0].name.split("global_rank_")[1].split(".")[0])
    assert first_rank != 2 and torn[2] == 1 and torn[first_rank] == 1 and sum(torn.values()) == 2
    assert rows(a, "SELECT unreadable_lines FROM processes WHERE rank = 2") == [(1,)]
    assert rows(a, "SELECT closed FROM processes WHERE rank = 2") == [(False,)]


def test_save_and_parquet(tmp_path, run) -> None:
    saved = tmp_path / "run.duckdb"
    database = open_run(run[0], database=str(saved))
    database.load()
    database.save_parquet(str(tmp_path / "pq"))
    expected = rows(database, "SELECT name, count(*) FROM spans GROUP BY name ORDER BY name")
    database.con.close()
    reopened = open_saved(str(saved))
    assert (
        rows(reopened, "SELECT name, count(*) FROM spans GROUP BY name ORDER BY name") == expected
    )
    import duckdb

    assert (
        duckdb.sql(
            f"SELECT name, count(*) FROM '{tmp_path / 'pq' / 'spans.parquet'}' GROUP BY name "
            "ORDER BY name"
        ).fetchall()
        == expected
    )
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == sorted(
        f"{v}.parquet" for v in [*VIEWS, "clock_offsets"]
    )
    with pytest.raises(FileExistsError):
        open_run(run[0], database=str(saved))


def cli(
    *args: str, stdin: str | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "otel_titan.cli", *args],
        capture_output=True,
        text=True,
        input=stdin,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=120,
    )


def test_cli_formats(run) -> None:
    query = "SELECT rank, step, name, value FROM scalars WHERE step <= 2 ORDER BY rank, step"
    as_csv = cli("sql", str(run[0]), query, "--format", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    table = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert len(table) == 2 * RANKS and table[0]["name"] == "loss"
    as_json = cli("sql", str(run[0]), "--format", "json", "-", stdin=query)
    assert as_json.returncode == 0, as_json.stderr
    assert [(r["rank"], r["step"]) for r in json.loads(as_json.stdout)] == [
        (int(r["rank"]), int(r["step"])) for r in table
    ]
    shown = cli("sql", str(run[0]), "SELECT rank FROM processes ORDER BY rank", "--max-rows", "4")
    assert "16 rows" in shown.stdout and "4 shown" in shown.stdout
    views = cli("sql", str(run[0]))
    assert views.returncode == 0 and all(f"{v}:" in views.stdout for v in VIEWS)
    assert "start_us BIGINT" in views.stdout


def test_cli_help() -> None:
    for command in ("sql", "report"):
        shown = cli(command, "--help")
        assert (
            shown.returncode == 0
            and f"pip install '{REPO}[analysis]'" in shown.stdout
            and ".venv" in shown.stdout
            and "examples:" in shown.stdout
        )


def test_cli_errors(tmp_path, run) -> None:
    bad = cli("sql", str(run[0]), "SELEC nothing")
    assert (
        bad.returncode == 2 and "SQL: Parser Error" in bad.stderr and "Traceback" not in bad.stderr
    )
    # DuckDB's caret stays under the word it points at (issue 18 item 21: the lines were joined into
    # one): the installed DuckDB's own message, line for line (DuckDB < 1.4 gives no caret; 1.4 one
    # ^, 2.0 one per letter).
    import duckdb

    with pytest.raises(duckdb.Error) as raised:
        duckdb.sql("SELEC nothing")
    own = [line for line in str(raised.value).splitlines() if line.strip()]
    lines = bad.stderr.splitlines()
    shown = [line for line in lines if line.strip()]
    start = next(i for i, line in enumerate(shown) if own[0] in line)
    assert shown[start + 1 : start + len(own)] == own[1:], bad.stderr
    if int(duckdb.__version__.split(".")[0]) >= 2:
        (query_line,) = [i for i, line in enumerate(lines) if line.startswith("LINE 1: ")]
        caret = lines[query_line + 1]
        assert lines[query_line][caret.index("^") : caret.rindex("^") + 1] == "SELEC"
    missing = cli("sql", str(tmp_path / "nowhere"), "SELECT 1")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    # Without duckdb installed: the error names the extra to install (duckdb's import is blocked in
    # that process).
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['duckdb'] = None\n")
    without = cli(
        "sql", str(run[0]), "SELECT 1", env={"PYTHONPATH": f"{blocker}{os.pathsep}{REPO}"}
    )
    # ExitCode.UNAVAILABLE
    assert without.returncode == 5 and f"pip install '{REPO}[analysis]'" in without.stderr, (
        without.stderr
    )


def _every_view(database) -> dict:
    """Every view and table a user queries, ordered: what a cached load must answer as a full
    one."""
    return {
        name: rows(database, f"SELECT * FROM {name} ORDER BY ALL")
        for name in [*VIEWS, "clock_offsets", "process_info", "files"]
    }


def _loaded(path: Path, **options):
    database = open_run(path, **options)
    database.load()
    return database


def test_a_second_load_attaches_the_cached_records_and_answers_the_same(tmp_path) -> None:
    run = tmp_path / "run"
    generate_run(
        str(run),
        RunSpec(
            ranks=6,
            steps=10,
            seed=8,
            crashed=(4, 7),
            ranks_per_host=3,
            start_us=1_796_000_000_000_000,
        ),
    )
    full = _every_view(_loaded(run, cache=False))
    assert not (run / "analysis").exists()
    first = _loaded(run)
    assert not first.from_cache and _every_view(first) == full
    assert len(list((run / "analysis" / "cache").glob("sql-*.duckdb"))) == 1
    second = _loaded(run)
    assert second.from_cache and _every_view(second) == full and second.clock == first.clock
    unaligned = _loaded(run, align=False)  # another selection, another entry: the times as written
    assert not unaligned.from_cache and _every_view(unaligned) == _every_view(
        _loaded(run, align=False, cache=False)
    )
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(run, copy)
    copied = _loaded(copy)
    assert copied.from_cache  # keyed by content: the copy's bytes are the same
    # named where they are now
    assert all(str(copy) in filename for (filename, *_) in rows(copied, "SELECT * FROM files"))
    assert _every_view(copied) == _every_view(_loaded(copy, cache=False))


def test_a_grown_or_torn_cache_is_loaded_again_never_wrong(tmp_path) -> None:
    run = tmp_path / "run"
    generate_run(str(run), RunSpec(ranks=4, steps=10, seed=2, start_us=1_796_000_000_000_000))
    path = sorted((run / "structured_logs").glob("*.jsonl"))[0]
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex(b"\n", 0, len(data) // 2) + 1])
    _loaded(run)
    path.write_bytes(data)  # it grew: the cached records are not these
    grown = _loaded(run)
    assert not grown.from_cache and _every_view(grown) == _every_view(_loaded(run, cache=False))
    (entry,) = (run / "analysis" / "cache").glob("sql-*.duckdb")
    entry.write_bytes(entry.read_bytes()[:5000])  # torn
    again = _loaded(run)
    assert not again.from_cache and _every_view(again) == _every_view(_loaded(run, cache=False))
    assert _loaded(run).from_cache


def test_an_edited_cache_database_is_never_opened_and_a_sealed_one_with_a_view_is_refused(
    tmp_path,
) -> None:
    """Issue 27 item 1: the signature covered the content key only, so an edited copy of a genuine
    entry passed, and its SQL ran first."""
    import duckdb

    from otel_titan.analysis.query.sql import _SqlCache
    from otel_titan.analysis.read.records import read_run

    run = tmp_path / "run"
    generate_run(str(run), RunSpec(ranks=4, steps=8, seed=5, start_us=1_796_000_000_000_000))
    full = _every_view(_loaded(run, cache=False))
    assert not _loaded(run).from_cache and _loaded(run).from_cache
    (entry,) = (run / "analysis" / "cache").glob("sql-*.duckdb")
    assert entry.stat().st_mode & 0o777 == 0o600
    con = duckdb.connect(str(entry))
    con.execute("DELETE FROM records WHERE process_id = 0")  # the planter's edit of a genuine entry
    con.close()
    edited = _loaded(run)
    assert not edited.from_cache and _every_view(edited) == full
    logs = read_run(run)
    cache = _SqlCache.of(logs.run_dir, logs.log_dir, logs.processes, True)
    source = _loaded(run, cache=False)

    def seal(view: bool) -> None:
        """An entry sealed with this user's key: one process's records left out, and perhaps a view
        beside the three tables."""
        with cache.folder.new_sealed(cache.name, cache.key) as temp:
            source.con.execute(f"ATTACH '{temp}' AS planted")
            source.con.execute(
                "CREATE TABLE planted.records AS SELECT * FROM records WHERE process_id <> 0"
            )
            source.con.execute("CREATE TABLE planted.clock_offsets AS SELECT * FROM clock_offsets")
            source.con.execute(
                "CREATE TABLE planted.cache_key AS SELECT $1 AS key, $2 AS clock",
                [cache.key, source.clock],
            )
            if view:
                source.con.execute(
                    f"CREATE VIEW planted.spy AS SELECT content FROM read_text('{entry}')"
                )
            source.con.execute("DETACH planted")

    seal(view=False)
    # sealed with one's own key: one's own entry (the seal is what makes it so)
    assert _loaded(run).from_cache
    seal(view=True)
    with_view = _loaded(run)
    # a view is nothing `keep` writes: refused
    assert not with_view.from_cache and _every_view(with_view) == full


def test_single_rank_queries_keep_a_bounded_number_of_databases(tmp_path) -> None:
    """Issue 27 item 5: one DuckDB file per --ranks selection, never removed."""
    from otel_titan.analysis.read.cache_folder import MAX_SQL_SELECTIONS

    run = tmp_path / "run"
    generate_run(
        str(run),
        RunSpec(ranks=MAX_SQL_SELECTIONS + 2, steps=3, seed=6, start_us=1_796_000_000_000_000),
    )
    for rank in range(MAX_SQL_SELECTIONS + 2):
        assert not _loaded(run, ranks=[rank]).from_cache
    assert len(list((run / "analysis" / "cache").glob("sql-*.duckdb"))) == MAX_SQL_SELECTIONS
    # the least recently used went
    assert (
        _loaded(run, ranks=[MAX_SQL_SELECTIONS + 1]).from_cache
        and not _loaded(run, ranks=[0]).from_cache
    )


def test_cli_no_cache_keeps_no_database(tmp_path) -> None:
    run = tmp_path / "run"
    generate_run(str(run), RunSpec(ranks=2, steps=4, seed=1, start_us=1_796_000_000_000_000))
    done = cli("sql", str(run), "SELECT count(*) FROM spans", "--no-cache", "--format", "csv")
    assert done.returncode == 0, done.stderr
    assert not (run / "analysis").exists()
    cached = cli("sql", str(run), "SELECT count(*) FROM spans", "--format", "csv")
    assert cached.stdout == done.stdout and list((run / "analysis" / "cache").glob("sql-*.duckdb"))


def test_step_rollups_view_is_the_step_table_from_rollups(tmp_path):
    """The view says what `RunAnalysis.steps()` says from the same rollups: step time, phases, the
    closing span; the last rollup of a step counts."""
    from otel_titan.analysis import RunAnalysis  # beside the test that needs it

    generate_run(
        str(tmp_path / "run"),
        RunSpec(
            ranks=8, steps=12, seed=2, straggler=(5, "bwd", 30.0), start_us=1_796_000_000_000_000
        ),
    )
    table = RunAnalysis(tmp_path / "run", log_skipped=False).steps()
    assert table.source == "rollups"
    database = open_run(tmp_path / "run")
    database.load()
    rows = database.con.execute(
        "SELECT rank, step, step_ms, phases, closing, closing_enter_us, closing_exit_us, "
        "complete, late_spans FROM step_rollups ORDER BY rank, step"
    ).fetchall()
    assert len(rows) == len(table.rows) == 8 * 12
    for (rank, step, step_ms, phases, closing, enter, leave, complete, late), row in zip(
        rows, table.rows
    ):
        assert (rank, step, step_ms, closing, enter, leave) == (
            row.rank,
            row.step,
            row.step_ms,
            row.closing,
            row.closing_enter_us,
            row.closing_exit_us,
        )
        assert {
            name: (count, round(total / 1000, 3))
            for name, (count, total) in json.loads(phases).items()
        } == row.phases
        assert complete is (row.step_ms is not None) and late == 0
    # The ready query of docs/sql.md: the slowest rank per step in a phase, from the rollups alone.
    slowest = database.con.execute(
        "SELECT step, arg_max(rank, json_extract(phases, '$.bwd[1]')::BIGINT) FROM step_rollups "
        "GROUP BY step ORDER BY step"
    ).fetchall()
    assert [rank for _, rank in slowest] == [5] * 12


def test_step_rollups_view_is_empty_without_rollups(tmp_path):
    generate_run(str(tmp_path / "run"), RunSpec(ranks=4, steps=6, seed=2, rollups=False))
    database = open_run(tmp_path / "run")
    database.load()
    assert database.con.execute("SELECT count(*) FROM step_rollups").fetchone() == (0,)
    assert database.con.execute("SELECT count(*) FROM steps").fetchone()[0] == 4 * 6


@pytest.mark.parametrize("fault", [{"crashed": (2, 6)}, {"hung": (1, 5), "black_boxes": True}])
def test_processes_last_record_is_not_a_rollup(tmp_path, fault) -> None:
    """A process's `last_record` is what it last wrote, as in a run without rollups:
    `signal_received`, never the step_rollup after it.

    The writer writes the step under way's rollup right after SIGTERM's record (and a step's rollup
    after the next step's first record): totals of records already counted, which would hide why the
    process stopped.
    """
    answers = []
    for rollups in (True, False):
        out = tmp_path / f"rollups-{rollups}"
        generate_run(
            str(out),
            RunSpec(
                ranks=4,
                steps=8,
                seed=1,
                ranks_per_host=2,
                start_us=1_796_000_000_000_000,
                rollups=rollups,
                **fault,
            ),
        )
        database = open_run(out)
        database.load()
        answers.append(
            rows(
                database,
                "SELECT rank, last_record, last_event, last_us, last_step, signal FROM processes "
                "ORDER BY rank",
            )
        )
        database.con.close()
    with_rollups, without = answers
    assert with_rollups == without
    assert "step_rollup" not in {row[1] for row in with_rollups}


def test_torchtitans_files_without_span_ids_pair_by_name_as_summarize_and_export_do(
    tmp_path,
) -> None:
    # Issue 28 item 4: the spans view showed 0 spans for torchtitan's files, without a word.
    # its _start rotated away: no span here
    records = [titan_record("orphan_end", 1.0, value=0.5, step=1)]
    # recursion: the same name nested
    records += [
        titan_record("layer_start", 2.0, step=1),
        titan_record("layer_start", 3.0, step=1),
    ]
    records += [
        titan_record("layer_error", 3.5, step=1),
        titan_record("layer_end", 4.0, value=1.0, step=1),
        titan_record("layer_end", 9.0, value=7.0, step=1),
    ]
    # two asyncio tasks, interleaved
    for task, start, _end in (
        ("Task-1", 10.0, 20.0),
        ("Task-2", 11.0, 15.0),
    ):
        records.append(titan_record("rollout_start", start, step=2, task_name=task))
    records += [
        titan_record("rollout_end", 15.0, value=4.0, step=2, task_name="Task-2"),
        titan_record("rollout_end", 20.0, value=10.0, step=2, task_name="Task-1"),
    ]
    records += titan_span("optimizer", 21.0, 23.0, step=2)
    # still open at the end of the file
    records.append(titan_record("checkpoint_start", 24.0, step=2))
    write_jsonl(titan_file(tmp_path), records)

    database = open_run(tmp_path)
    database.load()
    spans = rows(
        database,
        "SELECT name, start_us, end_us, incomplete, task FROM spans ORDER BY start_us, name",
    )
    t0 = records[1]["time_us"] - 2000
    assert [(n, s - t0, e - t0, i, t) for n, s, e, i, t in spans] == [
        ("layer", 2000, 9000, False, None),
        ("layer", 3000, 4000, False, None),
        ("rollout", 10000, 20000, False, "Task-1"),
        ("rollout", 11000, 15000, False, "Task-2"),
        ("optimizer", 21000, 23000, False, None),
        ("checkpoint", 24000, 24000, True, None),
    ]
    # The same spans as otel-titan export draws from the same file (its orphan bar apart).
    trace = json.loads(
        Path(
            generate_gantt_trace(tmp_path, tmp_path / "trace.json", log_skipped=False).output_path
        ).read_text()
    )
    bars = sorted(
        (e["name"], e["ts"] - t0, e["ts"] + e["dur"] - t0)
        for e in trace["traceEvents"]
        if e.get("cat") == "span" and e["name"] != "orphan"
    )
    assert bars == sorted((n, s - t0, e - t0) for n, s, e, *_ in spans)

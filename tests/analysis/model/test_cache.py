"""The analysis cache (`model.cache`, `collect.collect_run`): cached, resumed, serial and --jobs
reads give the summary a full read gives.

Real files throughout: runs generated with faults (benchmarks/generate_run.py),
grown by appending their own bytes, rotated as the writer rotates (the active
file renamed ``.1``), copied, rewritten, with NULs not written yet; the cache's
own files torn and forged. Every check compares with ``cache=False`` (every
byte read, nothing kept) on the same files at that moment.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis import summarize_run
from otel_titan.analysis.model.cache import ProcessCache, plan_reads
from otel_titan.analysis.read.cache_folder import CACHE_FOLDER
from otel_titan.analysis.read.records import read_run
from tests.conftest import REPO
from tests.helpers import processes


def _timeless(value: Any) -> Any:
    """The summary without its ages relative to now (``*_s_before_now``), which differ between two
    calls."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if not k.endswith("_before_now")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _summary(run: Path, **options: Any) -> dict[str, Any]:
    return _timeless(summarize_run(run, log_skipped=False, **options).to_dict())


def _full(run: Path) -> dict[str, Any]:
    return _summary(run, cache=False)


def _cached(run: Path) -> int:
    """How many of the run's processes have a cached read."""
    logs = read_run(run)
    cache = ProcessCache(logs.run_dir, logs.log_dir)
    return sum(1 for process in logs.processes if cache.lookup(process))


def _plans(run: Path) -> list[Any]:
    logs = read_run(run)
    return plan_reads(logs.processes, ProcessCache(logs.run_dir, logs.log_dir))


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    generate_run(
        str(out),
        RunSpec(
            ranks=8, steps=14, seed=4, crashed=(5, 11), straggler=(2, "bwd", 35.0), ranks_per_host=4
        ),
    )
    return out


def _files(run: Path) -> list[Path]:
    return sorted((run / "structured_logs").glob("*.jsonl"))


def _cut(data: bytes, fraction: float) -> int:
    """An offset just after a line, about `fraction` into `data`."""
    return data.rindex(b"\n", 0, int(len(data) * fraction)) + 1


def test_a_second_read_is_all_hits_and_gives_the_same_summary(run: Path) -> None:
    full = _full(run)
    # a straggler and a torn line: something to find
    assert full["stragglers"] and full["skipped_lines"] == 1
    assert not (run / CACHE_FOLDER).exists()  # cache=False keeps nothing
    assert _summary(run) == full
    assert (run / CACHE_FOLDER / "reads.pack").is_file() and _cached(run) == len(_files(run))
    plans = _plans(run)
    assert all(plan.hit for plan in plans) and all(plan.bytes_to_read == 0 for plan in plans)
    assert _summary(run) == full
    assert _summary(run, jobs=2) == full  # nothing to read: no worker needed, the same answer
    # verdicts recomputed
    assert _summary(run, align=False) == _timeless(
        summarize_run(run, log_skipped=False, cache=False, align=False).to_dict()
    )


def test_cached_reads_made_by_workers_are_the_serial_ones(run: Path) -> None:
    full = _full(run)
    assert _summary(run, jobs=2) == full  # read in two worker interpreters, cached here
    assert all(plan.hit for plan in _plans(run))
    assert _summary(run, jobs=1) == full


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("cut_inside_a_line", [False, True])
def test_a_grown_run_is_read_on_from_where_the_cache_stopped(
    run: Path, jobs: int, cut_inside_a_line: bool
) -> None:
    """Every file at 40 %, then 70 % (after a line, or mid-line: a partial line is never cached),
    then whole."""
    whole = {path: path.read_bytes() for path in _files(run)}
    for fraction in (0.4, 0.7):
        for path, data in whole.items():
            end = _cut(data, fraction) + (17 if cut_inside_a_line else 0)
            path.write_bytes(data[:end])
        expected = _full(run)
        before = {plan.keys[0].name: plan for plan in _plans(run)}
        assert _summary(run, jobs=jobs) == expected
        if fraction == 0.7:  # the 40 % read was cached: resumed where it stopped, not read again
            assert all(
                plan.resume is not None and not plan.hit and 0 < plan.start_offset
                for plan in before.values()
            )
            assert all(plan.bytes_to_read < plan.keys[0].length * 0.5 for plan in before.values())
    for path, data in whole.items():
        path.write_bytes(data)
    assert _summary(run, jobs=jobs) == _full(run)
    assert _summary(run) == _full(run)


def test_a_rotated_segment_keeps_its_cached_read_under_its_new_name(run: Path) -> None:
    """The writer renames the active file to ``.1`` and opens a new one: the cached bytes are the
    same, the names are not."""
    path = _files(run)[3]
    data = path.read_bytes()
    middle = _cut(data, 0.5)
    path.write_bytes(data[:middle])
    assert _summary(run) == _full(run)
    os.rename(path, str(path) + ".1")  # rotated ...
    path.write_bytes(data[middle:])  # ... and the rest written to a new active file
    plan = next(plan for plan in _plans(run) if len(plan.keys) == 2)
    assert plan.resume is not None and plan.start_segment == 0 and not plan.hit
    expected = _full(run)
    assert expected["processes"][3]["files"] == [path.name + ".1", path.name]
    assert _summary(run) == expected
    assert all(plan.hit for plan in _plans(run))


def test_skipped_lines_are_named_by_the_segments_names_now(tmp_path: Path) -> None:
    """A bad line read while the file was active is, once rotated, reported at its new name, as a
    full read reports it."""
    out = tmp_path / "run"
    generate_run(str(out), RunSpec(ranks=2, steps=10, seed=1))
    path = _files(out)[0]
    data = path.read_bytes()
    middle = _cut(data, 0.5)
    path.write_bytes(data[:middle] + b"not json\n")
    summarize_run(out, log_skipped=False)
    os.rename(path, str(path) + ".1")
    path.write_bytes(data[middle:])
    full = summarize_run(out, log_skipped=False, cache=False)
    cached = summarize_run(out, log_skipped=False)
    assert (
        full.skipped_examples == cached.skipped_examples
        and f"{path.name}.1:" in full.skipped_examples[0]
    )


def test_a_copied_run_hits_and_names_its_own_files(run: Path, tmp_path: Path) -> None:
    _summary(run)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)  # the cache travels with the run (RUN/analysis/cache)
    assert all(plan.hit for plan in _plans(copy))
    cached = summarize_run(copy, log_skipped=False)
    assert _timeless(cached.to_dict()) == _full(copy)
    # the torn line at the copy's path
    assert all(str(copy) in example for example in cached.skipped_examples)


def test_a_rewritten_file_is_read_again(run: Path, tmp_path: Path) -> None:
    _summary(run)
    other = tmp_path / "other"
    generate_run(str(other), RunSpec(ranks=8, steps=14, seed=9, hung=(6, 9), ranks_per_host=4))
    # the same names, other bytes (another job's)
    for mine, theirs in zip(_files(run), _files(other), strict=True):
        mine.write_bytes(theirs.read_bytes())
    assert not any(plan.resume for plan in _plans(run))
    assert _summary(run) == _full(run)


def test_a_line_changed_in_place_near_the_end_is_read_again(run: Path) -> None:
    """The same length, one byte changed in the last block (a step number edited by hand): a
    miss."""
    _summary(run)
    path = _files(run)[2]
    data = bytearray(path.read_bytes())
    at = data.rindex(b'"step":') + len(b'"step":')
    data[at] = ord("9") if data[at] != ord("9") else ord("8")
    path.write_bytes(bytes(data))
    plan = next(plan for plan in _plans(run) if plan.keys[0].name == path.name)
    assert plan.resume is None
    assert _summary(run) == _full(run)


def test_a_file_cut_shorter_than_its_cached_read_is_read_again(run: Path) -> None:
    _summary(run)
    path = _files(run)[1]
    data = path.read_bytes()
    path.write_bytes(data[: _cut(data, 0.3)])
    plan = next(plan for plan in _plans(run) if plan.keys[0].name == path.name)
    assert plan.resume is None
    assert _summary(run) == _full(run)


def test_nuls_not_written_yet_are_never_cached(run: Path) -> None:
    """A client that sees a file's new size before its bytes reads NULs: they are read (as a full
    read would) but not kept."""
    path = _files(run)[0]
    data = path.read_bytes()
    middle = _cut(data, 0.5)
    path.write_bytes(data[:middle] + bytes(3000))
    assert _summary(run) == _full(run)
    plan = next(plan for plan in _plans(run) if plan.keys[0].name == path.name)
    assert plan.hit and plan.keys[0].length == middle and plan.keys[0].size == middle + 3000
    path.write_bytes(data)  # the bytes arrive where the NULs were
    plan = next(plan for plan in _plans(run) if plan.keys[0].name == path.name)
    assert plan.resume is not None and plan.start_offset == middle
    assert _summary(run) == _full(run)


def test_torn_and_forged_entries_are_misses_never_errors(run: Path) -> None:
    expected = _full(run)
    _summary(run)
    pack = run / CACHE_FOLDER / "reads.pack"  # every process's read
    # the facts merged from all of them, for an unchanged run
    (merged,) = (run / CACHE_FOLDER).glob("run-*.facts")
    whole = pack.read_bytes()
    # torn, empty, not signed by us
    for broken in (
        whole[: len(whole) // 2],
        b"",
        b"OTCACHE1" + bytes(32) + pickle.dumps({"x": "not ours"}),
    ):
        pack.write_bytes(broken)
        assert _cached(run) == 0
        assert _summary(run) == expected  # answered from the merged facts
        merged.write_bytes(merged.read_bytes()[: -200 - len(broken) % 7])
        assert _summary(run) == expected  # both torn: every process read again ...
        assert _cached(run) == len(_files(run))  # ... and kept again
        assert _summary(run) == expected


def test_an_entry_of_another_version_is_a_miss(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _summary(run)
    logs = read_run(run)
    cache = ProcessCache(logs.run_dir, logs.log_dir)
    cache.version = "another reader"
    assert not any(plan.resume for plan in plan_reads(logs.processes, cache))


def test_a_read_only_run_is_cached_in_the_users_cache_folder(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where RUN/analysis/cache cannot be made (here: a file is in its way; a read-only folder for
    other users) the user's folder takes it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (run / "analysis").write_text("not a folder")
    expected = _full(run)
    assert _summary(run) == expected
    assert list((tmp_path / "xdg" / "otel-titan" / "runs").glob("*/reads.pack")) and _cached(
        run
    ) == len(_files(run))
    assert all(plan.hit for plan in _plans(run)) and _summary(run) == expected


def test_the_signing_key_is_the_users_alone(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's key (another XDG_CACHE_HOME here) does not trust this user's entries: nothing
    is unpickled."""
    _summary(run)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "someone-else"))
    assert not any(plan.resume for plan in _plans(run))
    key = tmp_path / "someone-else" / "otel-titan" / "key"
    assert key.stat().st_mode & 0o077 == 0


def test_concurrent_commands_agree_and_leave_whole_entries(run: Path) -> None:
    """Four commands at once on an uncached run: each answers as a full read, and every entry left
    is a whole one."""
    expected = _full(run)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    commands = [
        subprocess.Popen(
            [sys.executable, "-m", "otel_titan.cli", "summarize", str(run), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(4)
    ]
    outputs = []
    for command in commands:
        out, err = command.communicate(timeout=180)
        assert command.returncode == 0, err
        outputs.append(_timeless(json.loads(out)))
    reference = _timeless(
        json.loads(
            processes.run(
                [
                    sys.executable,
                    "-m",
                    "otel_titan.cli",
                    "summarize",
                    str(run),
                    "--json",
                    "--no-cache",
                ],
                capture_output=True,
                env=env,
                timeout=180,
            ).stdout
        )
    )
    assert all(output == reference for output in outputs)
    assert not list((run / CACHE_FOLDER).glob(".*.tmp"))  # no temporary file left
    assert all(plan.hit for plan in _plans(run)) and _summary(run) == expected


def test_no_cache_on_the_command_line_reads_all_and_keeps_nothing(run: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = processes.run(
        [sys.executable, "-m", "otel_titan.cli", "summarize", str(run), "--no-cache"],
        capture_output=True,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert not (run / CACHE_FOLDER).exists()
    done = processes.run(
        [sys.executable, "-m", "otel_titan.cli", "summarize", str(run)],
        capture_output=True,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0 and _cached(run) == len(_files(run))


def test_a_cached_read_logs_the_warnings_a_read_logs(
    run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The torn line's warning comes on every command, from the files or from the cache."""
    summarize_run(run, cache=False)
    fresh = [r.getMessage() for r in caplog.records if "truncated last line" in r.getMessage()]
    caplog.clear()
    summarize_run(run)
    summarize_run(run)
    again = [r.getMessage() for r in caplog.records if "truncated last line" in r.getMessage()]
    assert len(fresh) == 1 and again == fresh * 2


def test_report_reads_once_through_the_cache_and_no_cache_keeps_none(
    run: Path, tmp_path: Path
) -> None:
    pytest.importorskip("plotly")
    pytest.importorskip("duckdb")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = processes.run(
        [
            sys.executable,
            "-m",
            "otel_titan.cli",
            "report",
            str(run),
            "-o",
            str(tmp_path / "a.html"),
            "--no-cache",
        ],
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert not (run / CACHE_FOLDER).exists()
    for name in ("b.html", "c.html"):
        done = processes.run(
            [
                sys.executable,
                "-m",
                "otel_titan.cli",
                "report",
                str(run),
                "-o",
                str(tmp_path / name),
            ],
            capture_output=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    # Its one read is summarize's (`read_model`): each process's read kept, and no DuckDB load of
    # its own to keep.
    assert _cached(run) == len(_files(run)) and not list((run / CACHE_FOLDER).glob("sql-*.duckdb"))
    assert (tmp_path / "c.html").stat().st_size > 100_000


def _plain(value: Any, depth: int = 0) -> Any:
    """An accumulator as plain data, every attribute of every object in it (arrays as lists, a
    process by its label): comparable with ==."""
    from array import array  # only here

    from otel_titan.analysis.read.records import ProcessLog

    assert depth < 40
    if isinstance(value, ProcessLog):
        return ("process", value.label)
    if isinstance(value, dict):
        return {repr(key): _plain(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple, array)):
        return [_plain(item, depth + 1) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted(repr(_plain(item, depth + 1)) for item in value)
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    names = [*getattr(value, "__dict__", {})] + [
        name
        for cls in type(value).__mro__
        for name in getattr(cls, "__slots__", ())
        if hasattr(value, name)
    ]
    return (
        type(value).__name__,
        {
            name: _plain(getattr(value, name), depth + 1)
            for name in sorted(set(names))
            if not callable(getattr(value, name))
        },
    )


def _model(run: Path, **options: Any) -> tuple[Any, Any, Any]:
    """What `read_model` hands on: every accumulator of the collector (`_Collector.state`), the
    report's grid, the step table from the spans."""
    from otel_titan.analysis.model.collect import read_model
    from otel_titan.analysis.model.step_table import rows_from_collected
    from otel_titan.analysis.read.selection import RunSelection

    kept: dict[str, Any] = {}

    def keep(collector: Any) -> None:
        kept["state"] = _plain(collector.state())
        kept["rows"] = rows_from_collected(
            (
                collector.step_ms,
                collector.phase_step_ms,
                collector.phase_step_count,
                collector.closing,
            )
        )

    summary, grid = read_model(
        RunSelection.of(run, log_skipped=False, **options), on_collected=keep
    )
    return kept["state"], _plain(grid), kept["rows"]


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_accumulator_comes_back_from_the_cache_as_a_full_read_makes_it(
    run: Path, jobs: int
) -> None:
    """Written, then a hit of the merged facts, then a grown run resumed per process: each
    `_Collector.state()` key, the grid and the step table equal a full read's."""
    full = _model(run, cache=False)
    state, grid, rows = full
    assert {
        repr(key)
        for key in (
            "step_starts",
            "scalar_steps",
            "phase_step_count",
            "figures",
            "config_drift",
            "hang_facts",
        )
    } <= set(state)
    assert state["'step_starts'"] and state["'phase_step_count'"] and rows  # something to lose
    assert _model(run, jobs=jobs) == full  # written
    assert _model(run, jobs=jobs) == full  # the merged facts
    path = _files(run)[3]
    data = path.read_bytes()
    path.write_bytes(data[: _cut(data, 0.5)])
    _model(run, jobs=jobs)
    # grown: that process resumed where its cached read stopped, the others hit
    path.write_bytes(data)
    assert _model(run, jobs=jobs) == full


def test_a_cached_read_warns_as_the_read_of_the_files_did(tmp_path: Path) -> None:
    """Skipped and repaired lines (a lone surrogate escaped, a line that is not JSON) are warned
    about again, in the same order, when the answer comes from the cache."""
    out = tmp_path / "run"
    generate_run(str(out), RunSpec(ranks=2, steps=6, seed=1))
    path = _files(out)[0]
    lines = path.read_bytes().splitlines(keepends=True)
    lines[5] = lines[5].replace(b'"log_file":"train.py"', b'"log_file":"tr\\ud800ain.py"')
    assert b"\\ud800" in lines[5]
    path.write_bytes(b"".join(lines[:8] + [b"not json\n"] + lines[8:]))

    def warnings() -> list[str]:
        result = subprocess.run(
            [sys.executable, "-m", "otel_titan.cli", "summarize", str(out)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        return [line for line in result.stderr.splitlines() if "warning" in line]

    first, second = warnings(), warnings()
    assert any("invalid Unicode" in line for line in first) and any(
        "line skipped" in line for line in first
    ), first
    assert second == first


@pytest.mark.parametrize("command", ["summarize", "report", "export", "sql"])
def test_a_folder_that_is_not_a_run_is_an_error_and_nothing_is_written_into_it(
    tmp_path: Path, command: str
) -> None:
    """Issue 27 item 4: a dataset of .jsonl files got analysis/cache/reads.pack (summarize, report),
    an empty analysis/ (export), and sql answered 0 rows, exit 0."""
    if command in ("report", "sql"):
        pytest.importorskip("duckdb" if command == "sql" else "plotly")
    data = tmp_path / "dataset"
    data.mkdir()
    for part in range(2):
        (data / f"part-{part}.jsonl").write_text(
            "".join(json.dumps({"text": f"sample {i}", "label": i % 2}) + "\n" for i in range(5))
        )
    before = sorted(path.name for path in data.iterdir())
    argv = [sys.executable, "-m", "otel_titan.cli", command, str(data)] + (
        ["SELECT count(*) FROM records"] if command == "sql" else []
    )
    done = processes.run(
        argv,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=180,
    )
    assert (
        done.returncode == 1 and "no readable records (10 unreadable lines skipped)" in done.stderr
    ), (done.returncode, done.stderr)
    assert sorted(path.name for path in data.iterdir()) == before


def _shape(value: Any) -> list[Any]:
    """`value`'s object graph in pre-order: each container's type and scalars, a shared object as a
    reference to where it was first met."""
    import array
    import types

    seen: dict[int, int] = {}
    out: list[Any] = []

    def walk(item: Any) -> None:
        if type(item) in (str, int, float, bool, type(None), bytes):
            out.append(item if item == item else "nan")
            return
        if id(item) in seen:
            out.append(("ref", seen[id(item)]))
            return
        seen[id(item)] = len(seen)
        out.append(type(item).__qualname__)
        if isinstance(item, dict):
            for key, inner in item.items():
                walk(key)
                walk(inner)
        elif isinstance(item, (list, tuple)):
            for inner in item:
                walk(inner)
        elif isinstance(item, (set, frozenset)):
            out.append(sorted(map(repr, item)))
        elif isinstance(item, array.array):
            out.append((item.typecode, item.tobytes()))
        elif isinstance(item, types.MethodType):
            walk(item.__self__)
            out.append(item.__func__.__name__)
        else:
            for cls in type(item).__mro__:
                for name in cls.__dict__.get("__slots__", ()):
                    if hasattr(item, name):
                        out.append(name)
                        walk(getattr(item, name))
            for name, inner in getattr(item, "__dict__", {}).items():
                out.append(name)
                walk(inner)

    walk(value)
    return out


def test_a_cached_read_comes_back_object_for_object(tmp_path: Path) -> None:
    """The cache's plain data (`read.plain_data`) rebuilds each process's read and the merged facts
    with every value, type and shared object as they were."""
    from otel_titan.analysis.model import collect

    out = tmp_path / "run"
    generate_run(
        str(out),
        RunSpec(
            ranks=6,
            steps=12,
            seed=9,
            crashed=(4, 8),
            hung=(2, 9),
            straggler=(1, "fwd", 30.0),
            ranks_per_host=3,
        ),
    )
    logs = read_run(out)
    states = [
        collect.read_process(process, plan, False, None)
        for process, plan in zip(logs.processes, plan_reads(logs.processes, None))
    ]
    for state in states:
        back = collect.load_cached(collect.dump_cached(state))
        assert type(back) is collect.ProcessRead and _shape(back) == _shape(state)
        assert (
            back.collector.summary is back.summary
            and back.collector.span_begun.__self__ is back.collector.hang
        )
    merged, summaries = collect.collect_run(
        logs.processes, logs.run_dir, logs.log_dir, logs.skipped, cache=False
    )
    facts = merged.state()
    facts["closing"] = [spans for _, spans in facts["closing"]]
    assert _shape(collect.load_cached(collect.dump_cached((facts, summaries)))) == _shape(
        (facts, summaries)
    )


def test_the_stragglers_are_kept_per_question_and_drawn_again_when_a_file_changes(
    run: Path,
) -> None:
    """The verdicts are kept beside the facts (one entry per --steps/--no-align), answered from on
    the next command, and missed once a file changes."""
    from otel_titan.analysis.model.cache import segment_keys
    from otel_titan.analysis.model.collect import (
        CLOCKS_QUESTION,
        dump_cached,
        load_cached,
        stragglers_question,
    )
    from otel_titan.analysis.read.filters import StepRange

    full = _full(run)
    narrowed = _timeless(
        summarize_run(run, log_skipped=False, cache=False, steps=StepRange(3, 9)).to_dict()
    )
    unaligned = _timeless(summarize_run(run, log_skipped=False, cache=False, align=False).to_dict())
    assert full["stragglers"] and narrowed["stragglers"] != full["stragglers"]
    assert _summary(run) == full and _summary(run) == full  # drawn and kept, then read back
    # the stragglers, and the clock alignment (the same for every question)
    assert len(list((run / CACHE_FOLDER).glob("run-*.verdicts"))) == 2
    assert (
        _summary(run, steps=StepRange(3, 9)) == narrowed
        and _summary(run, steps=StepRange(3, 9)) == narrowed
    )
    assert _summary(run, align=False) == unaligned and _summary(run, align=False) == unaligned
    assert len(list((run / CACHE_FOLDER).glob("run-*.verdicts"))) == 4  # one entry per question
    # What the next command answers from is the kept entry: one kept (signed, by the cache's own
    # API) with another median shows.
    logs = read_run(run)
    store, keys, question = (
        ProcessCache(logs.run_dir, logs.log_dir),
        [segment_keys(p) for p in logs.processes],
        stragglers_question(None, True),
    )
    kept = load_cached(store.lookup_verdicts(logs.processes, keys, question))
    kept[0].median_step_ms = 12345.0
    assert store.save_verdicts(logs.processes, keys, question, dump_cached(kept))
    assert _summary(run)["stragglers"][0]["median_step_ms"] == 12345.0
    alignment = load_cached(store.lookup_verdicts(logs.processes, keys, CLOCKS_QUESTION))
    # 4 ranks per host: two hosts' clocks, aligned
    assert alignment.applied and alignment.offsets_us
    alignment.reason, alignment.applied = "kept", False
    assert store.save_verdicts(logs.processes, keys, CLOCKS_QUESTION, dump_cached(alignment))
    assert _summary(run)["clock"]["reason"] == "kept"
    # An entry whose bytes changed (planted, or torn) fails its signature: a miss, drawn again from
    # the facts.
    for entry in (run / CACHE_FOLDER).glob("run-*.verdicts"):
        data = bytearray(entry.read_bytes())
        data[-1] ^= 1
        entry.write_bytes(bytes(data))
    assert _summary(run) == full
    # A file that changes: the facts are read again and the verdicts drawn again from them.
    first = _files(run)[0]
    data = first.read_bytes()
    first.write_bytes(data[: _cut(data, 0.6)])
    assert _summary(run) == _full(run) and _full(run) != full
    assert _summary(run)["stragglers"][0]["median_step_ms"] != 12345.0

"""The `otel-titan` command line: outputs, messages (never a traceback for a user's error) and the
exit codes, one mapping for every command."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from otel_titan import structured_logger as sl
from otel_titan.cli import EXIT_CODE_MEANINGS, ExitCode, main
from tests.conftest import REPO
from tests.helpers import processes
from tests.helpers.analysis import load_trace, titan_file, write_jsonl


@pytest.fixture
def run(run_dir):
    """A real 2-rank run (two processes of the library, one after the other), 4 steps each."""
    for rank in (0, 1):
        sl.init_structured_logger("training", run_dir, rank=rank, world_size=2, run_id="cli")
        for step in range(1, 5):
            sl.set_step(step, relative_step=step)
            with sl.log_trace_span("data_fetch"):
                pass
            with sl.log_trace_span("optimizer"):
                pass
            sl.log_trace_scalar({"loss": 1.0})
        sl.shutdown_structured_logger()
    return run_dir


def test_export_writes_the_default_trace_and_says_where(run, capsys):
    assert main(["export", str(run)]) == 0
    out, err = capsys.readouterr()
    trace_path = run / "analysis" / "trace.json"
    assert out.splitlines()[0] == f"trace: {trace_path}"
    assert (
        "2 processes, 16 spans (0 incomplete, 0 failed)" in out and "https://ui.perfetto.dev" in out
    )
    assert err == ""  # not a terminal: no progress line
    assert len(load_trace(trace_path)["traceEvents"]) > 16


def test_export_options_output_and_filters(run, tmp_path, capsys):
    output = tmp_path / "deep" / "t.json"
    assert (
        main(
            [
                "export",
                str(run / "structured_logs"),
                "-o",
                str(output),
                "--steps",
                "2:3",
                "--ranks",
                "1",
                "--sources",
                "training",
            ]
        )
        == 0
    )
    trace = load_trace(output)
    bars = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "span"]
    assert (
        sorted({(e["pid"], e["args"]["step"]) for e in bars}) == [(1, 2), (1, 3)] and len(bars) == 4
    )
    assert f"trace: {output}" in capsys.readouterr().out


def test_export_on_two_workers_gives_the_same_trace(run, tmp_path, capsys):
    assert main(["export", str(run), "-o", str(tmp_path / "one.json"), "--jobs", "1"]) == 0
    assert main(["export", str(run), "-o", str(tmp_path / "two.json"), "--jobs", "2"]) == 0
    one, two = (load_trace(tmp_path / name)["traceEvents"] for name in ("one.json", "two.json"))
    assert sorted(map(json.dumps, one)) == sorted(map(json.dumps, two))


def test_export_progress_line_only_on_a_terminal(run, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["export", str(run)]) == 0
    err = capsys.readouterr().err
    # drawn, then cleared
    assert "\rexport: " in err and "MB (100%)" in err and err.endswith("\r\x1b[K")
    assert main(["export", str(run), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_summarize_prints_tables(run, capsys):
    assert main(["summarize", str(run)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for heading in (
        "Processes",
        "Phases (completed spans, by total time; durations in ms)",
        "Stragglers: training (2 ranks;",
    ):
        assert any(line.startswith(heading) for line in lines), heading
    assert "    2 processes: closed at step 4, after metric_value  (training ranks 0-1)" in out


def test_summarize_json_is_one_document_for_scripts(run, capsys):
    assert main(["summarize", str(run), "--json", "--ranks", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["label"] for p in data["processes"]] == ["training rank 0"]
    assert data["processes"][0]["closed_cleanly"] is True and data["processes"][0]["last_step"] == 4


@pytest.mark.parametrize("command", ["export", "summarize"])
def test_a_path_that_is_not_a_run_exits_2_with_the_reason(tmp_path, capsys, command):
    assert main([command, str(tmp_path / "nope")]) == 2
    out, err = capsys.readouterr()
    assert (
        err == f"otel-titan: error: {tmp_path / 'nope'}: no such file or directory\n" and out == ""
    )
    (tmp_path / "empty").mkdir()
    assert main([command, str(tmp_path / "empty")]) == 2
    assert "not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["export", "summarize"])
def test_a_run_without_records_exits_1_and_names_the_skipped_lines(run_dir, capsys, command):
    path = write_jsonl(titan_file(run_dir), ["{broken"])
    assert main([command, str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert f"otel-titan: warning: {path}:1: malformed JSON or invalid UTF-8; line skipped" in err
    assert (
        "otel-titan: error: " in err
        and "no readable records (1 unreadable line skipped)" in err
        and "Traceback" not in err
    )
    assert not (run_dir / "analysis" / "trace.json").exists()


def test_filters_that_match_nothing_exit_1(run, capsys):
    assert main(["export", str(run), "--steps", "50:60"]) == 1
    assert "no records match the filters" in capsys.readouterr().err
    assert main(["summarize", str(run), "--ranks", "5-6"]) == 1
    assert capsys.readouterr().err.endswith("no process matches the filters (ranks [5, 6])\n")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export", "x", "--steps", "9:1"], "--steps: bad step range '9:1': 9 > 1"),
        (["export", "x", "--ranks", "a-b"], "--ranks: bad rank 'a-b'"),
        (["summarize", "x", "--sources", ","], "--sources: no source names given"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["export", "x", "--jobs", "0"], "--jobs: must be at least 1, got 0"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unwritable_output_exits_4_naming_it(run, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["export", str(run), "-o", str(blocker / "t.json")]) == ExitCode.CANNOT_WRITE == 4
    err = capsys.readouterr().err
    assert (
        err.startswith("otel-titan: error: cannot write ")
        and str(blocker) in err
        and "Traceback" not in err
    )


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: otel-titan" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command, example",
    [
        ("export", "otel-titan export outputs --steps 100:200"),
        ("summarize", "otel-titan summarize outputs --json"),
    ],
)
def test_help_has_examples(command, example, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert example in capsys.readouterr().out


def test_an_analysis_command_collects_less_often_and_gives_the_threshold_back(run, capsys):
    import gc

    before = gc.get_threshold()
    assert main(["summarize", str(run), "--no-progress"]) == 0
    assert main(["summarize", str(run / "missing")]) == 2
    assert gc.get_threshold() == before
    assert "training" in capsys.readouterr().out


def test_the_installed_entry_point_runs(run):
    executable = shutil.which("otel-titan", path=os.path.dirname(sys.executable))
    assert executable, "otel-titan is not installed next to this interpreter (pip install -e .)"
    result = subprocess.run(
        [executable, "summarize", str(run), "--json"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["processes"]) == 2
    result = subprocess.run(
        [executable, "export", str(run / "missing")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and result.stderr.startswith("otel-titan: error: ")


def test_two_runs_in_one_folder_the_latest_by_default_and_run_picks_another(run, capsys):
    for rank in (0, 1):  # a second run into the same folder, after the fixture's run "cli"
        sl.init_structured_logger("training", run, rank=rank, world_size=2, run_id="again")
        sl.set_step(1)
        with sl.log_trace_span("data_fetch"):
            pass
        sl.shutdown_structured_logger()
    assert main(["summarize", str(run)]) == 0
    out = capsys.readouterr().out
    assert (
        "  run again: the latest of 2 runs in this folder (others: cli; pick one with --run RUN_ID)"
        in out.splitlines()
    )
    assert main(["summarize", str(run), "--json", "--run", "cli"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["run_id"], data["run_selection"], [r["run_id"] for r in data["runs"]]) == (
        "cli",
        "requested",
        ["cli", "again"],
    )
    assert [p["last_step"] for p in data["processes"]] == [4, 4]
    assert main(["export", str(run)]) == 0
    out = capsys.readouterr().out
    assert "  1 processes" not in out and "2 processes, 2 spans" in out
    assert (
        "  run again: the latest of 2 runs in this folder (others: cli; pick one with --run RUN_ID)"
        in out.splitlines()
    )
    assert main(["export", str(run), "--run", "cli"]) == 0
    assert "2 processes, 16 spans" in capsys.readouterr().out
    for command in ("export", "summarize"):
        assert main([command, str(run), "--run", "nope"]) == 1
        assert capsys.readouterr().err.endswith(
            "no run 'nope' here; runs found: cli (2 processes), again (2 processes)\n"
        )


def test_export_to_an_existing_directory_fails_naming_it_and_leaves_nothing(run, tmp_path, capsys):
    target = tmp_path / "traces"
    target.mkdir()
    assert main(["export", str(run), "-o", str(target)]) == ExitCode.CANNOT_WRITE
    err = capsys.readouterr().err
    assert (
        err
        == f"otel-titan: error: cannot write {target}: is a directory (give a file name, e.g. -o DIR/trace.json)\n"
    )
    assert os.listdir(target) == [] and sorted(os.listdir(tmp_path)) == sorted(["traces", run.name])


def test_export_of_one_file_writes_its_own_trace_and_says_when_it_replaces_one(run, capsys):
    assert main(["export", str(run)]) == 0
    whole = run / "analysis" / "trace.json"
    assert capsys.readouterr().out.splitlines()[0] == f"trace: {whole}"
    before = whole.read_bytes()
    one_file = sorted((run / "structured_logs").glob("training.global_rank_1.*.jsonl"))[0]
    own = run / "analysis" / (one_file.name[: -len(".jsonl")] + ".trace.json")
    assert main(["export", str(one_file)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"trace: {own}"
    assert whole.read_bytes() == before  # the whole run's trace is untouched
    assert main(["export", str(run)]) == 0
    assert (
        capsys.readouterr().out.splitlines()[0]
        == f"trace: {whole} (replaced the file that was there)"
    )


def test_summarize_progress_line_only_on_a_terminal(run, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["summarize", str(run)]) == 0
    err = capsys.readouterr().err
    # drawn, then cleared
    assert "\rsummarize: " in err and "MB (100%)" in err and err.endswith("\r\x1b[K")
    for flags in (["--no-progress"], ["--tail"]):
        assert main(["summarize", str(run), *flags]) == 0
        assert capsys.readouterr().err == ""


def _real_run(run_dir, ranks=1, steps=50):
    for rank in range(ranks):
        sl.init_structured_logger("training", run_dir, rank=rank, world_size=ranks, run_id="words")
        for step in range(1, steps + 1):
            sl.set_step(step, relative_step=step)
            with sl.log_trace_span("data_fetch"):
                pass
            with sl.log_trace_span("optimizer"):
                pass
            sl.log_trace_scalar({"loss": 1.0, "lr": 0.001})
        sl.shutdown_structured_logger()
    return run_dir


def test_tail_says_it_saw_only_the_tails(run_dir, capsys):
    """Issue 18 item 21: `--tail` headed its output with the tails' range and count as if they were
    the run's."""
    _real_run(run_dir)
    assert main(["summarize", str(run_dir)]) == 0
    full = capsys.readouterr().out.splitlines()[1]
    assert main(["summarize", str(run_dir), "--tail"]) == 0
    tail = capsys.readouterr().out.splitlines()[1]
    whole_count = int(full.split(" records")[0].rsplit(" ", 1)[1].replace(",", ""))
    tail_count = int(
        tail.split(" records read from the files' ends")[0].rsplit(" ", 1)[1].replace(",", "")
    )
    assert tail_count < whole_count  # the tails are not the run ...
    assert "tails only" in tail and "need a full read" in tail  # ... and the header says so


def test_json_puts_the_headline_first_and_says_no_more_than_it_knows(run_dir, capsys):
    _real_run(run_dir, ranks=1, steps=8)
    assert main(["summarize", str(run_dir), "--json"]) == 0
    text = capsys.readouterr().out
    data = json.loads(text)
    # `| head` shows the diagnosis
    assert list(data)[0] == "headline" and text.splitlines()[1].startswith('  "headline"')
    # the one run starts at its first record
    assert data["runs"][0]["start_utc"] == data["first_utc"] is not None
    # nothing applied: no residual
    assert data["clock"]["applied"] is False and data["clock"]["residual_p95_us"] is None


def test_a_step_filter_that_matches_nothing_names_the_runs_steps(run_dir, capsys):
    _real_run(run_dir, steps=50)
    assert main(["export", str(run_dir), "--steps", "100:200"]) == 1
    err = capsys.readouterr().err
    assert "--steps 100:200, but the run's steps are 1–50" in err, err


def test_one_of_a_thing_is_said_in_the_singular(run_dir, capsys, tmp_path):
    _real_run(run_dir, steps=1)
    outputs = []
    for command in (
        ["export", str(run_dir)],
        ["summarize", str(run_dir)],
        ["summarize", str(run_dir), "--tail"],
        ["report", str(run_dir), "-o", str(tmp_path / "r.html")],
    ):
        assert main(command) == 0, command
        captured = capsys.readouterr()
        outputs.append(captured.out + captured.err)
    said = "\n".join(outputs)
    assert "1 process," in said and "(1 process," in said and "1 rank," in said
    for wrong in (
        "1 processes",
        "1 ranks",
        "1 steps",
        "1 records",
        "1 figures",
        "1 spans",
        "1 hosts",
    ):
        assert f" {wrong}" not in said and f"({wrong}" not in said, wrong


# -- exit codes: one mapping, every command through it, in real processes --------------------------
def _cli(
    *args: str, env: dict[str, str] | None = None, **popen
) -> subprocess.CompletedProcess[str]:
    """`python -m otel_titan.cli ARGS` in a fresh process: the exit status and stderr a script
    sees."""
    return processes.run(
        [sys.executable, "-m", "otel_titan.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        cwd=REPO,
        **popen,
    )


def _blocking(tmp_path, *modules: str) -> dict[str, str]:
    """An environment whose interpreter cannot import `modules` (as on a machine where they are not
    installed)."""
    folder = tmp_path / "block"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in modules)
    )
    return {"PYTHONPATH": f"{folder}{os.pathsep}{REPO}"}


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    return line


def test_help_lists_every_exit_code_and_docs_say_the_same():
    result = _cli("--help")
    assert result.returncode == 0
    epilog = result.stdout[result.stdout.index("exit codes:") :]
    listed = [
        int(line.split()[0]) for line in epilog.splitlines()[1:] if line[:6].strip().isdigit()
    ]
    assert listed == [int(code) for code in ExitCode] == [int(code) for code in EXIT_CODE_MEANINGS]
    analysis = (REPO / "docs" / "analysis.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\d+)` \| `([A-Z_]+)` \|", analysis, flags=re.M)
    assert rows == [(str(int(code)), code.name) for code in ExitCode], (
        "docs/analysis.md's exit-code table differs from ExitCode"
    )


@pytest.mark.parametrize("command", ["export", "summarize", "sql", "report", "watch"])
def test_every_command_says_bad_input_the_same_way(tmp_path, command):
    result = _cli(
        command,
        str(tmp_path / "nope"),
        *(["SELECT 1"] if command == "sql" else []),
        *(["--once"] if command == "watch" else []),
    )
    assert result.returncode == ExitCode.USAGE == 2, result.stderr
    assert (
        _one_error_line(result)
        == f"otel-titan: error: {tmp_path / 'nope'}: no such file or directory"
    )


def test_no_records_exits_1(run_dir):
    write_jsonl(titan_file(run_dir), ["{broken"])
    result = _cli("summarize", str(run_dir))
    assert result.returncode == ExitCode.NO_RECORDS == 1, result.stderr
    assert (
        result.stderr.splitlines()[-1].startswith("otel-titan: error: ")
        and "no readable records" in result.stderr.splitlines()[-1]
    )


def test_a_command_line_argparse_refuses_exits_2(run):
    result = _cli("summarize", str(run), "--ranks", "a-b")
    assert (
        result.returncode == ExitCode.USAGE
        and result.stderr.splitlines()[-1]
        == "otel-titan summarize: error: --ranks: bad rank 'a-b' (expected N or A-B, e.g. 0,3,8-11)"
    )


def test_an_existing_save_file_is_bad_input_not_a_disk_to_fix(run, tmp_path):
    taken = tmp_path / "taken.duckdb"
    taken.write_text("x")
    result = _cli("sql", str(run), "--save", str(taken), "SELECT 1")
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert _one_error_line(result).startswith(f"otel-titan: error: --save: {taken} exists already")


def test_output_that_cannot_be_written_exits_4(run, tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    blocker = folder / "file"
    blocker.write_text("x")
    result = _cli("report", str(run), "-o", str(blocker / "report.html"))
    assert result.returncode == ExitCode.CANNOT_WRITE == 4, result.stderr
    assert _one_error_line(result).startswith(f"otel-titan: error: cannot write {blocker}")


@pytest.mark.parametrize(
    "argv, missing, says",
    [
        (
            ["summarize", "{run}", "--scheduler", "tcp://127.0.0.1:9"],
            ("distributed",),
            f"pip install '{REPO}[cluster]'",
        ),
        (["sql", "{run}", "SELECT 1"], ("duckdb",), f"pip install '{REPO}[analysis]'"),
    ],
)
def test_something_needed_that_is_not_there_exits_5(run, tmp_path, argv, missing, says):
    result = _cli(*[a.format(run=run) for a in argv], env=_blocking(tmp_path, *missing))
    assert result.returncode == ExitCode.UNAVAILABLE == 5, result.stderr
    line = _one_error_line(result)
    assert line.startswith("otel-titan: error: ") and says in line


def test_a_bug_exits_70_with_the_traceback_then_one_error_line(run):
    # A bug, planted where summarize computes (`RunAnalysis`'s read of the model; the command, its
    # mapping and the process are the real ones).
    code = (
        "import sys; import otel_titan.cli as cli; import otel_titan.analysis.run_analysis as front\n"
        "def broken(*args, **kwargs):\n    return {}['no such key']\n"
        "front.read_model = broken\nsys.exit(cli.main(sys.argv[1:]))\n"
    )
    result = processes.run(
        [sys.executable, "-c", code, "summarize", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == ExitCode.INTERNAL == 70, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "in broken" in result.stderr
    assert (
        lines[-1]
        == "otel-titan: internal error (a bug in otel-titan; please report it with the traceback above): KeyError: 'no such key'"
    )


def test_ctrl_c_exits_130_with_one_line(run):
    # `sql RUN -` waits for its query on stdin: Ctrl-C (SIGINT) there, once the process sleeps in
    # that read.
    process = subprocess.Popen(
        [sys.executable, "-m", "otel_titan.cli", "sql", str(run), "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    try:
        _wait_until_asleep(process.pid)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        processes.kill_tree(process)
    assert process.returncode == ExitCode.INTERRUPTED == 130, err
    assert err == "otel-titan: interrupted\n"


def _wait_until_asleep(pid: int, timeout: float = 60.0) -> None:
    """Until the process has slept in the kernel for 0.5 s on end: past its imports, in its blocking
    read."""
    deadline = time.monotonic() + timeout
    asleep_since = None
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
        now = time.monotonic()
        if state != b"S":
            asleep_since = None
        elif asleep_since is None:
            asleep_since = now
        elif now - asleep_since >= 0.5:
            return
        time.sleep(0.02)
    raise AssertionError("the command never waited for its query")

"""One warning path for every command and every worker (`worker_io`, `cli`), and no control character on the terminal.

A file name holding ``\\x1b[31m`` (the terminal's "red from here on") and a
torn last line: each command warns about the torn line, naming the file.
`export --jobs 1` always printed the name escaped; `export --jobs 2`,
`summarize --jobs 2` and `report` printed the raw escape (the workers wrote
their own warnings to the terminal; `report` had no handler at all), and
every parallel export added a ``<frozen runpy> RuntimeWarning`` per worker.
Checked on the bytes the commands write to pipes, and on a real terminal
(tmux) as the person sees it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from tests.conftest import REPO
from tests.helpers import processes

RED = "\x1b[31m"
COMMANDS = [
    ["export", "--jobs", "2"],
    ["export", "--jobs", "1"],
    ["export", "--jobs", "2", "--format", "perfetto"],
    ["summarize", "--jobs", "2"],
    ["summarize", "--jobs", "2", "--json", "--no-cache"],  # read in the workers again (the line above cached the run)
    ["summarize", "--tail"],
    ["report"],
    ["report", "--jobs", "2"],
    ["sql", "SELECT count(*) FROM spans"],
]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostile-names")
    generate_run(str(out), RunSpec(ranks=4, steps=6, seed=2, start_us=1_796_000_000_000_000))
    victim = sorted((out / "structured_logs").glob("*.jsonl"))[1]
    renamed = victim.with_name(victim.name.replace("global_rank_1", f"global_rank_1{RED}RED"))
    victim.rename(renamed)
    with open(renamed, "a") as handle:
        handle.write('{"time_us": 17960000')  # torn: the process died mid-write
    return out


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return processes.run([sys.executable, "-m", "otel_titan.cli", *args], capture_output=True, env=env, timeout=180)


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_no_control_character_reaches_the_terminal(run, tmp_path, command) -> None:
    name, *options = command
    target = [str(run), *options] + (["-o", str(tmp_path / "r.html")] if name == "report" else [])
    if name == "export":
        target += ["-o", str(tmp_path / ("t.pftrace" if "perfetto" in options else "t.json"))]
    done = _cli(name, *target)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    for stream in (done.stdout, done.stderr):
        assert b"\x1b" not in stream and b"\r" not in stream, stream[-2000:]
    stderr = done.stderr.decode()
    assert "RuntimeWarning" not in stderr and "frozen runpy" not in stderr
    if name != "sql":  # DuckDB reads the files itself; every other command warns, once, by the one path, escaped
        warnings = [line for line in stderr.splitlines() if "truncated last line" in line]
        assert len(warnings) == 1, stderr
        assert warnings[0].startswith("otel-titan: warning: ") and "global_rank_1\\x1b[31mRED" in warnings[0]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_parallel_export_on_a_real_terminal_stays_uncoloured(run, tmp_path) -> None:
    """On a tty the progress line is on too; the screen shows the escape as text, and nothing turned red."""
    socket = f"otel-titan-test-{os.getpid()}"
    done_file = tmp_path / "done"
    command = (f"PYTHONPATH={REPO} {sys.executable} -m otel_titan.cli export {run} --jobs 2 -o {tmp_path / 't.json'}; "
               f"echo EXIT=$? > {done_file}; sleep 60")
    subprocess.run(["tmux", "-L", socket, "new-session", "-d", "-x", "250", "-y", "40", command], check=True, timeout=30)
    try:
        deadline = time.monotonic() + 120
        while not done_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert done_file.read_text().strip() == "EXIT=0"
        # -e: the screen with its colours as escapes; red would show as a 31 SGR.
        screen = subprocess.run(["tmux", "-L", socket, "capture-pane", "-p", "-e", "-J"], capture_output=True, text=True, check=True, timeout=30).stdout
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], timeout=30)
    assert "global_rank_1\\x1b[31mRED" in screen and "truncated last line" in screen
    assert "\x1b[31m" not in screen and "RuntimeWarning" not in screen
    assert "trace: " in screen


def test_what_a_dying_worker_writes_on_stderr_comes_by_the_same_path(run, tmp_path, monkeypatch, capsys) -> None:
    """A worker's own stderr (a traceback, a message of Python's) is shown escaped, named after the worker, then the error."""
    from otel_titan.cli import main

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nprintf 'Traceback: boom \\033[31m in red\\n' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    assert main(["export", str(run), "--jobs", "2", "-o", str(tmp_path / "t.json")]) == 5  # ExitCode.UNAVAILABLE: a worker died
    err = capsys.readouterr().err
    assert "\x1b" not in err
    # Both workers die; whichever is heard first is the error, and its own stderr came before it, escaped.
    failed = re.search(r"otel-titan: error: export worker (\d) failed \(exit status 3\)", err)
    assert failed, err
    assert f"otel-titan: warning: export worker {failed.group(1)}: Traceback: boom \\x1b[31m in red" in err.split("otel-titan: error:")[0]
    assert not (tmp_path / "t.json").exists()

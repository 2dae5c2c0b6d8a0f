"""One warning path for every command and every worker (`worker_io`, `cli`), and no control
character on the terminal.

A file name holding ``\\x1b[31m`` (the terminal's "red from here on") and a
torn last line: each command warns about the torn line, naming the file.
`export --jobs 1` always printed the name escaped; `export --jobs 2`,
`summarize --jobs 2` and `report` printed the raw escape (the workers wrote
their own warnings to the terminal; `report` had no handler at all), and
every parallel export added a ``<frozen runpy> RuntimeWarning`` per worker.
Checked on the bytes the commands write to pipes, and on a real terminal
(tmux) as the person sees it.

And Ctrl-C at any moment of a worker's life: one that came while a worker's
interpreter was starting killed it (exit status -2) or made it print
``Fatal Python error: init_import_site`` and a KeyboardInterrupt traceback,
relayed as some 20 warnings above ``otel-titan: interrupted`` (the rare
failure of tests/reliability/test_long_lines.py's Ctrl-C test on a loaded
machine); and a worker a thread was starting while the pool was cancelled
escaped the kill and converted its whole share before the command exited.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis.workers.interpreters import InterpreterPool, run_task, start_process
from tests.conftest import REPO
from tests.helpers import processes

RED = "\x1b[31m"
COMMANDS = [
    ["export", "--jobs", "2"],
    ["export", "--jobs", "1"],
    ["export", "--jobs", "2", "--format", "perfetto"],
    ["summarize", "--jobs", "2"],
    # read in the workers again (the line above cached the run)
    [
        "summarize",
        "--jobs",
        "2",
        "--json",
        "--no-cache",
    ],
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
    return processes.run(
        [sys.executable, "-m", "otel_titan.cli", *args], capture_output=True, env=env, timeout=180
    )


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
    # DuckDB reads the files itself; every other command warns, once, by the one path, escaped
    if name != "sql":
        warnings = [line for line in stderr.splitlines() if "truncated last line" in line]
        assert len(warnings) == 1, stderr
        assert (
            warnings[0].startswith("otel-titan: warning: ")
            and "global_rank_1\\x1b[31mRED" in warnings[0]
        )


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_parallel_export_on_a_real_terminal_stays_uncoloured(run, tmp_path) -> None:
    """On a tty the progress line is on too; the screen shows the escape as text, and nothing turned
    red."""
    socket = f"otel-titan-test-{os.getpid()}"
    done_file = tmp_path / "done"
    command = (
        f"PYTHONPATH={REPO} {sys.executable} -m otel_titan.cli export {run} --jobs 2 -o "
        f"{tmp_path / 't.json'}; "
        f"echo EXIT=$? > {done_file}; sleep 60"
    )
    subprocess.run(
        ["tmux", "-L", socket, "new-session", "-d", "-x", "250", "-y", "40", command],
        check=True,
        timeout=30,
    )
    try:
        deadline = time.monotonic() + 120
        while not done_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert done_file.read_text().strip() == "EXIT=0"
        # -e: the screen with its colours as escapes; red would show as a 31 SGR.
        screen = subprocess.run(
            ["tmux", "-L", socket, "capture-pane", "-p", "-e", "-J"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], timeout=30)
    assert "global_rank_1\\x1b[31mRED" in screen and "truncated last line" in screen
    assert "\x1b[31m" not in screen and "RuntimeWarning" not in screen
    assert "trace: " in screen


def test_what_a_dying_worker_writes_on_stderr_comes_by_the_same_path(
    run, tmp_path, monkeypatch, capsys
) -> None:
    """A worker's own stderr (a traceback, a message of Python's) is shown escaped, named after the
    worker, then the error."""
    from otel_titan.cli import main

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nprintf 'Traceback: boom \\033[31m in red\\n' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    # ExitCode.UNAVAILABLE: a worker died
    assert main(["export", str(run), "--jobs", "2", "-o", str(tmp_path / "t.json")]) == 5
    err = capsys.readouterr().err
    assert "\x1b" not in err
    # Both workers die; whichever is heard first is the error, and its own stderr came before it,
    # escaped.
    failed = re.search(r"otel-titan: error: export worker (\d) failed \(exit status 3\)", err)
    assert failed, err
    assert (
        f"otel-titan: warning: export worker {failed.group(1)}: Traceback: boom \\x1b[31m in red"
        in err.split("otel-titan: error:")[0]
    )
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("after_ms", [0, 1, 3, 10, 30])
def test_a_ctrl_c_while_a_worker_starts_neither_kills_it_nor_makes_it_print(
    tmp_path, after_ms
) -> None:
    """SIGINT `after_ms` after `start_process` returns: within its interpreter's start-up (~30 ms;
    at 0 ms, before Python's own handler)."""
    result = tmp_path / "result"
    worker = start_process(
        "otel_titan.analysis.workers.interpreters",
        "_call_main",
        pickle.dumps(("builtins:callable", (), str(result))),
    )
    try:
        time.sleep(after_ms / 1000)
        # the worker only: a terminal's Ctrl-C reaches it the same way, with its command's
        worker.send_signal(signal.SIGINT)
        assert worker.stderr is not None
        # start_process wrote the payload and closed stdin: not communicate(), which flushes it
        stderr = worker.stderr.read()
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for stream in (worker.stdout, worker.stderr):
            if stream is not None:
                stream.close()
    assert (worker.returncode, stderr.decode(errors="replace")) == (0, "")
    with open(result, "rb") as handle:
        assert pickle.load(handle)[0] is True  # and it ran its task: callable(on_bytes)


def test_a_worker_started_while_the_pool_is_cancelled_is_killed_at_once() -> None:
    """shutdown(cancel_futures=True) right after submit: the thread is still in `start_process`, its
    worker not yet known to the pool."""
    pool = InterpreterPool(1, "test worker", lambda count: None)
    future = pool.submit(run_task, "tests.helpers.worker_tasks:sleep", 30)
    # its thread has taken it: it is starting the worker (a fork and exec, milliseconds)
    while not future.running():
        time.sleep(0.0001)
    started = time.monotonic()
    pool.shutdown(cancel_futures=True)  # waits for the pool's thread, so for its worker
    assert time.monotonic() - started < 10, (
        "the worker escaped the kill and ran its task to the end"
    )
    assert future.cancelled() or future.exception() is not None

"""`read.processes_here`: a writer's liveness from this host's process table, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from otel_titan.analysis.read.processes_here import _boot_s, alive_here, this_host

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc")


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_running_writer_is_alive_and_a_killed_one_gone() -> None:
    child = _sleeper()
    try:
        written = int(time.time() * 1e6) + 500_000  # its file's first record, after it started
        assert alive_here(this_host(), child.pid, written) is True
        child.kill()
        # killed, not yet reaped: a zombie, its program ended
        deadline = time.monotonic() + 10
        while alive_here(this_host(), child.pid, written) is not False:
            assert time.monotonic() < deadline, "a killed process still reads alive"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
    assert alive_here(this_host(), child.pid, written) is False  # reaped: no such process


def test_a_pid_that_names_a_process_started_after_the_records_is_another_writer() -> None:
    child = _sleeper()
    try:
        before = int((time.time() - 30) * 1e6)  # a file written half a minute before it started
        assert alive_here(this_host(), child.pid, before) is False
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    "host, pid",
    [("another-host", os.getpid()), (None, os.getpid()), ("*", None), ("*", "12"), ("*", -1)],
)
def test_another_host_or_no_pid_cannot_be_told(host, pid) -> None:
    host = this_host() if host == "*" else host
    assert alive_here(host, pid, None) is None


def test_a_file_begun_before_this_machine_booted_cannot_be_told() -> None:
    # A copied folder from another machine of the same name (``vm``): its pids mean nothing here.
    boot = _boot_s()
    assert boot is not None
    assert alive_here(this_host(), os.getpid(), int((boot - 60) * 1e6)) is None

"""Tests leave no process behind: the process check of tests/conftest.py, and the helpers that start
torchrun.

The check is run for real on a throwaway test suite (pytester, in a fresh
pytest process) that leaks in each way a test can: a plain child, an orphan
in its own session re-parented to init (what torchrun's workers become when
only the launcher dies), and a session-scoped fixture that never stops its
process.
"""

from __future__ import annotations

import os
import sys
import textwrap
import uuid

import pytest

from tests.conftest import REPO
from tests.helpers import processes

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _running(needle: str) -> dict[int, str]:
    """Live processes whose command line contains `needle`."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and needle in (command := processes.cmdline(int(name))):
            entry = processes._stat(int(name))
            if entry is not None and processes._alive(entry[1]):
                found[int(name)] = command
    return found


def _kill_all(found: dict[int, str]) -> None:
    for pid in found:
        processes.kill_tree(pid, timeout=10)


@pytest.mark.slow
def test_a_leaked_process_fails_its_test_and_the_session_and_is_killed(pytester, monkeypatch):
    tag = str(uuid.uuid4().int % 10**12)  # marks this run's sleepers: `sleep 300<i>.<tag>`
    seconds = {kind: f"{3000 + i}.{tag}" for i, kind in enumerate(("child", "orphan", "session"))}
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makeconftest(
        """
        from tests.conftest import *  # noqa: F403 - the project's own test set-up, with the check under test
        from tests.helpers.process_check import LeakCheck

        LeakCheck.grace_s = 1.0
        """
    )
    pytester.makepyfile(
        test_leaks=textwrap.dedent(
            f"""
            import subprocess, sys
            import pytest

            @pytest.fixture(scope="session")
            def server():
                return subprocess.Popen(["sleep", "{seconds["session"]}"])  # never stopped

            def test_clean():
                subprocess.run(["true"], check=True)
                process = subprocess.Popen(["sleep", "30"])
                process.kill()
                process.wait()

            def test_leaks_a_child():
                subprocess.Popen(["sleep", "{seconds["child"]}"])

            def test_leaks_an_orphan_in_its_own_session():
                launcher = "import subprocess; subprocess.Popen(['sleep', '{seconds["orphan"]}'], start_new_session=True)"
                subprocess.run([sys.executable, "-c", launcher], check=True)  # the launcher exits, its child lives on

            def test_uses_a_session_server(server):
                assert server.poll() is None
            """
        )
    )
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
        output = result.stdout.str()
        result.assert_outcomes(passed=4, errors=2)  # the two leakers pass, then error at teardown
        assert "test_leaks.py::test_leaks_a_child left 1 process(es) running" in output, output
        assert (
            "test_leaks.py::test_leaks_an_orphan_in_its_own_session left 1 process(es) running"
            in output
        ), output
        assert f"sleep {seconds['child']}" in output and f"sleep {seconds['orphan']}" in output
        assert "processes left running" in output and f"sleep {seconds['session']}" in output, (
            output
        )
        assert "test_clean" not in output.split("short test summary info")[-1]
        assert result.ret != 0
        # ... and nothing is left: every leaked process was killed by the check.
        assert _running(f".{tag}") == {}
    finally:
        _kill_all(_running(f".{tag}"))


@pytest.mark.slow
def test_a_session_without_leftovers_passes(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makeconftest(
        """
        from tests.conftest import *  # noqa: F403 - the project's own test set-up, with the check under test
        from tests.helpers.process_check import LeakCheck

        LeakCheck.grace_s = 1.0
        """
    )
    pytester.makepyfile(
        test_fine="""
        import subprocess, sys

        def test_runs_and_waits():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)
    assert result.ret == 0 and "processes left running" not in result.stdout.str()


def test_run_kills_the_whole_tree_on_timeout(tmp_path):
    """`processes.run` on timeout: the command and the child it started in its own session are both
    gone."""
    marker = f"{4000 + os.getpid() % 1000}.{uuid.uuid4().int % 10**9}"
    code = f"import subprocess, time; subprocess.Popen(['sleep', '{marker}'], start_new_session=True); time.sleep(600)"
    try:
        with pytest.raises(processes.subprocess.TimeoutExpired):
            processes.run([sys.executable, "-c", code], timeout=3, capture_output=True)
        assert _running(f"sleep {marker}") == {}
        assert _running(code) == {}
    finally:
        _kill_all(_running(f"sleep {marker}"))


@pytest.mark.slow
def test_the_hung_toy_run_leaves_no_worker_behind():
    """The hung 2-rank torchrun run of the analysis tests is killed whole: no `train_toy.py` worker
    survives it.

    torchrun starts each worker in its own session, so killing the launcher's
    process group used to leave both workers hanging forever (~315 MB each).
    """
    from tests.helpers.analysis import hung_toy_run

    output = hung_toy_run()
    left = _running(str(output))
    _kill_all(left)  # whatever happens, do not leave them
    assert left == {}, left

"""The process check: a test that leaves a process running fails, and so does a session that ends
with one.

Registered by ``tests/conftest.py`` (Linux: it reads /proc). It exists
because the suite once left two hung torchrun workers running forever after
every ``make test``, and nothing noticed.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from tests.helpers.processes import SESSION_VARIABLE, kill_tree, started_by, wait_gone


def _describe(leftovers: dict[int, str]) -> str:
    return "\n".join(f"  pid {pid}: {command[:300]}" for pid, command in sorted(leftovers.items()))


class LeakCheck:
    """Pytest plugin: fail the test that leaves a process running, and the session if any is left at
    its end.

    Per test, the processes alive after its teardown that were not alive
    before it are its leftovers (processes of module- or session-scoped
    fixtures exist before the test starts, so they are not counted). They get
    `grace_s` to exit on their own, then they are killed (whole trees) and the
    test errors at teardown with their command lines. At the end of the
    session anything still alive is killed and the exit status is a failure.
    """

    #: How long a test's new processes may take to exit after its teardown (a process told to stop,
    #: still flushing).
    grace_s = 5.0

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self.pid = os.getpid()
        os.environ[SESSION_VARIABLE] = self.token

    def leftovers(self) -> dict[int, str]:
        return started_by(self.pid, self.token)

    def _kill(self, leftovers: dict[int, str]) -> None:
        for pid in leftovers:
            kill_tree(pid, timeout=10)

    @pytest.fixture(autouse=True)
    def _no_process_left_behind(self, request: pytest.FixtureRequest) -> Any:
        before = set(self.leftovers())
        yield
        new = {pid: command for pid, command in self.leftovers().items() if pid not in before}
        if not new:
            return
        still = set(wait_gone(new, self.grace_s))
        leaked = {pid: command for pid, command in new.items() if pid in still}
        if leaked:
            self._kill(leaked)
            pytest.fail(
                f"{request.node.nodeid} left {len(leaked)} process(es) running (killed "
                f"now):\n{_describe(leaked)}",
                pytrace=False,
            )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if os.getpid() != self.pid:  # a forked child running atexit/teardown code
            return
        leftovers = self.leftovers()
        if leftovers:
            leftovers = {
                pid: command
                for pid, command in leftovers.items()
                if pid in set(wait_gone(leftovers, self.grace_s))
            }
        if not leftovers:
            return
        self._kill(leftovers)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the test session left {len(leftovers)} process(es) running (killed now):\n{_describe(leftovers)}"
        if reporter is not None:
            reporter.write_sep("=", "processes left running", red=True)
            reporter.write_line(message)
        else:
            print(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

"""Process trees: kill a whole tree, run a command without ever leaving its tree behind, find
leftovers.

Why a tree and not a process group: torchrun's agent starts every worker with
``start_new_session=True`` (torch 2.13), so each worker is the leader of its
own session and process group. ``os.killpg(launcher)`` therefore kills the
agent only; its workers are re-parented to init and, in a hung run, live
forever (their heartbeats even recreate the deleted temporary folder). The
only reliable unit is the tree of parent → child links, read from ``/proc``
(Linux; the stdlib only, no psutil).

`started_by` finds what a test session left running (`process_check.py`, the
pytest plugin of ``tests/conftest.py``): its descendants, and every process
carrying the session's `SESSION_VARIABLE` in its environment, so processes
re-parented to init (the orphaned torchrun workers above) are found too.
Standard library only: the benchmarks use it as well.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from typing import Any

#: Environment variable naming the test session that started a process (inherited by every
#: descendant that keeps its environment). Not ``OTEL_``/``TITAN_``/``TORCHELASTIC_``-prefixed:
#: tests strip those.
SESSION_VARIABLE = "PYTEST_PROCESS_CHECK_SESSION"

# Python's own per-interpreter helper processes: they belong to the interpreter (pytest), live until
# it exits by design, and are not a test's leftovers.
_INTERPRETER_HELPERS = (
    "from multiprocessing.resource_tracker import main",
    "from multiprocessing.forkserver import main",
)


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may contain spaces and parentheses, so split after the last
    # ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[1]), fields[0].decode()


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _table() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, state) of every process visible in /proc."""
    table = {}
    for pid in _pids():
        entry = _stat(pid)
        if entry is not None:
            table[pid] = entry
    return table


def _alive(state: str) -> bool:
    """Running, sleeping, stopped…: anything but a zombie (exited, waiting to be reaped) or dead."""
    return state not in ("Z", "X", "x")


def descendants(root: int, table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """Every live process below `root` (children, their children, …), parents before children."""
    table = _table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, pending = [], list(children.get(root, ()))
    while pending:
        pid = pending.pop(0)
        if _alive(table[pid][1]):
            found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip() or "?"
    except OSError:
        return "?"


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return needle in b"\0" + handle.read()
    except OSError:  # gone, or another user's process
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(root: int | subprocess.Popen[Any], timeout: float = 30) -> list[int]:
    """SIGKILL `root` and every process below it; return the pids killed.

    The tree is frozen first (SIGSTOP, top down, re-read until no new child
    appears), so nothing can fork or be re-parented away while it is being
    collected; then every member gets SIGKILL. A `Popen` root is reaped.
    """
    pid = root.pid if isinstance(root, subprocess.Popen) else root
    members: list[int] = []
    entry = _stat(pid)
    # an exited root's children were re-parented: not findable from it
    if entry is not None and _alive(entry[1]):
        members.append(pid)
        _signal(pid, signal.SIGSTOP)
    while True:
        table = _table()
        new = [p for p in descendants(pid, table) if p not in members]
        if not new:
            break
        for child in new:
            _signal(child, signal.SIGSTOP)
        members.extend(new)
    for member in members:
        _signal(member, signal.SIGKILL)
    if isinstance(root, subprocess.Popen):
        try:
            root.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    wait_gone(members, timeout)
    return members


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until none of `pids` is alive (zombies count as gone); return those still alive."""
    deadline = time.monotonic() + timeout
    remaining = list(pids)
    while True:
        remaining = [p for p in remaining if (entry := _stat(p)) is not None and _alive(entry[1])]
        if not remaining or time.monotonic() >= deadline:
            return remaining
        time.sleep(0.02)


def run(
    args: Sequence[str],
    *,
    timeout: float | None = None,
    input: Any = None,
    check: bool = False,
    capture_output: bool = False,
    **popen: Any,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run`, except that a timeout (or any interruption) kills the command's whole tree.

    `subprocess.run` kills only the direct child on timeout: a torchrun
    launcher would die and leave its workers running.
    """
    if capture_output:
        popen["stdout"] = popen["stderr"] = subprocess.PIPE
    process = subprocess.Popen(args, **popen)
    try:
        stdout, stderr = process.communicate(input, timeout=timeout)
    except BaseException:
        kill_tree(process)
        process.communicate()
        raise
    finally:
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    completed = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    if check:
        completed.check_returncode()
    return completed


def started_by(pid: int, token: str) -> dict[int, str]:
    """Live processes of this session other than `pid` itself: its descendants, and any process
    whose environment names session `token` (re-parented orphans), minus the interpreter's own
    helpers. pid → command line."""
    table = _table()
    below = set(descendants(pid, table))
    needle = f"\0{SESSION_VARIABLE}={token}\0".encode()
    found = {}
    for other, (ppid, state) in table.items():
        if other == pid or not _alive(state):
            continue
        if other in below or _carries(other, needle):
            command = cmdline(other)
            if ppid == pid and any(helper in command for helper in _INTERPRETER_HELPERS):
                continue
            found[other] = command
    return found

"""Whether a file's writer is still alive, where the reader runs on the writer's host: evidence the
records cannot give.

Why: a file with no heartbeat and no black box (torchtitan's logger, a
pimm-like writer; ours between spans) reads the same whether its process is
stuck or was killed mid-step. On the writer's own host the process table
tells them apart: a process that is still there while its file stays quiet is
stuck (`summarize` names the rank behind from it, as from a heartbeat), and a
job whose every process here is gone was stopped (`watch` names no one).

The answer is only ever "alive", "gone" or "cannot tell" (None): another
host, no pid, no ``/proc`` (not Linux), or a pid that now names a process
started after the file's first record (the pid was reused). Nothing of the
file is run; a forged pid can only make a process look alive that is alive.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache

__all__ = ["WRITER_START_S", "alive_here", "this_host"]


@lru_cache(maxsize=1)
def this_host() -> str:
    """The name the writer records as ``host_name`` on this machine (`socket.gethostname`)."""
    return socket.gethostname()


@lru_cache(maxsize=1)
def _boot_s() -> float | None:
    """When this machine booted (s since the epoch), from ``/proc/stat``; None without it."""
    try:
        with open("/proc/stat", "rb") as stat:
            for line in stat:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def _stat(pid: int) -> tuple[bytes, float] | None:
    """(its state letter, when it started: s since the epoch) of process `pid` from
    ``/proc/<pid>/stat``; None when that cannot be read (gone, or hidden: ``hidepid``)."""
    boot = _boot_s()
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if boot is None or len(fields) < 20:
        return None
    # field 22 of proc(5), the start time in clock ticks after boot (the 20th after the name)
    return fields[0], boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


#: How long before its file's first record a writer may have started (imports, a checkpoint read
#: before the logger's init): a process with the pid started earlier is another one.
WRITER_START_S = 3600.0


def alive_here(host: object, pid: object, opened_us: int | None) -> bool | None:
    """Whether the process `pid` that began writing on `host` at `opened_us` (µs: its file's first
    record) is still alive: True, False (gone), or None (cannot tell).

    Cannot tell: another host, no pid, no ``/proc`` or a process table it
    cannot read, or a file begun before this machine booted (a host name like
    ``vm`` is no proof it was this machine: a copied folder). Gone: no such
    process, a zombie (its program ended, not yet reaped), or a process with
    that pid that started after `opened_us` (a second of slack: the start time
    has the clock's ticks) or `WRITER_START_S` before it: another one.

    Example:
        >>> import time
        >>> alive_here(this_host(), os.getpid(), int(time.time() * 1e6))
        True
        >>> alive_here("another-host", os.getpid(), None) is None
        True
    """
    boot = _boot_s()
    if (
        type(pid) is not int
        or not 0 < pid < 1 << 22
        or host != this_host()
        or boot is None
        or opened_us is None
        or opened_us / 1e6 < boot
    ):
        return None
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, another user's
    except OSError:
        return None
    stat = _stat(pid)
    if stat is None:
        return None
    state, started = stat
    if state in (b"Z", b"X"):
        return False
    return opened_us / 1e6 - WRITER_START_S <= started <= opened_us / 1e6 + 1.0

"""Real second (and third) users for the tests where who wrote a file matters: a shared project
folder, a shared cache, a spool.

`local_users` makes users sharing one new group with ``groupadd``/``useradd``
(CI runs as root), each with a home of its own in a fresh folder, and
removes users, group and folder when the ``with`` ends. `User.run` runs a
command as that user (``setpriv``: its uid, its group, no other group), with
a timeout after which the command's whole process group is killed.
`skip_reason` says why it cannot be done here (not root, no ``useradd``),
for ``pytest.skip``.

Names are ``ot-<tag>-<letter><pid>`` (at most 32 characters), so parallel
sessions never collide and a leftover names its test.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["User", "local_users", "skip_reason"]

_TOOLS = ("useradd", "userdel", "groupadd", "groupdel", "setpriv")


def skip_reason() -> str | None:
    """Why real users cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "making real users needs root (useradd); CI runs the tests as root"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    return f"no {', '.join(missing)} on this machine" if missing else None


@dataclass
class User:
    """A test user: `name`, `uid`, `gid` (the shared group's), `home` (its own, 0700)."""

    name: str
    uid: int
    gid: int
    home: str

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment for this user: PATH, HOME, LANG, no XDG_CACHE_HOME unless given (pass
        it to share one)."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.home,
            "LANG": "C.UTF-8",
            "USER": self.name,
        }
        # the code under test, when the tests run against another tree
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        env.update(extra)
        return env

    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        umask: int = 0o022,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """`argv` run as this user (uid, the shared group, no supplementary groups) with `umask`;
        its output, as text."""
        command = [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--",
            *argv,
        ]
        process = subprocess.Popen(
            command,
            env=env if env is not None else self.env(),
            cwd=cwd or self.home,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=lambda: os.umask(umask),
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            raise AssertionError(
                f"{' '.join(argv)} as {self.name} ran past {timeout} s:\n{out}\n{err}"
            ) from None
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # nothing of it outlives the call
        return subprocess.CompletedProcess(argv, process.returncode, out, err)


def _name(tag: str, letter: str) -> str:
    return f"ot-{tag}-{letter}{os.getpid() % 100000}"[:32]


@contextlib.contextmanager
def local_users(tag: str, count: int = 2) -> Iterator[tuple[list[User], int, str]]:
    """`count` new users (a, b, ...) in one new group: (users, the group's gid, a fresh folder all
    of them can enter, 0755).

    Everything is removed at the end (`User.run` has killed each command's process group already).
    """
    reason = skip_reason()
    if reason is not None:
        raise RuntimeError(reason)
    group = _name(tag, "g")
    top = tempfile.mkdtemp(prefix=f"ot-{tag}-")
    os.chmod(top, 0o755)
    made: list[str] = []
    group_made = False
    try:
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        group_made = True
        gid = int(
            subprocess.run(
                ["getent", "group", group], check=True, capture_output=True, text=True
            ).stdout.split(":")[2]
        )
        users = []
        for index in range(count):
            name = _name(tag, "abcdefgh"[index])
            home = os.path.join(top, f"home-{name}")
            subprocess.run(
                ["useradd", "-M", "-N", "-g", group, "-d", home, "-s", "/bin/sh", name],
                check=True,
                capture_output=True,
            )
            made.append(name)
            entry = pwd.getpwnam(name)
            os.mkdir(home, 0o700)
            os.chown(home, entry.pw_uid, gid)
            users.append(User(name=name, uid=entry.pw_uid, gid=gid, home=home))
        yield users, gid, top
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
        if group_made:
            subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)

"""sigterm.py's state: one object (`SignalState`), reset in a fork child and by `reset`, in real
interpreters.

What a SIGTERM does with a logger running is tests/structured_logger/test_process_hooks.py's;
here, the module alone: what `install` leaves in the state, that `reset` gives
everything back so that a second `install` in the same interpreter works as the
first, and what a fork child starts from.
"""

from __future__ import annotations

import signal

from tests.conftest import run_python

_STATE_FIELDS = (
    "(s.watcher, s.previous, s.on_signal, s.owed_given, s.owed_taken, s.dying, s.dump_callbacks)"
)


def test_reset_gives_everything_back_and_a_second_install_works_as_the_first():
    code = f"""
        import os, signal, threading, time
        from otel_titan.structured_logger import sigterm

        def watchers():
            return [t for t in threading.enumerate() if t.name == "otel-titan-signals"]

        s = sigterm.STATE
        assert {_STATE_FIELDS} == (None, None, None, 0, 0, False, {{}})
        assert sigterm.install(lambda signum, dying: None)
        assert sigterm.install_dump_signal(signal.SIGUSR2, lambda: None)
        assert s.watcher is not None and s.previous is signal.SIG_DFL and s.on_signal is not None and list(s.dump_callbacks) == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL and len(watchers()) == 1

        sigterm.reset()
        assert {_STATE_FIELDS} == (None, None, None, 0, 0, False, {{}}), {_STATE_FIELDS}
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.set_wakeup_fd(-1) == -1  # our pipe is no longer the wakeup fd
        deadline = time.monotonic() + 10
        while watchers() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not watchers() and not sigterm.is_installed()

        # Installed again: SIGTERM with the main thread unable to take it is flushed by the new watcher, then kills.
        assert sigterm.install(lambda signum, dying: os.write(1, f"flushed {{signum}} dying={{dying}}\\n".encode()))
        signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        print("still alive")
    """
    result = run_python(code)
    assert result.returncode == -signal.SIGTERM, result.stderr[-3000:]
    assert result.stdout == f"flushed {int(signal.SIGTERM)} dying=True\n", result.stdout


def test_a_fork_child_starts_with_a_free_lock_nothing_owed_and_the_disposition_from_before():
    code = """
        import os, signal, threading
        from otel_titan.structured_logger import sigterm

        def before(signum, frame):
            pass

        signal.signal(signal.SIGTERM, before)
        assert sigterm.install(lambda signum, dying: None)
        s = sigterm.STATE
        s.owed_given = s.owed_taken = 3  # as after three SIGTERMs handed to the main thread
        read, write = os.pipe()
        with s.lock:  # held at fork time, as by another thread in install
            pid = os.fork()
        if pid == 0:
            sigterm.after_fork_in_child()  # what the logger's at-fork hook calls (process_hooks.py)
            ok = (s.lock.acquire(blocking=False), s.watcher, s.owed_given, s.owed_taken, s.dying, signal.getsignal(signal.SIGTERM) is before, s.previous is before)
            os.write(write, repr(ok).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as child:
            print(child.read())
        assert os.waitpid(pid, 0)[1] == 0
        assert s.watcher is not None and sigterm.is_installed()  # the parent's stays
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "(True, None, 0, 0, False, True, True)"

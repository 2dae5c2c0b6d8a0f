"""SIGTERM that takes its usual course within milliseconds, wherever the main thread is.

Python runs a signal handler on the main thread only, between two bytecodes.
A main thread inside a long native call that does not return on a signal (a
collective waiting for a hung peer, a C library waiting on a mutex, a call
whose thread has SIGTERM blocked) would run it only when the call returns, or
never: torchrun's agent then SIGKILLs the rank and nothing queued is written.
So the work is done by a watcher thread (``otel-titan-signals``):

* the C-level part that Python installs along with any Python handler writes
  the signal number to the *wakeup fd* (`signal.set_wakeup_fd`). Ours is a pipe
  the watcher reads. On SIGTERM it runs the flush callback, then gives the
  signal its usual course: for the default action (or a handler installed from
  C, which Python cannot call) it restores the default and re-raises, so the
  process dies of SIGTERM (exit status -15, as without otel-titan) a few
  milliseconds later with the queue written; an ignored signal stays ignored;
  a Python handler installed before ours is called on the main thread, where
  Python would have called it, once the flush is done (the watcher makes the
  main thread run our handler again, which then calls it; its exit status wins);
* the Python-level handler (`_on_sigterm`) never waits for anything while the
  watcher is in charge: the main thread may be holding a lock the writer needs
  at the very bytecode the handler interrupted (an `Event`'s, a thread's join
  lock), so waiting there could stall the flush it waits for.

There is one wakeup fd per process. One set before ours (an asyncio loop sets
its own for ``add_signal_handler``) gets every byte forwarded by the watcher,
so its handlers still run. One set after ours replaces it: the Python-level
handler notices and flushes on the main thread, as it always did (an asyncio
loop wakes its main thread at once). A fork child gets the disposition and
the wakeup fd from before `install`: the watcher thread does not exist there,
and the pipe is the parent's (its write end is pointed at /dev/null in the
child, so a child's signal can never reach the parent's watcher).
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "install",
    "uninstall",
    "after_fork_in_child",
    "is_installed",
    "install_dump_signal",
    "reset",
    "SignalState",
    "STATE",
]

_log = logging.getLogger("otel_titan")

_STOP = b"\0"  # no signal has number 0: the byte `uninstall` writes to stop the watcher
_SIGTERM_BYTE = bytes((signal.SIGTERM,))


class _Watcher:
    """The pipe behind the wakeup fd and the thread that reads it."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()  # non-inheritable: never reaches an exec'd program
        # set_wakeup_fd requires it; a full pipe drops, never blocks
        os.set_blocking(self.write_fd, False)
        self.previous_fd = -1
        self.previous_id: tuple[int, int] | None = None
        self.pid = os.getpid()
        self.stop = False
        # Single-writer counters (no lock: each has one writer thread).
        self.self_trips = 0  # SIGTERM bytes the watcher caused itself (interrupt_main), to skip
        self.self_trips_seen = 0
        self.thread = threading.Thread(target=self._run, name="otel-titan-signals", daemon=True)

    def forward(self, data: bytes) -> None:
        """Pass signal bytes on to the wakeup fd that was set before ours (asyncio's loop, say)."""
        fd = self.previous_fd
        # closed, or the number reused
        if fd < 0 or not data or _fd_identity(fd) != self.previous_id:
            return
        try:
            os.write(fd, data)
        except OSError:  # full (the owner is not reading) or gone: as Python itself would, drop
            pass

    def _run(self) -> None:
        read_fd = self.read_fd
        try:
            while not self.stop:
                try:
                    data = os.read(read_fd, 512)
                except OSError:
                    return
                if not data or self.stop:
                    return
                terms = data.count(_SIGTERM_BYTE)
                own = min(terms, self.self_trips - self.self_trips_seen)
                self.self_trips_seen += own
                self.forward(data.replace(_STOP, b""))
                for signum, callback in list(STATE.dump_callbacks.items()):
                    if bytes((signum,)) in data:
                        _run_dump(callback)
                if terms > own:
                    _episode_in_watcher(self)
        finally:
            _close(read_fd)


def _run_dump(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # noqa: BLE001 - a failed dump must not stop the watcher
        _log.exception("otel-titan: writing the black box on the dump signal failed")


def install_dump_signal(signum: int, callback: Callable[[], None]) -> bool:
    """Make `signum` (``OTEL_TITAN_DUMP_SIGNAL``) run `callback` without disturbing the process
    (main thread only).

    The callback runs on the watcher thread when there is one (so it works while the
    main thread is stuck in native code: the C-level handler writes the signal's byte to
    our wakeup fd), else on the main thread from the Python-level handler.
    Returns False when it cannot be installed (not the main thread, a bad signal).
    """
    if threading.current_thread() is not threading.main_thread():
        return False

    def on_dump_signal(number: int, frame: Any) -> None:
        if _watching(STATE.watcher):
            return  # the watcher saw the byte and runs the callback
        _run_dump(callback)

    try:
        signal.signal(signum, on_dump_signal)
    except (ValueError, OSError) as error:
        _log.warning("otel-titan: cannot install the dump signal %s: %s", signum, error)
        return False
    STATE.dump_callbacks.clear()
    STATE.dump_callbacks[signum] = callback
    return True


class SignalState:
    """What `install`, the watcher, the handlers and fork share, in one place (as
    `runtime.LoggerState`).

    * ``lock``: held by `install` and `uninstall`;
    * ``watcher``: the running `_Watcher`, or None;
    * ``previous``: the Python-level SIGTERM disposition before ours (None: one set from C);
    * ``on_signal``: the flush callback `install` was given;
    * ``owed_given``, ``owed_taken``: the watcher asks the main thread to finish a signal's
      course (call the earlier handler, or die when the watcher could not); ``owed_given`` is
      written by the watcher only, ``owed_taken`` by the main thread only, so neither needs a lock;
    * ``dying``: the process is on its way to dying of SIGTERM (a second one changes nothing);
    * ``dump_callbacks``: signal number → callback, for the operator's "write your black box
      now" signal (run on the watcher).

    `STATE` is the process's instance; `reset_after_fork` its reset in a fork child, and
    `reset` (module level) the one tests use between installs in one interpreter.
    """

    __slots__ = (
        "lock",
        "watcher",
        "previous",
        "on_signal",
        "owed_given",
        "owed_taken",
        "dying",
        "dump_callbacks",
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watcher: _Watcher | None = None
        self.previous: Any = None
        self.on_signal: Callable[[int, bool], None] | None = None
        self.owed_given = 0
        self.owed_taken = 0
        self.dying = False
        self.dump_callbacks: dict[int, Callable[[], None]] = {}

    def reset_after_fork(self) -> _Watcher | None:
        """In a fork child: a new lock (another thread may have held it at fork time), nothing owed,
        not dying, no watcher.

        Returns the parent's watcher (its pipe is the child's to let go of); the
        disposition from before `install` (``previous``) is kept, for the child to restore.
        """
        inherited = self.watcher
        self.lock = threading.Lock()
        self.watcher = None
        self.owed_given = self.owed_taken = 0
        self.dying = False
        return inherited


STATE = SignalState()


def _fd_identity(fd: int) -> tuple[int, int] | None:
    if fd < 0:
        return None
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def is_installed() -> bool:
    """Whether our SIGTERM handler and watcher are in place in this process."""
    watcher = STATE.watcher
    return watcher is not None and watcher.pid == os.getpid()


def install(on_signal: Callable[[int, bool], None]) -> bool:
    """Handle SIGTERM from now on; False when it cannot be done (not the main thread, no signals).

    `on_signal(signum, dying)` writes what is queued, bounded by its own
    timeout; `dying` says the process is about to die of the signal. It runs
    on the watcher thread, or on the main thread when the watcher could not
    see the signal (its wakeup fd was replaced).
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    with STATE.lock:
        STATE.on_signal = on_signal
        if is_installed() and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            return True
        _uninstall_locked()
        try:
            watcher = _Watcher()
        except OSError as error:
            _log.debug("otel-titan: SIGTERM watcher not started: %s", error)
            return False
        try:
            # The wakeup fd and the watcher first: a SIGTERM right after
            # signal.signal below already finds them.
            previous_fd = signal.set_wakeup_fd(watcher.write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError) as error:  # not the main interpreter
            _close(watcher.read_fd)
            _close(watcher.write_fd)
            _log.debug("otel-titan: SIGTERM handler not installed: %s", error)
            return False
        watcher.previous_fd, watcher.previous_id = previous_fd, _fd_identity(previous_fd)
        watcher.thread.start()
        try:
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError) as error:
            _stop_watcher(watcher)
            _log.debug("otel-titan: SIGTERM handler not installed: %s", error)
            return False
        STATE.previous = previous if previous is not _on_sigterm else signal.SIG_DFL
        STATE.watcher = watcher
        STATE.dying = False
        return True


def uninstall() -> None:
    """Give SIGTERM and the wakeup fd back what they had before `install` (main thread only).

    From another thread nothing changes: the handler stays, finds no logger,
    and only gives the signal its usual course.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    with STATE.lock:
        _uninstall_locked()


def _uninstall_locked() -> None:
    watcher = STATE.watcher
    if watcher is None:
        return
    STATE.watcher = None
    if watcher.pid != os.getpid():
        return
    _restore_disposition()
    _stop_watcher(watcher)


def _restore_disposition() -> None:
    """SIGTERM's disposition from before `install`, only if ours is still the installed handler (one
    installed after us stays)."""
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(
                signal.SIGTERM, STATE.previous if STATE.previous is not None else signal.SIG_DFL
            )
    except (ValueError, OSError):
        pass


def _restore_wakeup_fd(watcher: _Watcher) -> bool:
    """Put back the wakeup fd from before ours, unless someone replaced ours since (theirs
    stays)."""
    previous = (
        watcher.previous_fd if _fd_identity(watcher.previous_fd) == watcher.previous_id else -1
    )
    try:
        current = signal.set_wakeup_fd(previous)
        if current != watcher.write_fd:
            signal.set_wakeup_fd(current)
    except (ValueError, OSError):
        return False
    return True


def _stop_watcher(watcher: _Watcher) -> None:
    if not _restore_wakeup_fd(watcher):
        return  # still the wakeup fd: keep the pipe open rather than let its number be reused
    watcher.stop = True
    try:
        os.write(watcher.write_fd, _STOP)
    except OSError:
        pass
    if watcher.thread.is_alive() and watcher.thread is not threading.current_thread():
        watcher.thread.join(1.0)
    _close(watcher.write_fd)


def after_fork_in_child() -> None:
    """In a fork child: the disposition and wakeup fd from before `install`; no pipe to the
    parent."""
    watcher = STATE.reset_after_fork()
    if watcher is None:
        return
    # Without the watcher, a SIGTERM that lands just before a blocking C call
    # (a multiprocessing.Pool worker entering sem_wait) would only be noted by a
    # Python-level handler, never acted on: Pool.terminate() would then wait
    # forever for that worker. So the child gets the disposition from before;
    # one that starts its own logger gets its own watcher.
    _restore_disposition()
    # The pipe is shared with the parent: point the inherited write end at
    # /dev/null first, so that nothing this child receives can wake the parent's watcher.
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        os.dup2(null, watcher.write_fd, inheritable=False)
        os.close(null)
    except OSError:
        pass
    if _restore_wakeup_fd(watcher):
        _close(watcher.write_fd)
    _close(watcher.read_fd)


def reset() -> None:
    """Back to as if `install` had never run in this process (main thread only); for tests that
    install again.

    SIGTERM's disposition and the wakeup fd are given back and the watcher
    stopped (as `uninstall`), then the state is the initial one: no flush
    callback, no dump callback, nothing owed, not dying. A dump signal's
    Python-level handler stays installed (its disposition from before was never
    kept), and with no watcher it runs its callback on the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "sigterm.reset() runs on the main thread only (signal dispositions can be changed "
            "there only)"
        )
    with STATE.lock:
        _uninstall_locked()
        STATE.previous = STATE.on_signal = None
        STATE.owed_given = STATE.owed_taken = 0
        STATE.dying = False
        STATE.dump_callbacks.clear()


# -- what a SIGTERM does ---------------------------------------------------------------------------
def _dies_of_it() -> bool:
    """Whether the signal's usual course is the process's death (default action, or a C handler
    Python cannot call)."""
    previous = STATE.previous
    return not callable(previous) and previous != signal.SIG_IGN


def _run_callback(signum: int, dying: bool) -> None:
    callback = STATE.on_signal
    if callback is None:
        return
    try:
        callback(signum, dying)
    except Exception:  # noqa: BLE001 - the signal must still take its course
        _log.exception("otel-titan: flushing on SIGTERM failed")


def _episode_in_watcher(watcher: _Watcher) -> None:
    """On the watcher thread: write the queue, then the signal's usual course."""
    if STATE.dying:
        return
    ours = signal.getsignal(signal.SIGTERM) is _on_sigterm
    # A handler installed after ours decides what the signal does; writing the queue still helps.
    dying = ours and _dies_of_it()
    _run_callback(signal.SIGTERM, dying)
    if not ours or STATE.previous == signal.SIG_IGN:
        return
    if dying and _die_of_sigterm():
        return
    # A Python handler from before ours (or dying failed): the main thread finishes the course.
    _hand_to_main_thread(watcher)


def _hand_to_main_thread(watcher: _Watcher) -> None:
    """Make the main thread run `_on_sigterm` again, now that the queue is written.

    A SIGTERM sent to the main thread itself interrupts what it waits in
    (``time.sleep``, a lock, ``select``: Python then runs the handler at once);
    when the main thread blocks SIGTERM, `_thread.interrupt_main` marks the
    handler to run at its next bytecode instead. Either writes one SIGTERM
    byte to our wakeup fd, which the watcher then skips.
    """
    main = threading.main_thread()
    STATE.owed_given += 1
    watcher.self_trips += 1
    try:
        if _blocks_sigterm(main.native_id) is False and main.ident is not None:
            signal.pthread_kill(main.ident, signal.SIGTERM)
        else:
            _thread.interrupt_main(signal.SIGTERM)
    except Exception as error:  # noqa: BLE001 - the signal is a courtesy: failing to pass it on must not raise in the watcher
        watcher.self_trips -= 1
        _log.debug("otel-titan: could not hand SIGTERM to the main thread: %s", error)


def _blocks_sigterm(native_id: int | None) -> bool | None:
    """Whether that thread has SIGTERM blocked (Linux: /proc); None when unknown."""
    try:
        with open(f"/proc/self/task/{native_id}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("SigBlk:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _die_of_sigterm() -> bool:
    """From any thread: restore the default action and re-raise, so the exit status says SIGTERM.

    `signal.signal` works on the main thread only, and the main thread may
    never come back from its native call: the C library's `signal()` has no
    such rule. Returns False when that is not available.
    """
    STATE.dying = True
    try:
        import ctypes  # only on the way out

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        # SIG_DFL; SIG_ERR on failure
        if libc.signal(signal.SIGTERM, None) == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "signal() failed")
        os.kill(os.getpid(), signal.SIGTERM)
    except Exception as error:  # noqa: BLE001 - the main thread does it when it runs Python again
        STATE.dying = False
        _log.debug("otel-titan: could not re-raise SIGTERM from the watcher: %s", error)
        return False
    return True


def _watching(watcher: _Watcher | None) -> bool:
    """Whether the watcher sees SIGTERM (main thread): our wakeup fd must still be the installed
    one."""
    if watcher is None or watcher.pid != os.getpid() or not watcher.thread.is_alive():
        return False
    try:
        current = signal.set_wakeup_fd(watcher.write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        return False
    if current == watcher.write_fd:
        return True
    if current >= 0:
        try:  # someone set theirs after ours (an asyncio loop): it stays
            signal.set_wakeup_fd(current)
        except (ValueError, OSError):
            pass
    # else: it had been unset (a closed asyncio loop): ours is back for the next signal, but missed
    # this one.
    return False


def _on_sigterm(signum: int, frame: Any) -> None:
    """The Python-level handler, on the main thread: see the module docstring."""
    if STATE.owed_given > STATE.owed_taken:
        STATE.owed_taken += 1  # the watcher has flushed: finish the course here
    elif _watching(STATE.watcher):
        return  # the watcher flushes, then kills the process or calls us again
    else:
        _run_callback(signum, _dies_of_it())
    previous = STATE.previous
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # Default action (or a handler installed from C that Python cannot call):
    # die of SIGTERM, as the process would have without us.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)

"""What happens at exit, SIGTERM and fork (process_hooks.py, sigterm.py), in real interpreters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from otel_titan import structured_logger as sl
from tests.conftest import REPO, jsonl_files, read_records, run_python

# -- process events (real interpreters) ------------------------------------------------------------
_EMIT = """
import os, sys, time
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], world_size=1, flush_interval_s=10)
for step in range(1, 201):
    sl.set_step(step)
    with sl.log_trace_span("fwd_bwd"):
        pass
"""


def _records_of(run_dir):
    """The file's records but the hang black box (`stall`: SIGTERM writes one;
    tests/core/test_blackbox.py checks it)."""
    (path,) = jsonl_files(run_dir)
    return [r for r in read_records(path) if r["log_type_name"] != "stall"]


def test_interpreter_exit_writes_everything_and_the_closing_record(run_dir):
    result = run_python(_EMIT + "print('bye')\n", str(run_dir))
    assert result.returncode == 0, result.stderr
    records = _records_of(run_dir)
    assert len([r for r in records if r["log_type_name"] == "fwd_bwd_end"]) == 200
    assert (
        records[-1]["log_type_name"] == "structured_logger_closed"
        and records[-1]["written_records"] == 400
    )


_CRASH = """
import sys, threading
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], world_size=1)

def allocate():
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")  # raised here

def helper():
    raise ValueError("a helper thread's bug")  # the helper's line

thread = threading.Thread(target=helper, name="prefetch")
thread.start()
thread.join()
for step in range(1, 9):
    sl.set_step(step)
    with sl.log_trace_span("fwd_bwd"):
        if step == 8:
            allocate()
"""


def test_an_uncaught_exception_is_recorded_with_its_type_message_and_line_before_the_closing_record(
    run_dir,
):
    result = run_python(_CRASH, str(run_dir))
    # the traceback is still printed: the earlier hook ran
    assert result.returncode == 1 and "CUDA out of memory" in result.stderr
    assert "a helper thread's bug" in result.stderr
    records = _records_of(run_dir)
    names = [r["log_type_name"] for r in records]
    crashes = [r for r in records if r["log_type_name"] == "uncaught_exception"]
    assert len(crashes) == 2, names
    thread, main = crashes
    assert (
        thread["fatal"] is False
        and thread["error_type"] == "ValueError"
        and thread["thread_name"] == "prefetch"
    )
    assert (
        main["fatal"] is True
        and main["error_type"] == "RuntimeError"
        and main["error_message"] == "CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    assert main["step"] == 8 and main["thread_name"] == "MainThread"
    line = next(n for n, text in enumerate(_CRASH.splitlines(), 1) if "# raised here" in text)
    # innermost first: where it was raised
    assert main["error_frames"][0] == f"<string>:{line}:allocate", main["error_frames"]
    assert (
        names.index("fwd_bwd_error")
        < names.index("uncaught_exception", names.index("fwd_bwd_error"))
        < names.index("structured_logger_closed")
    )


def test_sigterm_writes_the_queue_and_dies_of_sigterm(run_dir):
    code = (
        _EMIT
        + """
with sl.log_trace_span("data_fetch"):
    print("ready", flush=True)
    time.sleep(60)
"""
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM  # the exit status it would have had
    records = _records_of(run_dir)
    names = [r["log_type_name"] for r in records]
    # the flush interval is 10 s: only the SIGTERM flush wrote these
    assert names.count("fwd_bwd_end") == 200
    assert names[-2:] == ["data_fetch_start", "signal_received"]
    assert records[-1]["signal"] == "SIGTERM"


def test_sigterm_chains_the_users_handler_and_its_exit_status(run_dir, tmp_path):
    marker = tmp_path / "handler-ran"
    code = (
        f"""
import signal, sys
def on_term(signum, frame):
    open({str(marker)!r}, "w").write("yes")
    sys.exit(7)
signal.signal(signal.SIGTERM, on_term)
"""
        + _EMIT
        + """
print("ready", flush=True)
time.sleep(60)
"""
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 7
    assert marker.read_text() == "yes"
    records = _records_of(run_dir)
    names = [r["log_type_name"] for r in records]
    assert names.count("fwd_bwd_end") == 200 and "signal_received" in names
    assert names[-1] == "structured_logger_closed"  # SystemExit → normal exit → closing record


def test_ignored_sigterm_stays_ignored(run_dir):
    code = (
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        + _EMIT
        + """
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
sl.log_trace_instant("still_alive")
"""
    )
    result = run_python(code, str(run_dir))
    assert result.returncode == 0, result.stderr
    names = [r["log_type_name"] for r in _records_of(run_dir)]
    assert "signal_received" in names and "still_alive" in names


def test_fork_child_never_writes_into_the_parents_file(run_dir):
    code = (
        _EMIT
        + """
sl.flush_structured_logger()
pids = []
for how in ("exit", "_exit"):
    pid = os.fork()
    if pid == 0:
        with sl.log_trace_span("in_child"):
            sl.log_trace_instant("child_instant")
        assert not sl.is_initialized()
        if how == "exit":
            sys.exit(0)  # runs atexit hooks: they must not touch the parent's file
        os._exit(0)
    pids.append(pid)
for pid in pids:
    assert os.waitpid(pid, 0)[1] == 0
with sl.log_trace_span("parent_after_fork"):
    pass
"""
    )
    result = run_python(code, str(run_dir), timeout=60)
    assert result.returncode == 0, result.stderr
    records = _records_of(run_dir)  # parses every line: no corruption
    names = [r["log_type_name"] for r in records]
    assert "in_child_start" not in names and "child_instant" not in names
    assert names.count("structured_logger_closed") == 1 and names[-1] == "structured_logger_closed"
    assert names.count("fwd_bwd_end") == 200 and "parent_after_fork_end" in names
    assert {r["pid"] for r in records} == {records[0]["pid"]}


def test_fork_children_get_the_sigterm_disposition_they_would_have_had(run_dir):
    # A Python-level SIGTERM handler in a forked worker can lose a SIGTERM that lands just
    # before a blocking C call (Pool.terminate() then hung ~1 run in 25): children get the
    # disposition from before init_structured_logger.
    code = """
import os, signal, sys
from otel_titan import structured_logger as sl
for label, before in (("default", signal.SIG_DFL), ("user", lambda s, f: None)):
    signal.signal(signal.SIGTERM, before)
    sl.init_structured_logger("training", sys.argv[1], world_size=1)
    assert signal.getsignal(signal.SIGTERM) is not before  # ours, in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, b"1" if signal.getsignal(signal.SIGTERM) is before else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1", label
    sl.shutdown_structured_logger()
    assert signal.getsignal(signal.SIGTERM) is before  # restored at shutdown too
print("ok")
"""
    result = run_python(code, str(run_dir))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_multiprocessing_fork_pool_children_are_silent_and_nothing_deadlocks(run_dir):
    code = (
        _EMIT
        + """
import multiprocessing as mp

def work(i):
    with sl.log_trace_span("in_worker"):
        return i * i

ctx = mp.get_context("fork")
with ctx.Pool(3) as pool:
    for _ in range(5):
        with sl.log_trace_span("map"):
            assert pool.map(work, range(50)) == [i * i for i in range(50)]
"""
    )
    result = run_python(code, str(run_dir), timeout=120)
    assert result.returncode == 0, result.stderr
    names = [r["log_type_name"] for r in _records_of(run_dir)]
    assert names.count("map_end") == 5 and "in_worker_start" not in names
    assert names[-1] == "structured_logger_closed"


def test_torch_dataloader_workers(run_dir, tmp_path):
    pytest.importorskip("torch")
    code = """
import sys
import threading
import torch
from torch.utils.data import DataLoader, Dataset
from otel_titan import structured_logger as sl

class Data(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        with sl.log_trace_span("getitem"):  # in a worker: a no-op
            return torch.full((4,), float(i))

sl.init_structured_logger("training", sys.argv[1], world_size=1)
loader = DataLoader(Data(), batch_size=8, num_workers=2, multiprocessing_context="fork")
for epoch in range(2):
    it = iter(loader)
    for step in range(8):
        sl.set_step(epoch * 8 + step)
        with sl.log_trace_span("data_fetch"):
            batch = next(it)
        assert batch.shape == (8, 4)
"""
    # TMPDIR: the workers leave multiprocessing's pymp-* folders behind; keep them in the test's
    # tmp.
    result = run_python(code, str(run_dir), timeout=180, env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    names = [r["log_type_name"] for r in _records_of(run_dir)]
    assert names.count("data_fetch_end") == 16 and "getitem_start" not in names
    assert names[-1] == "structured_logger_closed"


# -- SIGTERM wherever the main thread is (item: native calls that never return to Python) ----------
def _start(code, *args, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
        **kwargs,
    )


def _kill_group(process):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _wait_until_main_thread_blocks(pid, timeout=30.0):
    """Until the main thread has been asleep in the kernel for 0.5 s: inside its blocking call, past
    any Python code."""
    deadline = time.monotonic() + timeout
    asleep_since = None
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
        now = time.monotonic()
        if state != b"S":
            asleep_since = None
        elif asleep_since is None:
            asleep_since = now
        elif now - asleep_since >= 0.5:
            return
        time.sleep(0.02)
    raise AssertionError("the main thread never blocked")


_STUCK = {
    # A native call that does not return on a signal, as a collective waiting for a hung peer: a
    # mutex locked twice.
    "native_mutex": "import ctypes\nlibc = ctypes.CDLL(None)\nmutex = ctypes.create_string_buffer(64)\nlibc.pthread_mutex_lock(mutex)\nlibc.pthread_mutex_lock(mutex)\n",
    # SIGTERM blocked in the main thread (native libraries do that): the kernel hands it to another
    # thread.
    "blocked_signal_sleep": "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\ntime.sleep(600)\n",
    "blocked_signal_event_wait": "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\nthreading.Event().wait()\n",
}


@pytest.mark.parametrize("stuck", sorted(_STUCK))
def test_sigterm_kills_a_process_whose_main_thread_is_stuck_in_native_code(run_dir, stuck):
    # Python runs handlers on the main thread between bytecodes: here it never gets there. The
    # watcher thread writes the queue and lets the default action kill the process.
    code = (
        _EMIT
        + "import signal, threading\nwith sl.log_trace_span('collective'):\n    print('ready', flush=True)\n"
        + "".join(f"    {line}\n" for line in _STUCK[stuck].splitlines())
    )
    process = _start(code, str(run_dir))
    try:
        assert process.stdout.readline().strip() == "ready"
        _wait_until_main_thread_blocks(process.pid)
        process.send_signal(signal.SIGTERM)
        # Not a speed check: without the watcher this process would still be blocked in 10 minutes.
        assert process.wait(timeout=30) == -signal.SIGTERM
    finally:
        _kill_group(process)
    records = _records_of(run_dir)
    names = [r["log_type_name"] for r in records]
    # queued behind a 10 s flush interval: the SIGTERM flush wrote them
    assert names.count("fwd_bwd_end") == 200
    assert (
        names[-2:] == ["collective_start", "signal_received"] and records[-1]["signal"] == "SIGTERM"
    )


def test_sigterm_with_the_main_thread_stuck_still_calls_the_earlier_python_handler_once(
    run_dir, tmp_path
):
    # The watcher flushes at once; the user's handler runs where Python would run it (on the main
    # thread when it next runs Python code), once, after the flush, and its exit status wins.
    marker = tmp_path / "handler-ran"
    code = (
        f"""
import signal, sys
def on_term(signum, frame):
    with open({str(marker)!r}, "a") as handle:
        handle.write("ran;")
    sys.exit(7)
signal.signal(signal.SIGTERM, on_term)
"""
        + _EMIT
        + """
print("ready", flush=True)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
while True:
    time.sleep(0.5)
"""
    )
    process = _start(code, str(run_dir))
    try:
        assert process.stdout.readline().strip() == "ready"
        _wait_until_main_thread_blocks(process.pid)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 7
    finally:
        _kill_group(process)
    assert marker.read_text() == "ran;"
    names = [r["log_type_name"] for r in _records_of(run_dir)]
    assert names.count("fwd_bwd_end") == 200 and names.count("signal_received") == 1
    assert names[-1] == "structured_logger_closed"  # SystemExit → normal exit → closing record


def test_ignored_sigterm_is_recorded_while_the_main_thread_is_stuck_and_stays_ignored(run_dir):
    code = (
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        + _EMIT
        + "print('ready', flush=True)\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\ntime.sleep(600)\n"
    )
    process = _start(code, str(run_dir))
    try:
        assert process.stdout.readline().strip() == "ready"
        _wait_until_main_thread_blocks(process.pid)
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        names: list[str] = []
        while time.monotonic() < deadline and "signal_received" not in names:
            time.sleep(0.05)
            names = [r["log_type_name"] for r in _records_of(run_dir)]
        assert names.count("fwd_bwd_end") == 200 and names[-1] == "signal_received"
        time.sleep(0.5)
        assert process.poll() is None  # still alive: the signal stays ignored
    finally:
        _kill_group(process)


@pytest.mark.parametrize(
    "loop_first", [True, False], ids=["asyncio_handlers_before_init", "asyncio_handlers_after_init"]
)
def test_asyncio_signal_handlers_keep_working_and_sigterm_still_kills(run_dir, loop_first):
    # asyncio's add_signal_handler has its own wakeup fd: set before ours, every byte is forwarded
    # to it; set after ours, it wins, and our handler runs on the (woken) main thread instead.
    code = f"""
import asyncio, os, signal, sys
from otel_titan import structured_logger as sl

def init():
    sl.init_structured_logger("training", sys.argv[1], world_size=1, flush_interval_s=10)

async def main():
    loop = asyncio.get_running_loop()
    got = asyncio.Event()
    if {loop_first}:
        loop.add_signal_handler(signal.SIGUSR1, got.set)
        init()
    else:
        init()
        loop.add_signal_handler(signal.SIGUSR1, got.set)
    for _ in range(100):
        with sl.log_trace_span("fwd_bwd"):
            pass
    os.kill(os.getpid(), signal.SIGUSR1)
    await asyncio.wait_for(got.wait(), 30)
    sl.log_trace_instant("usr1_handled")
    with sl.log_trace_span("serving"):
        print("ready", flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""
    process = _start(code, str(run_dir))
    try:
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == -signal.SIGTERM
    finally:
        _kill_group(process)
    names = [r["log_type_name"] for r in _records_of(run_dir)]
    assert names.count("fwd_bwd_end") == 100 and "usr1_handled" in names
    assert names[-2:] == ["serving_start", "signal_received"]


def _current_wakeup_fd():
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def _signal_threads():
    return [t for t in threading.enumerate() if t.name == "otel-titan-signals"]


def test_shutdown_gives_back_the_sigterm_handler_and_wakeup_fd_and_reinit_takes_them_again(run_dir):
    read, write = os.pipe()
    os.set_blocking(write, False)

    def mine(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, mine)
    previous_fd = signal.set_wakeup_fd(write)
    try:
        for _ in range(2):
            sl.init_structured_logger("training", run_dir, world_size=1)
            assert signal.getsignal(signal.SIGTERM) is not mine and _current_wakeup_fd() not in (
                -1,
                write,
            )
            assert len(_signal_threads()) == 1
            # The wakeup fd set before ours still gets the signal numbers: forwarded by the watcher.
            signal.signal(signal.SIGUSR1, lambda s, f: None)
            os.kill(os.getpid(), signal.SIGUSR1)
            assert select_readable(read, 10) and os.read(read, 16) == bytes([signal.SIGUSR1])
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            assert sl.shutdown_structured_logger()
            assert (
                signal.getsignal(signal.SIGTERM) is mine
                and _current_wakeup_fd() == write
                and _signal_threads() == []
            )
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, before)
        os.close(read)
        os.close(write)


def select_readable(fd, timeout):
    import select

    return bool(select.select([fd], [], [], timeout)[0])


def test_a_fork_childs_own_sigterm_never_reaches_the_parents_watcher(run_dir):
    # The child inherits the pipe behind the parent's wakeup fd; a signal the child handles in
    # Python must not wake the parent's watcher (which would flush, then kill the parent).
    code = (
        _EMIT
        + """
import signal
sl.flush_structured_logger()
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, lambda s, f: None)  # a Python handler: Python writes its wakeup fd
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
time.sleep(0.5)
sl.log_trace_instant("parent_still_alive")
"""
    )
    result = run_python(code, str(run_dir))
    assert result.returncode == 0, result.stderr
    names = [r["log_type_name"] for r in _records_of(run_dir)]
    assert (
        "signal_received" not in names
        and "parent_still_alive" in names
        and names[-1] == "structured_logger_closed"
    )


# -- multiprocessing and DataLoader workers that start their own logger ----------------------------
def _run_script(tmp_path, text, *args, timeout=240):
    """Run `text` as a script file (spawn and forkserver workers import it), killing its whole group
    on a timeout."""
    script = tmp_path / "script.py"
    script.write_text(text)
    process = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)},
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        _kill_group(process)
    return process.returncode, out, err


def _files_by_rank(run_dir):
    by_rank: dict[int, list[list[dict]]] = {}
    for path in jsonl_files(run_dir):
        # SIGTERM's black box
        records = [r for r in read_records(path) if r["log_type_name"] != "stall"]
        by_rank.setdefault(records[0]["rank"], []).append(records)
    return by_rank


_MP_WORKERS = """
import multiprocessing as mp
import os, sys
from otel_titan import structured_logger as sl

def init(out, rank):
    # flush_interval_s=10: only the exit path can write these records
    sl.init_structured_logger("worker", out, rank=rank, world_size=64, flush_interval_s=10)

def spans(n):
    for _ in range(n):
        with sl.log_trace_span("work"):
            pass
    return n

def process_target(out, rank):
    init(out, rank)
    spans(100)

def pool_init(out, base, counter, barrier):
    with counter.get_lock():
        counter.value += 1
        rank = base + counter.value
    init(out, rank)
    barrier.wait()  # both workers have a logger before any task runs: the ranks are known

if __name__ == "__main__":
    method, out = sys.argv[1], sys.argv[2]
    ctx = mp.get_context(method)
    process = ctx.Process(target=process_target, args=(out, 0))
    process.start()
    process.join()
    assert process.exitcode == 0, process.exitcode
    pool = ctx.Pool(2, initializer=pool_init, initargs=(out, 10, ctx.Value("i", 0), ctx.Barrier(2)))
    assert sum(pool.map(spans, [50] * 4, chunksize=1)) == 200
    pool.close()  # the workers get a sentinel and return: a normal end
    pool.join()
    with ctx.Pool(2, initializer=pool_init, initargs=(out, 20, ctx.Value("i", 0), ctx.Barrier(2))) as pool:
        assert sum(pool.map(spans, [50] * 4, chunksize=1)) == 200
    # leaving `with` calls terminate(): idle workers get SIGTERM
    print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_multiprocessing_workers_that_start_a_logger_write_everything_and_close(
    run_dir, tmp_path, method
):
    # fork and forkserver children end with os._exit (no atexit): their records used to stay queued.
    returncode, out, err = _run_script(tmp_path, _MP_WORKERS, method, str(run_dir))
    assert returncode == 0 and out.strip() == "done", err
    by_rank = _files_by_rank(run_dir)
    assert sorted(by_rank) == [0, 11, 12, 21, 22], sorted(by_rank)
    (process_file,) = by_rank[0]
    names = [r["log_type_name"] for r in process_file]
    assert (
        names.count("work_end") == 100
        and names[-1] == "structured_logger_closed"
        and process_file[-1]["written_records"] == 200
    )
    closed = [records for rank in (11, 12) for records in by_rank[rank]]
    assert all(records[-1]["log_type_name"] == "structured_logger_closed" for records in closed)
    assert sum(r["log_type_name"] == "work_end" for records in closed for r in records) == 200
    # terminate(): every record, then either the closing record (a worker that took its
    # sentinel first) or signal_received (killed by SIGTERM, the queue written first).
    terminated = [records for rank in (21, 22) for records in by_rank[rank]]
    assert {records[-1]["log_type_name"] for records in terminated} <= {
        "structured_logger_closed",
        "signal_received",
    }, [r[-1] for r in terminated]
    assert sum(r["log_type_name"] == "work_end" for records in terminated for r in records) == 200


_DATALOADER = """
import sys
import threading
import torch
from torch.utils.data import DataLoader, Dataset
from otel_titan import structured_logger as sl

class Data(Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        with sl.log_trace_span("getitem"):
            return torch.full((4,), float(i))

class InitWorker:  # a class, not a lambda: spawn and forkserver pickle it
    def __init__(self, out, base):
        self.out, self.base = out, base
    def __call__(self, worker_id):
        sl.init_structured_logger("dataloader", self.out, rank=self.base + worker_id, world_size=64, flush_interval_s=10)

def loader(method, out, base, persistent):
    return DataLoader(Data(), batch_size=4, num_workers=2, worker_init_fn=InitWorker(out, base), persistent_workers=persistent, multiprocessing_context=method)

def two_epochs(data):
    for _ in range(2):
        assert sum(batch.shape[0] for batch in data) == 32

if __name__ == "__main__":
    method, out = sys.argv[1], sys.argv[2]
    two_epochs(loader(method, out, 0, False))   # new workers every epoch
    two_epochs(loader(method, out, 10, True))   # persistent workers, shut down with their loader
    KEPT = loader(method, out, 20, True)        # persistent workers still alive at interpreter exit
    two_epochs(KEPT)
    print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_dataloader_workers_that_start_a_logger_in_worker_init_fn_write_everything(
    run_dir, tmp_path, method
):
    pytest.importorskip("torch")
    returncode, out, err = _run_script(tmp_path, _DATALOADER, method, str(run_dir))
    assert returncode == 0 and out.strip() == "done", err
    by_rank = _files_by_rank(run_dir)
    assert sorted(by_rank) == [0, 1, 10, 11, 20, 21], sorted(by_rank)
    # a file per worker start
    assert [len(by_rank[rank]) for rank in (0, 1, 10, 11, 20, 21)] == [
        2,
        2,
        1,
        1,
        1,
        1,
    ]

    def getitems(ranks):
        return sum(
            r["log_type_name"] == "getitem_end"
            for rank in ranks
            for records in by_rank[rank]
            for r in records
        )

    for ranks in ((0, 1), (10, 11), (20, 21)):
        # 2 epochs x 32 items: every record, whichever worker had it
        assert getitems(ranks) == 64, ranks
    # Workers shut down by their loader end normally, with the closing record.
    assert all(
        records[-1]["log_type_name"] == "structured_logger_closed"
        for rank in (0, 1, 10, 11)
        for records in by_rank[rank]
    )
    # Workers still alive at exit are terminated by multiprocessing (SIGTERM): the queue is written
    # first.
    assert all(
        records[-1]["log_type_name"] == "signal_received"
        for rank in (20, 21)
        for records in by_rank[rank]
    )

"""init / flush / shutdown: strictness, prompt writes, and what happens at exit, SIGTERM and fork."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from otel_titan import structured_logger as sl
from tests.conftest import REPO, data_records, jsonl_files, read_records, run_python


def processor_threads():
    return [t for t in threading.enumerate() if t.name == "otel-titan-processor"]


# -- strict init ------------------------------------------------------------------------------------
def test_unwritable_output_dir_fails_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match="file"):
        sl.init_structured_logger("training", blocker / "run", world_size=1)
    assert not sl.is_initialized() and processor_threads() == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_output_dir_fails(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(OSError):
            sl.init_structured_logger("training", tmp_path / "run", world_size=1)
    finally:
        tmp_path.chmod(0o700)


def test_unknown_and_bad_options_fail_before_anything_is_created(run_dir):
    with pytest.raises(TypeError, match="did you mean 'backup_count'"):
        sl.init_structured_logger("training", run_dir, backup_cnt=3)
    with pytest.raises(ValueError, match="max_file_size_mb"):
        sl.init_structured_logger("training", run_dir, max_file_size_mb=0)
    with pytest.raises(TypeError, match="queue_size"):
        sl.init_structured_logger("training", run_dir, queue_size="big")
    with pytest.raises(TypeError, match="rank"):
        sl.init_structured_logger("training", run_dir, rank="0")
    assert not run_dir.exists()


@pytest.mark.parametrize("source", ["../escape", "a/b", "", ".hidden", "x\x00y", "a\\b", "-x"])
def test_source_that_is_not_a_safe_file_name_is_refused(run_dir, source):
    with pytest.raises(ValueError, match="source"):
        sl.init_structured_logger(source, run_dir)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_module_xyz.register", "cannot import module 'no_such_module_xyz'"),
        ("tests.helpers.factories.missing", "has no attribute 'missing'"),
        ("tests.helpers.factories.NOT_CALLABLE", "not a callable"),
        ("tests.helpers.factories.register_raising", "raised RuntimeError: factory exploded"),
        ("tests.helpers.factories.register_nothing", "registered no exporter"),
        ("justaname", "fully-qualified"),
    ],
)
def test_broken_handler_factory_fails_init_and_leaves_nothing_attached(run_dir, monkeypatch, spec, message):
    monkeypatch.setenv("TITAN_STRUCT_LOGGER_HANDLERS", f"otel_titan.exporters.jsonl.register_jsonl_handler,{spec}")
    with pytest.raises(sl.HandlerFactoryError, match=message):
        sl.init_structured_logger("training", run_dir, world_size=1)
    assert not sl.is_initialized() and processor_threads() == []
    assert jsonl_files(run_dir) == []  # the JSONL file opened by the first factory is removed again
    with sl.log_trace_span("still_a_no_op"):
        pass
    # ...and a correct init afterwards works.
    monkeypatch.delenv("TITAN_STRUCT_LOGGER_HANDLERS")
    sl.init_structured_logger("training", run_dir, world_size=1)
    assert sl.is_initialized()


def test_second_init_is_refused_until_shutdown(run_dir):
    sl.init_structured_logger("training", run_dir, world_size=1)
    with pytest.raises(RuntimeError, match="already"):
        sl.init_structured_logger("training", run_dir, world_size=1)
    assert sl.shutdown_structured_logger()
    sl.init_structured_logger("training", run_dir, world_size=1)
    assert len(jsonl_files(run_dir)) == 2  # two processes' worth of files, one per init


def test_file_name_follows_the_torchtitan_rule(run_dir):
    sl.init_structured_logger("rollouter", run_dir, rank=3, world_size=8)
    (path,) = jsonl_files(run_dir)
    import re

    assert re.fullmatch(r"rollouter\.global_rank_3\.\d{8}-\d{6}-[a-z0-9]{6}\.jsonl", os.path.basename(path))
    assert (os.stat(path).st_mode & 0o002) == 0  # never world-writable


# -- flushing -----------------------------------------------------------------------------------------
def test_start_record_reaches_the_file_while_the_span_is_still_open(run_dir):
    sl.init_structured_logger("training", run_dir, world_size=1)
    (path,) = jsonl_files(run_dir)
    with sl.log_trace_span("data_fetch"):
        deadline = time.monotonic() + 30  # generous: the machine may be busy; typically ~0.1 s
        names: list[str] = []
        while time.monotonic() < deadline and "data_fetch_start" not in names:
            time.sleep(0.02)
            with open(path) as handle:
                names = [json.loads(line)["log_type_name"] for line in handle]
        assert "data_fetch_start" in names and "data_fetch_end" not in names  # no flush call was made


def test_flush_writes_everything_captured_before_it(run_dir):
    sl.init_structured_logger("training", run_dir, world_size=1, flush_interval_s=10)
    for i in range(500):
        sl.log_trace_instant(f"i{i}")
    assert sl.flush_structured_logger(timeout=10)
    names = [r["log_type_name"] for r in data_records(read_records(jsonl_files(run_dir)[0]))]
    assert names == [f"i{i}" for i in range(500)]


def test_closing_record_has_totals(run_dir):
    sl.init_structured_logger("training", run_dir, world_size=1)
    for _ in range(3):
        with sl.log_trace_span("s"):
            pass
    sl.log_trace_scalar({"a": 1, "b": 2})
    sl.shutdown_structured_logger()
    records = read_records(jsonl_files(run_dir)[0])
    assert records[0]["log_type_name"] == "structured_logger_opened"
    closing = records[-1]
    assert closing["log_type_name"] == "structured_logger_closed" and closing["closing"] is True
    assert (closing["written_records"], closing["dropped_records"], closing["failed_records"]) == (8, 0, 0)


# -- drops ----------------------------------------------------------------------------------------------
def test_full_queue_drops_counts_and_reports_without_blocking(run_dir):
    from tests.helpers import factories

    # The writer is stuck (a gate exporter, closed), so the queue fills.
    factories.GATE.clear()
    sl.init_structured_logger("training", run_dir, world_size=1, queue_size=50, handlers=["tests.helpers.factories.register_gate", "otel_titan.exporters.jsonl.register_jsonl_handler"])
    for i in range(200):
        sl.log_trace_instant(f"i{i}")  # returns at once even though nothing is written
    sl.log_trace_scalar({"a": 1.0, "b": 2.0})
    factories.GATE.set()
    assert sl.flush_structured_logger(timeout=10)
    sl.log_trace_instant("after")
    sl.shutdown_structured_logger()
    records = read_records(jsonl_files(run_dir)[0])
    names = [r["log_type_name"] for r in records]
    kept = [n for n in names if n.startswith("i")]
    assert 50 <= len(kept) < 200 and kept == [f"i{i}" for i in range(len(kept))]  # a prefix, in order, no gap
    closing = records[-1]
    dropped = [r for r in records if r["log_type_name"] == "records_dropped"]
    assert len(dropped) == 1 and dropped[0]["dropped_records"] == closing["dropped_records"] == dropped[0]["value"] > 0
    assert names.index("records_dropped") < names.index("after")
    written_scalars = names.count("metric_value")
    assert closing["written_records"] == len(kept) + written_scalars + 1
    assert closing["written_records"] + closing["dropped_records"] == 203  # every emitted record accounted for


# -- process events (real interpreters) ----------------------------------------------------------------
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
    (path,) = jsonl_files(run_dir)
    return read_records(path)


def test_interpreter_exit_writes_everything_and_the_closing_record(run_dir):
    result = run_python(_EMIT + "print('bye')\n", str(run_dir))
    assert result.returncode == 0, result.stderr
    records = _records_of(run_dir)
    assert len([r for r in records if r["log_type_name"] == "fwd_bwd_end"]) == 200
    assert records[-1]["log_type_name"] == "structured_logger_closed" and records[-1]["written_records"] == 400


def test_sigterm_writes_the_queue_and_dies_of_sigterm(run_dir):
    code = _EMIT + """
with sl.log_trace_span("data_fetch"):
    print("ready", flush=True)
    time.sleep(60)
"""
    process = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM  # the exit status it would have had
    records = _records_of(run_dir)
    names = [r["log_type_name"] for r in records]
    assert names.count("fwd_bwd_end") == 200  # the flush interval is 10 s: only the SIGTERM flush wrote these
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
    process = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
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
    code = _EMIT + """
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
    code = _EMIT + """
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
    result = run_python(code, str(run_dir), timeout=120)
    assert result.returncode == 0, result.stderr
    names = [r["log_type_name"] for r in _records_of(run_dir)]
    assert names.count("map_end") == 5 and "in_worker_start" not in names
    assert names[-1] == "structured_logger_closed"


def test_torch_dataloader_workers(run_dir, tmp_path):
    pytest.importorskip("torch")
    code = """
import sys
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
    # TMPDIR: the workers leave multiprocessing's pymp-* folders behind; keep them in the test's tmp.
    result = run_python(code, str(run_dir), timeout=180, env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    names = [r["log_type_name"] for r in _records_of(run_dir)]
    assert names.count("data_fetch_end") == 16 and "getitem_start" not in names
    assert names[-1] == "structured_logger_closed"

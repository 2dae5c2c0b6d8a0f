"""init / flush / shutdown: strictness, prompt writes, drops (lifecycle.py, validation.py,
handler_factories.py)."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time

import pytest

from otel_titan import structured_logger as sl
from tests.conftest import data_records, jsonl_files, read_records, run_python


def processor_threads():
    return [t for t in threading.enumerate() if t.name == "otel-titan-processor"]


# -- strict init -----------------------------------------------------------------------------------
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
        ("justaname", "fully-qualified"),
    ],
)
def test_broken_handler_factory_fails_init_and_leaves_nothing_attached(
    run_dir, monkeypatch, spec, message
):
    monkeypatch.setenv(
        "TITAN_STRUCT_LOGGER_HANDLERS", f"otel_titan.exporters.jsonl.register_jsonl_handler,{spec}"
    )
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


def test_source_limits_are_in_bytes_and_checked_before_anything_is_created(run_dir):
    # 100 CJK characters pass a 128-character rule but are 300 bytes: the file name would not fit.
    with pytest.raises(
        ValueError, match=r"300 bytes in UTF-8 \(100 characters\).*at most 128 bytes"
    ):
        sl.init_structured_logger("训" * 100, run_dir, world_size=1)
    assert not run_dir.exists()
    sl.init_structured_logger("训" * 42, run_dir, world_size=1)  # 126 bytes: fine
    (path,) = jsonl_files(run_dir)
    assert os.path.basename(path).startswith("训" * 42 + ".global_rank_0.")


def test_a_file_path_too_long_for_the_filesystem_is_refused_at_init_naming_it(tmp_path):
    # The whole path counts, not just the source: an output_dir 4,000 bytes deep leaves no room for
    # the name.
    deep = str(tmp_path)
    while len(deep) < 4040 - 251:
        deep += "/" + "d" * 250
    # 4,040 bytes: its structured_logs/ can still be created
    deep += "/" + "e" * (4040 - len(deep) - 1)
    with pytest.raises(
        sl.HandlerFactoryError,
        match=r"JSONL file path .* would be \d+ bytes, more than the 4095 a path can have: use a shorter output_dir",
    ):
        sl.init_structured_logger("training", deep, world_size=1)
    assert not sl.is_initialized() and list(tmp_path.rglob("*.jsonl")) == []


def test_second_init_with_the_same_arguments_is_a_no_op(run_dir, monkeypatch):
    # torchtitan code may call init from more than one place: the repeat changes nothing.
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1, backup_count=5)
    sl.log_trace_instant("first")
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1, backup_count=5)
    # a subset: what is left out agrees with anything
    sl.init_structured_logger("training", str(run_dir))
    monkeypatch.chdir(run_dir.parent)
    # the same directory, relative
    sl.init_structured_logger("training", run_dir.name, world_size=1)
    sl.log_trace_instant("second")
    assert sl.is_initialized()
    assert sl.shutdown_structured_logger()
    (path,) = jsonl_files(run_dir)  # one file: no second logger was started
    assert [r["log_type_name"] for r in data_records(read_records(path))] == ["first", "second"]
    sl.init_structured_logger("training", run_dir, world_size=1)  # after shutdown, a new start
    assert len(jsonl_files(run_dir)) == 2


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"source": "rollouter"}, "source 'rollouter' (running: 'training')"),
        ({"output_dir": "OTHER"}, "output_dir '"),
        ({"rank": 1}, "rank 1 (running: 0)"),
        ({"world_size": 2}, "world_size=2 (running: 1)"),
        ({"backup_count": 7}, "backup_count=7 (running: 3)"),
        ({"enable": False}, "enable=False"),
    ],
)
def test_second_init_with_other_arguments_is_a_no_op_that_warns_naming_the_difference(
    run_dir, tmp_path, kwargs, named, caplog
):
    # As in torchtitan (its test_second_call_is_noop): a second call never raises; ours also says
    # what it ignored.
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1)
    call = {"source": "training", "output_dir": run_dir, "rank": 0, **kwargs}
    if call["output_dir"] == "OTHER":
        call["output_dir"] = tmp_path / "other"
    with caplog.at_level(logging.WARNING, logger="otel_titan"):
        sl.init_structured_logger(**call)
        sl.init_structured_logger(**call)  # the same call again: warned once
    warnings = [r.getMessage() for r in caplog.records if "already running" in r.getMessage()]
    assert len(warnings) == 1 and re.search("does nothing: .*" + re.escape(named), warnings[0]), (
        warnings
    )
    assert sl.is_initialized()  # the running logger is untouched
    sl.log_trace_instant("still_logging")
    sl.shutdown_structured_logger()
    (path,) = jsonl_files(run_dir)
    assert [r["log_type_name"] for r in data_records(read_records(path))] == ["still_logging"]
    assert not (tmp_path / "other").exists()


def test_file_name_follows_the_torchtitan_rule(run_dir):
    sl.init_structured_logger("rollouter", run_dir, rank=3, world_size=8)
    (path,) = jsonl_files(run_dir)
    assert re.fullmatch(
        r"rollouter\.global_rank_3\.\d{8}-\d{6}-[a-z0-9]{6}\.jsonl", os.path.basename(path)
    )
    assert (os.stat(path).st_mode & 0o002) == 0  # never world-writable


def test_the_opened_record_is_on_disk_when_init_returns(run_dir):
    # Written synchronously, by init itself: no flush, and the writer's next tick is 10 s away. A
    # file holding only this record is a rank that has recorded nothing since; an empty file never
    # is.
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1, flush_interval_s=10)
    (path,) = jsonl_files(run_dir)
    records = read_records(path)
    assert [r["log_type_name"] for r in records] == ["structured_logger_opened"]
    assert records[0]["seq_id"] == 1 and records[0]["rank"] == 0
    sl.log_trace_instant("later")
    sl.shutdown_structured_logger()
    names = [r["log_type_name"] for r in read_records(path)]
    # written once
    assert names == [
        "structured_logger_opened",
        "later",
        "structured_logger_closed",
    ]


def test_relative_output_dir_is_resolved_once_so_a_chdir_does_not_split_the_run(tmp_path):
    # Hydra changes the working directory after the program started; the run must stay one file.
    code = """
import os, sys
from otel_titan import structured_logger as sl
paths = []
def register(output_dir, **kw):
    paths.append(output_dir)
    from otel_titan.exporters.jsonl import register_jsonl_handler
    register_jsonl_handler(output_dir=output_dir, **kw)
sl.init_structured_logger("training", "outputs", rank=0, world_size=1, handlers=[register])
sl.log_trace_instant("before_chdir")
sl.flush_structured_logger()
os.mkdir("hydra_run")
os.chdir("hydra_run")
for i in range(3):
    sl.log_trace_instant(f"after_chdir_{i}")
    sl.flush_structured_logger()  # one batch each: the writer re-checks its file before every batch
print(paths[0])
"""
    result = run_python(code, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    # factories get the absolute directory
    assert result.stdout.strip() == str(tmp_path / "outputs")
    assert list((tmp_path / "hydra_run").iterdir()) == []
    (path,) = jsonl_files(tmp_path / "outputs")
    names = [r["log_type_name"] for r in read_records(path)]
    assert names == [
        "structured_logger_opened",
        "before_chdir",
        "after_chdir_0",
        "after_chdir_1",
        "after_chdir_2",
        "structured_logger_closed",
    ]


# -- flushing --------------------------------------------------------------------------------------
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
        # no flush call was made
        assert "data_fetch_start" in names and "data_fetch_end" not in names


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
    assert (closing["written_records"], closing["dropped_records"], closing["failed_records"]) == (
        8,
        0,
        0,
    )


# -- drops -----------------------------------------------------------------------------------------
def test_full_queue_drops_counts_and_reports_without_blocking(run_dir):
    from tests.helpers import factories

    # The writer is stuck (a gate exporter, closed), so the queue fills.
    factories.GATE.clear()
    sl.init_structured_logger(
        "training",
        run_dir,
        world_size=1,
        queue_size=50,
        handlers=[
            "tests.helpers.factories.register_gate",
            "otel_titan.exporters.jsonl.register_jsonl_handler",
        ],
    )
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
    # a prefix, in order, no gap
    assert 50 <= len(kept) < 200 and kept == [f"i{i}" for i in range(len(kept))]
    closing = records[-1]
    dropped = [r for r in records if r["log_type_name"] == "records_dropped"]
    assert (
        len(dropped) == 1
        and dropped[0]["dropped_records"] == closing["dropped_records"] == dropped[0]["value"] > 0
    )
    assert names.index("records_dropped") < names.index("after")
    written_scalars = names.count("metric_value")
    assert closing["written_records"] == len(kept) + written_scalars + 1
    # every emitted record accounted for
    assert closing["written_records"] + closing["dropped_records"] == 203


def test_trace_group_size_groups_ranks_into_step_traces_and_names_the_group_in_the_resource(
    tmp_path, monkeypatch
):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_titan import structured_logger as sl
    from otel_titan.core.trace_ids import StepTraceIds

    def step_span(rank: int, **options) -> object:
        memory = InMemorySpanExporter()
        sl.init_structured_logger(
            "training",
            tmp_path,
            rank=rank,
            world_size=16,
            run_id="groups",
            handlers=[lambda add_span_exporter, **_: add_span_exporter(memory)],
            **options,
        )
        sl.set_step(5)
        with sl.log_trace_span("fwd_bwd"):
            pass
        sl.shutdown_structured_logger()
        (span,) = memory.get_finished_spans()
        return span

    four = step_span(5, trace_group_size=4)
    assert four.resource.attributes["titan.trace_group"] == 1
    assert (
        four.context.trace_id
        == StepTraceIds("groups", 0, 1).for_step(5)
        == step_span(7, trace_group_size=4).context.trace_id
    )
    assert four.context.trace_id != step_span(8, trace_group_size=4).context.trace_id
    monkeypatch.setenv("OTEL_TITAN_TRACE_GROUP_SIZE", "0")
    everyone = step_span(5)
    assert "titan.trace_group" not in everyone.resource.attributes
    assert (
        everyone.context.trace_id
        == StepTraceIds("groups", 0).for_step(5)
        == step_span(15).context.trace_id
    )


def test_init_shares_the_run_with_processes_started_later_and_shutdown_takes_it_back(
    tmp_path, monkeypatch
):
    for name in (
        "OTEL_TITAN_RUN_ID",
        "OTEL_TITAN_PROCESS_RUN_ID",
        "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID",
        "RAY_JOB_ID",
    ):
        monkeypatch.delenv(name, raising=False)
    sl.init_structured_logger("controller", tmp_path / "a", rank=0, world_size=1)
    identity = sl.get_run_identity()
    assert (
        identity.run_id is None
        and os.environ["OTEL_TITAN_PROCESS_RUN_ID"] == identity.process_run_id
    )
    assert "OTEL_TITAN_RUN_ID" not in os.environ
    sl.shutdown_structured_logger()
    assert "OTEL_TITAN_PROCESS_RUN_ID" not in os.environ  # a later init here is not anyone's child
    (first,) = [read_records(p)[0] for p in jsonl_files(tmp_path / "a")]
    assert first["run_id"] is None and first["process_run_id"] == identity.process_run_id
    sl.init_structured_logger("controller", tmp_path / "b", rank=0, world_size=1, run_id="given")
    assert (
        os.environ["OTEL_TITAN_RUN_ID"] == "given" and "OTEL_TITAN_PROCESS_RUN_ID" not in os.environ
    )
    sl.shutdown_structured_logger()
    assert "OTEL_TITAN_RUN_ID" not in os.environ
    (first,) = [read_records(p)[0] for p in jsonl_files(tmp_path / "b")]
    assert first["run_id"] == "given" and "process_run_id" not in first

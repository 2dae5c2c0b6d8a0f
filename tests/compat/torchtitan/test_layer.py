"""`otel_titan.compat.torchtitan`: torchtitan code runs unchanged on otel-titan (issue 28 items 2
and 3).

Code written for torchtitan runs in a fresh interpreter after `install()`, as
a user's script would, once with the real torchtitan installed (this venv has
torchtitan 0.3.0, for tests/exporters/test_torchtitan_gantt.py) and once
without it on the path. torchtitan's own Gantt generator is compared with the
layer's on files our writer produced.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import pytest

from otel_titan import structured_logger as sl
from otel_titan.compat.torchtitan.observability.structured_logger import gantt_generator
from otel_titan.compat.torchtitan.observability.structured_logger.jsonl_handler import (
    TraceJsonlHandler,
    register_jsonl_handler,
)
from tests.conftest import jsonl_files, read_records, run_python

TORCHTITAN_SCRIPT = """
import json, logging, os, sys
import otel_titan.compat.torchtitan
otel_titan.compat.torchtitan.install()

from torchtitan.observability import structured_logger as sl                      # torchtitan's code from here on
from torchtitan.observability.structured_logger.jsonl_handler import TraceJsonlFormatter
from torchtitan.observability.structured_logger.structured_logging import TraceEventsOnlyFilter

rows = []
class DBHandler(logging.Handler):                   # torchtitan's README pattern: a database on rank 0
    def emit(self, record):
        rows.append(self.format(record))

def register_db(*, structured_logger, rank, source, output_dir, **kw):
    if rank == 0:
        handler = DBHandler()
        handler.setFormatter(TraceJsonlFormatter(rank=rank, source=source))
        handler.addFilter(TraceEventsOnlyFilter())
        structured_logger.addHandler(handler)

sys.modules["__main__"].register_db = register_db
later = []
class Later(logging.Handler):
    def emit(self, record):
        later.append(record.log_type_name)

sl.init_structured_logger(source="training", output_dir=sys.argv[1], rank=int(sys.argv[2]))
sl.init_structured_logger(source="other_actor", output_dir=sys.argv[1])            # torchtitan: a no-op
logging.getLogger("torchtitan.structured_logger").addHandler(Later())
for step in (1, 2):
    sl.set_step(step)
    with sl.log_trace_span("fwd_bwd"):
        sl.log_trace_scalar({"loss": 2.5})
from otel_titan import structured_logger as ot
ot.shutdown_structured_logger()
import torchtitan.observability.structured_logger.step_state as step_state    # the plain import form: the real parent package
import torchtitan
print(json.dumps({"rows": [json.loads(r)["log_type_name"] for r in rows], "later": later, "torchtitan": torchtitan.__file__,
                  "ours": step_state.set_step is sl.set_step and torchtitan.observability is sys.modules["torchtitan.observability"]}))
"""

FACTORIES = "torchtitan.observability.structured_logger.jsonl_handler.register_jsonl_handler,__main__.register_db"


@pytest.mark.parametrize("rank", [0, 1])
def test_torchtitan_code_with_its_handler_factories_runs_unchanged(tmp_path, rank):
    run = tmp_path / "run"
    result = run_python(
        TORCHTITAN_SCRIPT,
        str(run),
        str(rank),
        env={"TITAN_STRUCT_LOGGER_HANDLERS": FACTORIES, "OTEL_TITAN_PROCESS_FIGURES": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    program = ["fwd_bwd_start", "metric_value", "fwd_bwd_end"] * 2
    # the rank-0 handler; rank 1 runs without it
    assert out["rows"] == (program if rank == 0 else [])
    assert out["later"] == program  # a handler attached by name, after init
    # the real torchtitan package, its structured logger ours
    assert "site-packages" in out["torchtitan"] and out["ours"]
    # torchtitan's default factory: otel-titan's own file, one (the second init did nothing)
    (path,) = jsonl_files(run)
    assert f"training.global_rank_{rank}." in path
    names = [r["log_type_name"] for r in read_records(path)]
    assert names[0] == "structured_logger_opened" and names[-1] == "structured_logger_closed"
    assert names.count("fwd_bwd_start") == 2


def test_install_without_torchtitan_installed_gives_torchtitans_import_path_only(tmp_path):
    # A venv without torchtitan: its import path exists after install(), the rest of torchtitan does
    # not.
    code = """
    import importlib.util, sys
    real_find_spec = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a: None if name == "torchtitan" else real_find_spec(name, *a)
    sys.path = [p for p in sys.path if "site-packages" not in p or importlib.util.find_spec("torchtitan") is None]
    import otel_titan.compat.torchtitan as compat
    compat.install()
    import torchtitan.observability.structured_logger as sl
    from torchtitan.observability.structured_logger.gantt_generator import generate_gantt_trace
    assert sl.log_trace_span.__module__ == "otel_titan.core.capture"
    try:
        import torchtitan.models
    except ModuleNotFoundError:
        print("no models")
    compat.uninstall()
    assert "torchtitan.observability.structured_logger" not in sys.modules and "torchtitan" not in sys.modules
    print("ok")
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["no", "models", "ok"]


def test_register_jsonl_handler_called_the_torchtitan_way_attaches_torchtitans_file_handler(
    tmp_path,
):
    logger = logging.getLogger("tests.compat.register_jsonl_handler")
    register_jsonl_handler(
        structured_logger=logger, rank=2, source="test_src", output_dir=str(tmp_path)
    )
    (handler,) = logger.handlers
    try:
        assert isinstance(handler, TraceJsonlHandler) and "structured_logs" in handler.baseFilename
        assert "test_src.global_rank_2." in handler.baseFilename and handler.baseFilename.endswith(
            ".jsonl"
        )
        record = logging.LogRecord(logger.name, logging.INFO, __file__, 1, "", None, None)
        record.log_type_name = "marker"
        handler.handle(record)
        handler.flush()
        (line,) = open(handler.baseFilename).read().splitlines()
        assert json.loads(line)["log_type_name"] == "marker" and json.loads(line)["rank"] == 2
    finally:
        logger.removeHandler(handler)
        handler.close()


def _a_run_with_the_loggers_own_records(run_dir) -> None:
    sl.init_structured_logger(
        "training",
        run_dir,
        rank=0,
        world_size=1,
        process_figures=True,
        step_rollups=True,
        heartbeat_interval_s=0.05,
    )
    sl.log_trace_instant("training_start")
    for step in (1, 2, 3):
        sl.set_step(step)
        with sl.log_trace_span("fwd_bwd"):
            sl.log_trace_scalar({"loss": 2.5})
            # heartbeats, and the writer's period passes: figures and rollups of every step
            time.sleep(0.12)
    sl.log_trace_scalar({"loss": float("nan")})
    sl.shutdown_structured_logger()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="torchtitan 0.3.0 needs Python >= 3.11")
def test_torchtitans_gantt_view_of_our_files_has_the_programs_records_only(run_dir):
    # Issue 28 item 3: torchtitan's own generator shows our figures, rollups and heartbeats as the
    # user's instants.
    from torchtitan.observability.structured_logger.gantt_generator import (
        generate_gantt_trace as titans,
    )

    _a_run_with_the_loggers_own_records(run_dir)
    records = read_records(jsonl_files(run_dir)[0])
    assert {"heartbeat", "step_rollup"} <= {r["log_type_name"] for r in records}
    assert any(str(r.get("event_name")).startswith("memory/") for r in records)
    logs = str(run_dir / "structured_logs")

    ours = gantt_generator.generate_gantt_trace(logs, str(run_dir / "ours.json"))
    instants = [e["name"] for e in ours["traceEvents"] if e["ph"] == "i"]
    assert instants == ["training_start", "loss=2.5000", "loss=2.5000", "loss=2.5000", "loss=NaN"]
    assert json.loads((run_dir / "ours.json").read_text()) == ours

    # torchtitan's own generator on the same files, without the NaN (it cannot format it) and the
    # logger's records: the same trace, event for event.
    for path in jsonl_files(run_dir):
        kept = [line for line in open(path) if "NaN" not in line]
        open(path, "w").writelines(kept)
    theirs = titans(logs, str(run_dir / "theirs.json"))
    ours = gantt_generator.generate_gantt_trace(logs, str(run_dir / "ours.json"))
    own = {"heartbeat", "step_rollup", "structured_logger_opened", "structured_logger_closed"}
    program = [
        e
        for e in theirs["traceEvents"]
        if e["name"] not in own
        and "memory/" not in e["name"]
        and "process/" not in e["name"]
        and "host/" not in e["name"]
    ]
    assert len(program) < len(theirs["traceEvents"])
    assert ours["traceEvents"] == program


def test_torchtitans_gantt_generator_on_an_empty_folder_returns_an_empty_trace(tmp_path):
    assert gantt_generator.generate_gantt_trace(str(tmp_path), str(tmp_path / "out.json")) == {
        "traceEvents": []
    }

"""Shared fixtures: a logger writing into a temporary run directory, and record readers.

Also the process check (tests/helpers/process_check.py): a test that leaves a
process running errors at teardown, and a session that ends with one fails.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_titan import structured_logger as sl
from otel_titan.core import capture, step_context
from otel_titan.exporters import otel_env, otlp
from otel_titan.structured_logger import sigterm
from tests.helpers import process_check, processes

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    # The per-step memory/CPU scalars (on by default in the product) would add records to every
    # test's exact expectations; the tests of that feature turn it on (process_figures=True or the
    # variable).
    os.environ.setdefault("OTEL_TITAN_PROCESS_FIGURES", "0")
    # The analysis cache's user folder (its signing key, the entries of read-only runs): the
    # session's own, removed at its end, so that no test writes into ~/.cache (the commands run by
    # tests inherit it).
    config._otel_titan_cache_home = tempfile.mkdtemp(prefix="otel-titan-test-cache-")  # type: ignore[attr-defined]
    os.environ["XDG_CACHE_HOME"] = config._otel_titan_cache_home  # type: ignore[attr-defined]
    # Likewise the per-step `step_rollup` records: the tests of rollups turn them on
    # (step_rollups=True or the variable), and tests/analysis/test_rollup_blind.py checks that the
    # analysis answers the same with them.
    os.environ.setdefault("OTEL_TITAN_STEP_ROLLUPS", "0")
    if sys.platform.startswith("linux") and not config.pluginmanager.has_plugin(
        "otel-titan-process-check"
    ):
        config.pluginmanager.register(process_check.LeakCheck(), "otel-titan-process-check")


def pytest_unconfigure(config: pytest.Config) -> None:
    home = getattr(config, "_otel_titan_cache_home", None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _clean_logger_state() -> Iterator[None]:
    """Every test starts and ends with no logger, no step and no current span.

    (A test that leaves a span entered on purpose, a hung phase, would otherwise
    make the next test's spans its children, in the next test's trace. And no
    SIGTERM state from an earlier test: no handler, no callback, nothing owed.)
    """
    sl.shutdown_structured_logger()
    sigterm.reset()
    step_context._reset_for_tests()
    capture._current_span.set(None)
    otlp._quiet.reset()  # the exporters' once-a-minute memory is per process: one test's line must not hold back the next's
    otel_env.forget_warnings()  # and so is the once-only warning about an unknown OTEL_* value
    yield
    sl.shutdown_structured_logger()
    sigterm.reset()
    step_context._reset_for_tests()
    capture._current_span.set(None)


def jsonl_files(run_dir: str | os.PathLike[str]) -> list[str]:
    """Active JSONL files of a run directory, sorted by name."""
    return sorted(glob.glob(os.path.join(os.fspath(run_dir), "structured_logs", "*.jsonl")))


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every line of one file, parsed (fails the test on a malformed line)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def data_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records emitted by sl.* calls (not the logger's own opened/dropped/closed records)."""
    meta = {"structured_logger_opened", "records_dropped", "structured_logger_closed"}
    return [r for r in records if r["log_type_name"] not in meta]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def logged(run_dir: Path):
    """Initialise a logger (rank 0 of 1, fixed run id) and return a reader of its records.

    Calling the returned function shuts the logger down (writing everything)
    and returns the data records of its single file.
    """

    def start(**options: Any) -> None:
        options.setdefault("world_size", 1)
        options.setdefault("run_id", "test-run")
        sl.init_structured_logger("training", run_dir, rank=options.pop("rank", 0), **options)

    def finish() -> list[dict[str, Any]]:
        assert sl.shutdown_structured_logger(timeout=10)
        files = jsonl_files(run_dir)
        assert len(files) == 1, files
        return data_records(read_records(files[0]))

    start.finish = finish  # type: ignore[attr-defined]
    return start


def run_python(
    code: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (the real process lifecycle: exit, signals, fork).

    On a timeout the interpreter's whole tree is killed (it may have forked workers).
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONPATH", str(REPO))
    return processes.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )

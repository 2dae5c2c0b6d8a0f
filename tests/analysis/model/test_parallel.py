"""`model.parallel`: the summary's reads in worker interpreters, the task handed over by `collect`,
never named by a string."""

from __future__ import annotations

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis.model import collect, parallel
from otel_titan.analysis.model.parallel import task_name


def test_the_task_is_named_by_the_function_it_is():
    assert task_name(collect.read_share) == "otel_titan.analysis.model.collect:read_share"


def test_a_task_no_worker_can_import_is_refused_before_any_worker_starts():
    def local(*_args):
        return []

    for task in (lambda *_: [], local):
        with pytest.raises(ValueError, match="module-level function"):
            task_name(task)
    assert task_name(parallel.default_jobs) == "otel_titan.analysis.model.parallel:default_jobs"


def test_summary_read_in_two_workers_is_the_serial_summary(tmp_path):
    run = str(tmp_path / "run")
    generate_run(run, RunSpec(ranks=4, steps=6, seed=4, straggler=(2, "fwd", 30.0)))
    serial = collect.summarize_run(run, jobs=1, log_skipped=False, cache=False).to_dict(now_us=0)
    assert (
        collect.summarize_run(run, jobs=2, log_skipped=False, cache=False).to_dict(now_us=0)
        == serial
    )

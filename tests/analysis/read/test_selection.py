"""`read.selection.RunSelection`: the read options as one checked value, and the run it reads."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis.read.runs import UnknownRunError
from otel_titan.analysis.read.selection import RunSelection


def test_of_sorts_and_deduplicates_the_filters_and_keeps_the_defaults():
    selection = RunSelection.of("run", ranks=[3, 1, 3, 0], sources=iter(["rollouter", "training"]))
    assert selection == RunSelection(path="run", ranks=(0, 1, 3), sources=("rollouter", "training"))
    assert (selection.align, selection.cache, selection.log_skipped) == (True, True, True)
    assert selection.jobs is None and selection.scheduler is None and selection.run_id is None


@pytest.mark.parametrize(
    ("options", "names"),
    [({"jobs": 0}, "jobs: must be at least 1, got 0"), ({"sources": []}, "sources: no source")],
)
def test_of_refuses_an_option_out_of_range_naming_it(options, names):
    with pytest.raises(ValueError, match=names):
        RunSelection.of("run", **options)


def test_an_empty_scheduler_address_is_no_scheduler():
    # `--scheduler ""` or an empty $DASK_SCHEDULER_ADDRESS: this machine, not a cluster at "".
    assert RunSelection.of("run", scheduler="").scheduler is None


def test_with_changes_one_field_and_checks_as_of_does():
    selection = RunSelection.of("run", ranks=[2], align=False)
    narrowed = selection.with_(ranks=[5, 4], cache=False)
    assert narrowed == dataclasses.replace(selection, ranks=(4, 5), cache=False)
    assert selection.ranks == (2,)  # frozen: the first is unchanged
    with pytest.raises(ValueError, match="jobs"):
        selection.with_(jobs=-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        selection.ranks = (1,)  # type: ignore[misc]  # what the test checks: it cannot be set


def test_read_keeps_the_selected_ranks_of_the_run_asked_for(tmp_path):
    run = tmp_path / "run"
    generate_run(str(run), RunSpec(ranks=4, steps=3, seed=2))
    logs, choice = RunSelection.of(run, ranks=[2, 0]).read()
    assert [p.rank for p in logs.processes] == [0, 2]
    assert choice.how == "only"
    with pytest.raises(UnknownRunError, match="no run 'elsewhere' here"):
        RunSelection.of(run, run_id="elsewhere").read()

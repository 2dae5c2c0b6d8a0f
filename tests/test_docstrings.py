"""The examples in every otel_titan module's docstrings run as written (the whole package, not one
part).

The analysis's examples read a real run: a folder ``outputs`` in the
directory they run in, written by the library itself (two ranks, a few
steps), as a user's ``outputs`` would be. An example that cannot run here
says why in its docstring and is marked ``# doctest: +SKIP``; one that is
only a comment (doctest skips those without a word) is not allowed.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re

import pytest

import otel_titan
from otel_titan import structured_logger as sl
from tests.conftest import REPO

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(otel_titan.__path__, prefix="otel_titan.")
)
# The modules whose examples read ``outputs`` (the CLI and the analysis).
_READS_A_RUN = ("otel_titan.cli", "otel_titan.analysis")
# Comment-only examples still to be made to run, each with its reason: the live view
# (analysis/watch/) is owned by the watch work (issue 20), which runs its examples on a live run of
# its own.
_COMMENT_EXAMPLES_LEFT = {
    "otel_titan/analysis/watch/__init__.py",
    "otel_titan/analysis/watch/loop.py",
    "otel_titan/analysis/watch/replay.py",
}


@pytest.fixture(scope="session")
def doc_run(tmp_path_factory):
    """``outputs``: a real 2-rank run of 3 steps (data_fetch, fwd_bwd, optimizer, a loss), written
    by the library."""
    folder = tmp_path_factory.mktemp("docs")
    for rank in (0, 1):
        sl.init_structured_logger(
            "training",
            folder / "outputs",
            rank=rank,
            world_size=2,
            run_id="doc-run",
            stall_after_s=0,
            process_figures=False,
            step_rollups=True,
        )
        for step in range(1, 4):
            sl.set_step(step)
            with sl.log_trace_span("data_fetch"):
                pass
            with sl.log_trace_span("fwd_bwd"):
                pass
            with sl.log_trace_span("optimizer"):
                pass
            sl.log_trace_scalar({"loss": 1.0 / step})
        sl.shutdown_structured_logger()
    return folder


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, doc_run, monkeypatch):
    if name.startswith(_READS_A_RUN):
        monkeypatch.chdir(doc_run)
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert failures == 0


def test_the_walk_finds_every_layer_and_examples_in_each():
    tried = {}
    for name in MODULES:
        layer = name.split(".")[1]
        finder = doctest.DocTestFinder()
        tried[layer] = tried.get(layer, 0) + sum(
            len(test.examples) for test in finder.find(importlib.import_module(name))
        )
    for layer in (
        "schema",
        "environment_variables",
        "core",
        "exporters",
        "structured_logger",
        "analysis",
        "cli",
    ):
        assert tried.get(layer, 0) > 0, f"no docstring example in otel_titan.{layer}"


def test_no_example_is_only_a_comment_and_every_skip_says_why():
    """doctest passes over ``>>> # ...`` without running anything: such an "example" can rot
    unseen."""
    comments, unexplained = [], []
    for path in sorted((REPO / "otel_titan").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        relative = path.relative_to(REPO)
        if str(relative) in _COMMENT_EXAMPLES_LEFT:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if re.match(r"\s*>>> #", line):
                comments.append(f"{relative}:{number}: {line.strip()}")
    for name in MODULES:
        for test in doctest.DocTestFinder().find(importlib.import_module(name)):
            if any(
                example.options.get(doctest.SKIP) for example in test.examples
            ) and "not run" not in (test.docstring or ""):
                unexplained.append(test.name)
    assert comments == [], (
        "examples that are only comments (doctest never runs them):\n" + "\n".join(comments)
    )
    assert unexplained == [], (
        'a skipped example\'s docstring says why it is not run ("not run: ..."):\n'
        + "\n".join(unexplained)
    )

"""The examples in the analysis modules' docstrings run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["reader", "record_lines", "timeline", "filters", "chrome_events", "chrome_trace", "export_parallel", "summary", "summary_model", "summary_text"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"otel_titan.analysis.{name}")
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0 and tried > 0

"""The examples in every otel_titan module's docstrings run as written (the whole package, not one part)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import otel_titan

MODULES = sorted(info.name for info in pkgutil.walk_packages(otel_titan.__path__, prefix="otel_titan."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0


def test_the_walk_finds_every_layer_and_examples_in_each():
    tried = {}
    for name in MODULES:
        layer = name.split(".")[1]
        finder = doctest.DocTestFinder()
        tried[layer] = tried.get(layer, 0) + sum(len(test.examples) for test in finder.find(importlib.import_module(name)))
    for layer in ("schema", "core", "exporters", "structured_logger", "analysis"):
        assert tried.get(layer, 0) > 0, f"no docstring example in otel_titan.{layer}"

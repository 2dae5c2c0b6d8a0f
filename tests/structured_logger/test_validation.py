"""validation.py: the arguments of init_structured_logger checked before anything is created."""

from __future__ import annotations

import os

import pytest

from otel_titan.structured_logger.validation import (
    MAX_SOURCE_BYTES,
    absolute_dir,
    check_output_dir,
    validate_call,
    validate_source,
)


@pytest.mark.parametrize(
    ("source", "error", "message"),
    [
        (3, TypeError, "source must be a str"),
        ("a/b", ValueError, "cannot be used in a file name"),
        (".hidden", ValueError, "not starting with '.'"),
        ("é" * MAX_SOURCE_BYTES, ValueError, f"is {2 * MAX_SOURCE_BYTES} bytes in UTF-8"),
    ],
)
def test_bad_sources(source, error, message):
    with pytest.raises(error, match=message):
        validate_source(source)


def test_good_sources_pass():
    assert validate_source("rollouter-2.main") == "rollouter-2.main"
    assert validate_source("训练") == "训练"


def test_plain_arguments():
    validate_call("training", True, None)
    with pytest.raises(TypeError, match="enable must be a bool"):
        validate_call("training", 1, None)
    with pytest.raises(TypeError, match="rank must be an int or None, got bool"):
        validate_call("training", True, True)


def test_output_dir_made_absolute_once_and_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_dir("run") == os.path.join(str(tmp_path), "run")
    directory = check_output_dir("run/./x/..")
    assert directory == os.path.join(str(tmp_path), "run") and os.path.isdir(
        os.path.join(directory, "structured_logs")
    )
    with pytest.raises(ValueError, match="not a usable path"):
        absolute_dir("a\x00b")

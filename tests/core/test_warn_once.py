"""WarnOnce: the first occurrence of each key is reported, every occurrence counted, the memory
bounded."""

from __future__ import annotations

import logging

from otel_titan import structured_logger as sl
from otel_titan.core.warn_once import WarnOnce
from tests.core._spans import Captured


def test_first_per_key_and_counts():
    once = WarnOnce()
    assert [once.first("a"), once.first("a"), once.first("b"), once.first("a")] == [
        True,
        False,
        True,
        False,
    ]
    assert (once.count("a"), once.count("b"), once.count("c")) == (3, 1, 0)
    once.reset()
    assert once.first("a")


def test_bounded():
    once = WarnOnce(limit=2)
    assert once.first(1) and once.first(2)
    assert not once.first(3)  # past the limit: no new key, no warning
    assert once.count(3) == 0


def test_log_trace_scalar_warns_once_per_key_and_again_for_a_new_logger(caplog):
    caplog.set_level(logging.WARNING, logger="otel_titan")
    with Captured() as captured:
        for _ in range(3):
            sl.log_trace_scalar({"loss": None, "lr": 0.1})
        sl.log_trace_scalar({"grad": None})
        assert captured.queue.skipped_values == 4
    warned = [r.getMessage() for r in caplog.records if "skipped the value" in r.getMessage()]
    assert len(warned) == 2 and "'loss'" in warned[0] and "'grad'" in warned[1]
    caplog.clear()
    with Captured():  # a new logger (attach) starts with a fresh memory
        sl.log_trace_scalar({"loss": None})
    assert len([r for r in caplog.records if "skipped the value" in r.getMessage()]) == 1

"""parse_options: every option of init_structured_logger checked up front, the mistake named."""

from __future__ import annotations

import pytest

from otel_titan.core.options import LoggerOptions, parse_options


def test_defaults_and_values():
    assert parse_options({}) == LoggerOptions()
    parsed = parse_options(
        {"queue_size": 10, "handlers": ["a.b"], "flush_interval_s": 1, "world_size": None}
    )
    assert (parsed.queue_size, parsed.handlers, parsed.flush_interval_s, parsed.world_size) == (
        10,
        ["a.b"],
        1,
        None,
    )


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"queue_sise": 1}, TypeError, "unknown option 'queue_sise' (did you mean 'queue_size'?)"),
        ({"zzz": 1}, TypeError, "known options: attempt, backup_count"),
        ({"queue_size": True}, TypeError, "option queue_size must be an int >= 1, got bool True"),
        ({"queue_size": "8"}, TypeError, "option queue_size must be an int >= 1, got str '8'"),
        ({"queue_size": 0}, ValueError, "option queue_size must be an int >= 1, got 0"),
        ({"flush_interval_s": 11}, ValueError, "in (0, 10]"),
        ({"handlers": [1]}, ValueError, "a list of 'module.function' strings or callables"),
        ({"include_hostname": None}, TypeError, "option include_hostname must be a bool"),
    ],
)
def test_bad_options_name_the_option(options, error, message):
    with pytest.raises(error) as raised:
        parse_options(options)
    assert message in str(raised.value)


def test_options_are_frozen():
    with pytest.raises(AttributeError):
        parse_options({}).queue_size = 3  # type: ignore[misc]

"""The one helper for text and JSON output: control characters shown, never executed; odd values
always encode."""

from __future__ import annotations

import doctest
import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_titan.analysis.read import safe_text
from otel_titan.analysis.read.safe_text import escape_surrogates, json_bytes, json_safe, printable


def test_docstring_examples():
    failures, tried = doctest.testmod(safe_text, optionflags=doctest.ELLIPSIS)
    assert failures == 0 and tried > 0


@pytest.mark.parametrize(
    "text, shown",
    [
        ("\x1b[2J\x1b[Hpwned", "\\x1b[2J\\x1b[Hpwned"),  # clear screen, cursor home
        ("a\rb", "a\\rb"),  # carriage return: overwrite the line
        ("line\nforged", "line\\nforged"),  # a forged table row
        ("bell\x07 del\x7f", "bell\\x07 del\\x7f"),
        ("c1\x9b31m", "c1\\x9b31m"),  # the 8-bit CSI that some terminals obey
        ("abc\u202edcba", "abc\\u202edcba"),  # right-to-left override
        ("sep\u2028x", "sep\\u2028x"),
        ("lone\ud800", "lone\\ud800"),
        ("\udcff", "\\udcff"),  # an undecodable file-name byte
    ],
)
def test_printable_escapes_what_would_drive_the_terminal(text, shown):
    assert printable(text) == shown
    printable(text).encode("utf-8")


@pytest.mark.parametrize(
    "text",
    [
        "fwd_bwd",
        "步骤 前向",
        "données é",
        "emoji 🙂 ok",
        "tab-free   spaces",
        "C:\\path\\file",
        "\u3000ideographic space",
    ],
)
def test_printable_leaves_ordinary_text_alone(text):
    assert printable(text) == text


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40))
def test_printable_output_always_encodes_and_holds_no_control_character(text):
    shown = printable(text)
    shown.encode("utf-8")
    assert not any(
        ord(c) < 0x20
        or 0x7F <= ord(c) < 0xA0
        or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
        for c in shown
    )


def test_escape_surrogates_keeps_valid_text_as_it_is():
    assert escape_surrogates("ok 步骤") == "ok 步骤"
    assert escape_surrogates("a\ud800b\udfffc") == "a\\ud800b\\udfffc"


@settings(max_examples=200, deadline=None)
@given(
    value=st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(min_value=-(1 << 80), max_value=1 << 80),
            st.floats(allow_nan=True, allow_infinity=True),
            st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=8),
        ),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(
                st.one_of(
                    st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=4),
                    st.integers(min_value=-(1 << 70), max_value=1 << 70),
                ),
                inner,
                max_size=3,
            ),
        ),
        max_leaves=10,
    )
)
def test_json_bytes_never_fails_and_writes_valid_json(value):
    data = json_bytes(value, option=orjson.OPT_NON_STR_KEYS)
    orjson.loads(data)  # strict UTF-8 and standard JSON


def test_json_safe_keeps_what_orjson_can_write_and_fixes_only_the_rest():
    deep: list = []
    for _ in range(300):
        deep = [deep]
    data = json.loads(
        json_bytes({"rank": 1 << 70, "ok": 5, "name": "fwd\ud800", "k\udc80": 1, "deep": deep})
    )
    assert (
        data["rank"] == str(1 << 70)
        and data["ok"] == 5
        and data["name"] == "fwd\\ud800"
        and data["k\\udc80"] == 1
    )
    assert "(nested too deep)" in json.dumps(data["deep"])
    assert json_safe({"a": [1, 2.5, None, True]}) == {"a": [1, 2.5, None, True]}

"""The public API of the two front modules is what docs/api.md lists (issue 31 item 1's small part).

Each name of `otel_titan.structured_logger.__all__` and `otel_titan.analysis.__all__` is listed on
the page under its module, and nothing else is; each function and class has a docstring of its own,
and the page's line for it is that docstring's first line, so a new public name, or a changed
summary, fails here until the page says it.
"""

from __future__ import annotations

import inspect
import re
import types

import pytest

import otel_titan.analysis
import otel_titan.structured_logger
from tests.conftest import REPO

PAGE = REPO / "docs" / "api.md"
MODULES = [otel_titan.structured_logger, otel_titan.analysis]
_ROW = re.compile(r"^\| `(?P<name>[A-Za-z_][A-Za-z0-9_]*)` \| (?P<what>.+) \|$")


def listed(module_name: str) -> dict[str, str]:
    """name → description of the rows under the page's ``## `module_name` ...`` heading, in
    order."""
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(
        rf"^## `{re.escape(module_name)}`.*?\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M
    )
    assert match, f"docs/api.md has no section for {module_name}"
    rows = [_ROW.match(line) for line in match.group(1).splitlines()]
    found = [(row["name"], row["what"].replace("\\|", "|")) for row in rows if row]
    names = [name for name, _ in found]
    assert len(set(names)) == len(names), f"a name listed twice under {module_name}: {names}"
    return dict(found)


def problems(module: types.ModuleType, page: dict[str, str]) -> list[str]:
    """What differs between `module`'s public names and the page's list of them."""
    public = list(module.__all__)
    found = [
        f"{name}: exported but not listed in docs/api.md" for name in public if name not in page
    ]
    found += [
        f"{name}: listed in docs/api.md but not in {module.__name__}.__all__"
        for name in page
        if name not in public
    ]
    for name in public:
        obj = getattr(module, name)
        if isinstance(obj, (str, int, float, tuple, frozenset)):
            if not page.get(name, "").strip():
                found.append(f"{name}: a constant the page does not describe")
            continue
        own = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
        if not own or not own.strip():
            found.append(f"{name}: no docstring")
            continue
        # The summary: the first paragraph, wrapped or not.
        first = " ".join(inspect.cleandoc(own).split("\n\n")[0].split())
        if name in page and page[name] != first:
            found.append(f"{name}: the page says {page[name]!r}, its docstring {first!r}")
    return found


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_the_public_names_are_what_the_page_lists(module):
    assert not problems(module, listed(module.__name__)), "\n".join(
        problems(module, listed(module.__name__))
    )


def test_nothing_outside_all_is_public_by_accident_in_the_front_modules():
    """Every name a front module binds without a leading underscore is in its __all__, a submodule,
    or an import it re-exports."""
    for module in MODULES:
        loose = [
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and name not in module.__all__
            and not isinstance(value, types.ModuleType)
            and name != "annotations"
        ]
        assert loose == [], f"{module.__name__} binds public names outside __all__: {loose}"


def test_the_check_fails_on_an_undocumented_name_a_missing_docstring_and_a_stale_line():
    def documented() -> None:
        """Does one thing."""

    def bare() -> None:
        pass

    fake = types.ModuleType("fake")
    fake.documented, fake.bare, fake.LIMIT = documented, bare, "X"
    fake.__all__ = ["documented", "bare", "LIMIT", "new_name"]
    fake.new_name = documented
    found = problems(
        fake,
        {
            "documented": "Does another thing.",
            "bare": "Something.",
            "LIMIT": "",
            "gone": "Was here.",
        },
    )
    assert any(line.startswith("new_name: exported but not listed") for line in found), found
    assert any(line.startswith("gone: listed in docs/api.md but not") for line in found), found
    assert (
        "bare: no docstring" in found and "LIMIT: a constant the page does not describe" in found
    ), found
    assert any(
        line.startswith("documented: the page says 'Does another thing.'") for line in found
    ), found
    assert problems(
        fake,
        {
            "documented": "Does one thing.",
            "bare": "x",
            "LIMIT": "A limit.",
            "new_name": "Does one thing.",
        },
    ) == ["bare: no docstring"]

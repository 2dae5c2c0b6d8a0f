"""Every environment variable otel-titan reads is named once, in `otel_titan.environment_variables`,
and documented.

Checked on the sources themselves: a new ``OTEL_TITAN_…`` name anywhere in the
package (code, docstring, help text), the docs or the benchmarks that the
module does not define fails here; so does a variable without a docstring, a
docstring whose "Read in" names a module that does not read it, a variable
missing from docs/configuration.md's tables, and a spelled-out name where the
constant belongs.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from otel_titan import environment_variables as ev
from tests.conftest import REPO

PACKAGE = REPO / "otel_titan"
MODULE = PACKAGE / "environment_variables.py"
CONFIGURATION = REPO / "docs" / "configuration.md"
# Not `_OTEL_TITAN_LOGGER` (an identifier that merely contains the prefix).
_NAME = re.compile(r"(?<![A-Za-z0-9_])OTEL_TITAN_[A-Z0-9_]+")
# Files that may still spell a name out, each with the reason. The live view (analysis/watch/) is
# owned by the watch work (issue 20), which moves its `TRIGGER_ENV` to the constant.
_SPELLED_OUT_ALLOWED = {"otel_titan/analysis/watch/loop.py": "OTEL_TITAN_DUMP_TRIGGER"}


def _docstrings() -> dict[str, str]:
    """Each constant of the module → the string right after its assignment (its attribute
    docstring)."""
    body = ast.parse(MODULE.read_text(encoding="utf-8")).body
    found = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[node.targets[0].id] = after.value.value
    return found


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_name_is_its_own_value_and_listed_in_all():
    assert len(ev.ALL) >= 15
    assert len(set(ev.ALL)) == len(ev.ALL)
    for name in ev.ALL:
        assert getattr(ev, name) == name
    # and the one reader of on/off values (issue 31)
    assert set(ev.__all__) == {
        *ev.ALL,
        "ALL",
        "flag",
        "TRUE_VALUES",
        "FALSE_VALUES",
    }


def test_every_otel_titan_name_in_the_package_docs_and_benchmarks_is_defined():
    defined = set(ev.ALL)
    places = [
        *_sources(),
        *sorted((REPO / "docs").glob("*.md")),
        REPO / "README.md",
        *sorted((REPO / "benchmarks").rglob("*.py")),
        *sorted((REPO / "examples").rglob("*.py")),
        *sorted((REPO / "scripts").rglob("*")),
    ]
    seen: dict[str, str] = {}
    for path in places:
        if not path.is_file():
            continue
        for name in _NAME.findall(path.read_text(encoding="utf-8", errors="replace")):
            seen.setdefault(name, str(path.relative_to(REPO)))
    unknown = {name: where for name, where in seen.items() if name not in defined}
    assert unknown == {}, f"named but not defined in otel_titan/environment_variables.py: {unknown}"
    assert len(seen) >= 15  # the scan found the names (a broken pattern would find none and pass)


def test_every_variable_has_a_docstring_with_its_default_and_the_modules_that_really_read_it():
    docstrings = _docstrings()
    for name in ev.ALL:
        text = docstrings.get(name, "")
        assert len(text) > 60, f"{name} has no docstring (a string right after its assignment)"
        assert "default" in text.lower(), f"{name}'s docstring does not say its default"
        readers = re.search(r"Read in ((?:`[\w.]+`(?:,| and)?\s*)+)", text)
        assert readers, f"{name}'s docstring does not say where it is read ('Read in `module`')"
        for module in re.findall(r"`([\w.]+)`", readers.group(1)):
            path = REPO / (module.replace(".", "/") + ".py")
            assert path.is_file(), f"{name}: 'Read in {module}': no such module"
            tree = ast.parse(path.read_text(encoding="utf-8"))
            uses = [
                n
                for n in ast.walk(tree)
                if (isinstance(n, ast.Name) and n.id == name)
                or (isinstance(n, ast.Constant) and n.value == name)
            ]
            assert uses, f"{name}: {module} does not read it, as the docstring says"


def test_docs_configuration_lists_every_variable_and_only_those():
    text = CONFIGURATION.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \|", text, flags=re.M)
    assert sorted(rows) == sorted(ev.ALL), (
        "docs/configuration.md's tables and otel_titan/environment_variables.py differ"
    )


def test_the_code_uses_the_constants_not_the_spelled_out_names():
    """A name spelled out as a value (``os.environ.get("OTEL_TITAN_X")``) outside the module could
    drift from it.

    Docstrings and help texts that mention a name in prose are fine (checked above); a string
    that *is* a name is a use.
    """
    offenders = []
    for path in _sources():
        if path == MODULE:
            continue
        relative = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), relative)):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in ev.ALL
            ):
                if _SPELLED_OUT_ALLOWED.get(relative) != node.value:
                    offenders.append(f"{relative}:{node.lineno}: {node.value!r}")
    assert offenders == [], "use otel_titan.environment_variables' constant:\n" + "\n".join(
        offenders
    )


def test_the_module_imports_only_the_standard_library():
    tree = ast.parse(MODULE.read_text(encoding="utf-8"))
    imported = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    outside = [
        name
        for name in imported
        if name != "__future__" and name.split(".")[0] not in sys.stdlib_module_names
    ]
    assert outside == []


def test_the_contract_catches_the_module_importing_otel_titan(tmp_path):
    """pyproject.toml's leaf contract fails when the module imports anything of the package (here,
    the schema)."""
    shutil.copytree(PACKAGE, tmp_path / "otel_titan", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    module = tmp_path / "otel_titan" / "environment_variables.py"
    module.write_text(
        module.read_text(encoding="utf-8")
        + "\nfrom otel_titan import schema  # a leaf reaching sideways\n",
        encoding="utf-8",
    )
    lint = [
        sys.executable,
        "-c",
        "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())",
        "--no-cache",
    ]
    result = subprocess.run(
        lint,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert (
        "The environment variables' names are a leaf" in result.stdout and "BROKEN" in result.stdout
    ), result.stdout[-3000:]
    assert "otel_titan.environment_variables -> otel_titan.schema" in result.stdout, result.stdout[
        -3000:
    ]


# -- the one on/off vocabulary (issue 31 item 4) ---------------------------------------------------

#: Every on/off variable and the default it reads as unset; each is read through `ev.flag` (checked
#: below).
_FLAGS = {
    ev.OTEL_TITAN_PROCESS_FIGURES: True,
    ev.OTEL_TITAN_STEP_ROLLUPS: True,
    ev.OTEL_TITAN_OTLP_RECORDS: False,
    ev.OTEL_TITAN_CUDA_STEP_PEAK: False,
    ev.OTEL_TITAN_FAULTHANDLER: True,
    ev.OTEL_TITAN_HOST_METRICS: True,
}


def test_flag_reads_one_vocabulary_in_any_case():
    for value in ("1", "true", "TRUE", "on", " On ", "yes", "Yes"):
        assert ev.flag("X", False, {"X": value}) is True, value
    for value in ("0", "false", "False", "off", "OFF", "no", " no "):
        assert ev.flag("X", True, {"X": value}) is False, value
    for default in (True, False):
        assert ev.flag("X", default, {}) is default
        assert ev.flag("X", default, {"X": "  "}) is default  # empty: as unset


def test_an_unknown_value_is_warned_about_once_naming_the_variable_the_value_and_the_default(
    caplog,
):
    name = "OTEL_TITAN_TEST_FLAG_UNKNOWN"  # a name of its own: the once-only memory is per process
    with caplog.at_level("WARNING", logger=ev.__name__):
        assert ev.flag(name, True, {name: "enabled"}) is True
        assert ev.flag(name, True, {name: "enabled"}) is True
        assert ev.flag(name, False, {name: "ja"}) is False
    messages = [r.getMessage() for r in caplog.records if r.name == ev.__name__]
    assert len(messages) == 2, messages  # once per variable and value
    assert name in messages[0] and "'enabled'" in messages[0] and "default (on)" in messages[0], (
        messages
    )
    assert "'ja'" in messages[1] and "default (off)" in messages[1], messages


def test_every_on_off_variable_is_read_through_the_one_parser():
    """No module parses an on/off value inline: each variable's readers call `flag` with it, and the
    default documented."""
    inline = re.compile(r'in \(\s*"(0|1)",\s*"(false|true)"')
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        assert not inline.search(text), (
            f"{path.relative_to(REPO)} parses an on/off value inline: use "
            "environment_variables.flag"
        )
    calls = ""
    for path in _sources():
        calls += path.read_text(encoding="utf-8")
    for name, default in _FLAGS.items():
        assert re.search(rf"flag\(({name}|[A-Z_]*ENV), {default}\b", calls), (
            f"{name} is not read with flag(..., {default})"
        )
        documented = "on" if default else "off"
        row = next(
            line
            for line in CONFIGURATION.read_text(encoding="utf-8").splitlines()
            if line.startswith(f"| `{name}` |")
        )
        assert row.split("|")[2].strip().startswith(documented), (name, row)


def test_cuda_step_peak_on_turns_it_on(monkeypatch):
    """The issue's case: OTEL_TITAN_CUDA_STEP_PEAK=on was silently off while
    OTEL_TITAN_OTLP_RECORDS=on was on."""
    from otel_titan.core.process_figures import ProcessFigures
    from otel_titan.exporters.otlp_records import records_enabled

    monkeypatch.setenv(ev.OTEL_TITAN_CUDA_STEP_PEAK, "on")
    assert ProcessFigures(local_rank=0).step_peak is True
    monkeypatch.setenv(ev.OTEL_TITAN_CUDA_STEP_PEAK, "off")
    assert ProcessFigures(local_rank=0).step_peak is False
    assert records_enabled({ev.OTEL_TITAN_OTLP_RECORDS: "on"}) is True
    assert records_enabled({ev.OTEL_TITAN_OTLP_RECORDS: "Off"}) is False

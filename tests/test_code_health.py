"""The code's own checks, run by `make test`: ruff's lint on the whole tree and mypy on the package
(issue 31).

Their configuration is pyproject.toml's [tool.ruff] and [tool.mypy]; docs/development.md says what
they check and what is not adopted yet. Each check is also tried on a planted fault, so a
configuration that stopped checking (a rule set emptied, a path excluded) fails here too.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The folders of Python the project owns (.venv and the like are not ours).
TREE = ["otel_titan", "tests", "benchmarks", "examples", "scripts"]


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_ruff_passes() -> None:
    result = _ruff("check", "--no-cache", "--output-format", "concise", *TREE)
    assert result.returncode == 0, (
        "ruff check found problems (fix them, or a noqa that says why):\n"
        + result.stdout
        + result.stderr
    )


def test_the_tree_is_as_ruff_format_lays_it_out() -> None:
    result = _ruff("format", "--check", "--no-cache", *TREE)
    assert result.returncode == 0, (
        "ruff format would change these files (run `.venv/bin/python -m ruff format "
        + " ".join(TREE)
        + "`):\n"
        + result.stdout
        + result.stderr
    )


def test_ruff_format_catches_a_planted_layout(tmp_path: Path) -> None:
    module = tmp_path / "planted.py"
    module.write_text("x = {  'a':1 }\n")
    config = str(ROOT / "pyproject.toml")
    result = _ruff("format", "--check", "--no-cache", "--config", config, str(module), cwd=tmp_path)
    assert result.returncode == 1 and "planted.py" in result.stdout, result.stdout + result.stderr


def test_ruff_catches_a_planted_fault(tmp_path: Path) -> None:
    module = tmp_path / "planted.py"
    # split: ruff reads this file's comments too
    stale = "# noqa: E402 - a suppression that silences nothing"
    module.write_text(f"import os  {stale}\nimport sys\n\n\ndef f(x=[]):\n    return sys.argv\n")
    result = _ruff(
        "check",
        "--no-cache",
        "--output-format",
        "concise",
        "--config",
        str(ROOT / "pyproject.toml"),
        str(module),
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    for code in ("F401", "RUF100", "B006"):  # unused import, a stale noqa, a mutable default
        assert code in result.stdout, (code, result.stdout)


#: A suppression names its codes and says why: `noqa: BLE001 - why`, `type: ignore[code]  # why` (mypy reads
#: only a comment of its own after the codes).
_NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$")
_NOQA_WITH_REASON = re.compile(r"^:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+-\s+\S")
_TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<rest>.*)$")
_TYPE_IGNORE_WITH_REASON = re.compile(r"^\[[a-z0-9-]+(\s*,\s*[a-z0-9-]+)*\]\s+#\s*\S")


def _suppressions(
    pattern: re.Pattern[str], reason: re.Pattern[str], folders: list[str] = TREE
) -> list[str]:
    """Every line under `folders` where `pattern` suppresses a check without the reason `reason`
    wants."""
    bare = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == "tests/test_code_health.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                found = pattern.search(line)
                if found and not reason.match(found.group("rest")):
                    bare.append(f"{relative}:{number}: {line.strip()}")
    return bare


def _mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_mypy_passes(tmp_path: Path) -> None:
    # The configuration's `files` (the package) and its per-module strictness; a cache of this
    # test's own.
    result = _mypy("--cache-dir", str(tmp_path / "mypy-cache"))
    assert result.returncode == 0, (
        "mypy found type errors (fix them, or a type: ignore[code] that says why):\n"
        + result.stdout
        + result.stderr
    )
    assert "Success: no issues found" in result.stdout, result.stdout


def test_mypy_is_strict_on_the_core(tmp_path: Path) -> None:
    """An unannotated function in core/ fails (strict there), the same in the reader passes (default
    there)."""
    package = tmp_path / "otel_titan"
    for folder in ("core", "analysis"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
        (package / folder / "planted.py").write_text("def f(x):\n    return x\n")
    (package / "__init__.py").write_text("")
    (package / "schema.py").write_text("")
    strict = _mypy(
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "-p",
        "otel_titan",
        cwd=tmp_path,
    )
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert (
        "otel_titan/core/planted.py:1: error: Function is missing a type annotation"
        in strict.stdout
    ), strict.stdout
    assert "analysis/planted.py" not in strict.stdout, strict.stdout


def test_every_type_ignore_says_why() -> None:
    bare = _suppressions(_TYPE_IGNORE, _TYPE_IGNORE_WITH_REASON, folders=["otel_titan"])
    assert not bare, (
        "a type: ignore names its codes and says why (`# type: ignore[attr-defined]  # set by "
        "bind`):\n" + "\n".join(bare)
    )


def test_every_noqa_says_why() -> None:
    bare = _suppressions(_NOQA, _NOQA_WITH_REASON)
    assert not bare, (
        "a noqa names its codes and says why (`# noqa: BLE001 - a broken exporter must not ...`):\n"
        + "\n".join(bare)
    )


def test_the_suppression_checks_see_a_bare_one() -> None:
    assert _NOQA_WITH_REASON.match(": BLE001 - closing: nothing to recover")
    assert _NOQA_WITH_REASON.match(": F401, E402 - after importorskip")
    for bare in ("", ": BLE001", ":BLE001 closing", " - why, but no code"):
        assert not _NOQA_WITH_REASON.match(bare), bare
    assert _TYPE_IGNORE_WITH_REASON.match("[attr-defined]  # the SDK's private attribute")
    assert _TYPE_IGNORE_WITH_REASON.match("[index, call-overload]  # a dict, made just above")
    for bare in ("", "[attr-defined]", "  # why, but no code"):
        assert not _TYPE_IGNORE_WITH_REASON.match(bare), bare

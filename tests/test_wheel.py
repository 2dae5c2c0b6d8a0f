"""The wheel is publishable, and installing it gives a working otel-titan (issue 28 item 6).

otel-titan is on no package index: users install it from a checkout or from a wheel built from one.
The wheel is built here as a user builds it (``pip wheel``, from a copy of the checkout's files, so
that no ``build/`` folder is left in the repository), then its metadata and files are read back, and
it is installed into a folder of its own and run from there.
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from otel_titan._version import __version__
from tests.conftest import REPO
from tests.helpers import processes


def _checkout_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [name for name in listed.splitlines() if (REPO / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in _checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    # --no-build-isolation: the project's .venv holds the build backend pyproject.toml asks for (no
    # download).
    done = processes.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = dist.glob("*.whl")
    return built


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        return email.parser.Parser().parsestr(
            archive.read(f"otel_titan-{__version__}.dist-info/METADATA").decode()
        )


def test_the_wheel_s_name_and_metadata_are_what_pyproject_declares(wheel):
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert wheel.name == f"otel_titan-{__version__}-py3-none-any.whl"
    metadata = _metadata(wheel)
    assert (
        metadata["Name"] == "otel-titan"
        and metadata["Version"] == __version__ == project["version"]
    )
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == [
        "LICENSE"
    ]
    assert metadata["Requires-Python"] == ">=3.10"
    assert (
        metadata["Summary"] == project["description"]
        and metadata["Author"] == "The otel-titan authors"
    )
    assert (
        metadata["Description-Content-Type"] == "text/markdown"
        and "## Quickstart" in metadata.get_payload()
    )
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    # Every dependency with its bound, every extra with its own.
    required = {str(Requirement(text)) for text in metadata.get_all("Requires-Dist")}
    declared = {str(Requirement(text)) for text in project["dependencies"]}
    declared |= {
        str(Requirement(f"{text}; extra == {extra!r}".replace("'", '"')))
        for extra, texts in project["optional-dependencies"].items()
        for text in texts
    }
    assert required == declared
    assert (
        set(metadata.get_all("Provides-Extra"))
        == set(project["optional-dependencies"])
        == {"torch", "analysis", "metrics", "cluster", "mcp"}
    )


def test_the_wheel_holds_the_package_its_license_and_the_command_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist_info = f"otel_titan-{__version__}.dist-info"
        assert archive.read(f"{dist_info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
        assert b"Apache License\n" in archive.read(f"{dist_info}/licenses/LICENSE")
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    assert re.search(
        r"^\[console_scripts\]\notel-titan = otel_titan\.cli:main$", entry_points, flags=re.M
    ), entry_points
    package = {
        name
        for name in _checkout_files()
        if name.startswith("otel_titan/")
        and (
            name.endswith(".py")
            or name in ("otel_titan/py.typed", "otel_titan/analysis/agents/guide.md")
        )
    }
    assert package <= names, sorted(package - names)
    assert {name for name in names if not name.startswith(dist_info + "/")} == package


def test_the_installed_wheel_runs_without_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    done = processes.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The dependencies come from the project's .venv; otel-titan itself only from the installed
    # wheel.
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = "import otel_titan, otel_titan.distribution as d; print(otel_titan.__file__); print(d.install_hint('analysis'))"
    shown = processes.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    where, hint = shown.stdout.splitlines()
    assert Path(where).is_relative_to(target)
    # Not a checkout: the hint says how to install from one or from the wheel, and names this
    # version's wheel.
    assert (
        hint
        == f"pip install '/path/to/otel-titan[analysis]' (a checkout), or 'otel-titan[analysis] @ file:///path/to/{wheel.name}'"
    )
    version = processes.run(
        [str(target / "bin" / "otel-titan"), "--version"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert version.returncode == 0 and __version__ in version.stdout, (
        version.stdout + version.stderr
    )


def test_the_changelog_has_the_released_version():
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## {re.escape(__version__)}\b", changelog, flags=re.M), (
        "CHANGELOG.md has no section for the package's version"
    )

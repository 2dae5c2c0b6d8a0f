"""scripts/setup.sh: a failed install fails the set-up, loudly, and is retried next time (never stamped as done).

The real script runs in a temporary copy of the repository's set-up files,
against a throwaway .venv that sees the project's installed packages (so
only the requirement under test can be missing), with pip offline: the
project's own .venv is never touched.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import processes

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("bash") is None or sys.platform == "win32", reason="needs bash")]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of what setup.sh reads, with an existing .venv whose packages are the project's."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for name in ("requirements-dev.txt", "requirements-nodeps.txt"):
        (root / name).write_text("# nothing yet\n")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True, timeout=120)
    purelib = subprocess.run(
        [str(root / ".venv" / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True, check=True
    ).stdout.strip()
    # The project's site-packages (pip, torch, pytest, rotel, the editable otel_titan): imports work, pip runs.
    Path(purelib, "project.pth").write_text(f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n")
    return root


def setup_sh(root: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    empty = tmp_path / "no-wheels"
    empty.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty), "PIP_NO_CACHE_DIR": "1"}
    return processes.run(["bash", str(root / "scripts" / "setup.sh")], capture_output=True, text=True, env=env, cwd=root, timeout=300)


def test_a_failed_install_fails_the_setup_loudly_and_is_not_stamped(checkout, tmp_path):
    # A requirement pip cannot install, while everything the final import check needs is there:
    # the case where the old script swallowed pip's failure and stamped the .venv as set up for good.
    (checkout / "requirements-dev.txt").write_text("otel-titan-no-such-package==1.0\n")
    stamp = checkout / ".venv" / ".otel-titan-setup"
    for attempt in range(2):
        result = setup_sh(checkout, tmp_path)
        assert result.returncode != 0, (attempt, result.stdout, result.stderr)
        assert "installing pinned dependencies" in result.stdout  # the second run tries again
        assert "otel-titan-no-such-package" in result.stdout + result.stderr  # pip's own message is shown
        assert "setup: FAILED: pip could not install requirements-dev.txt" in result.stderr
        assert not stamp.exists()


def test_a_failure_after_an_earlier_success_removes_the_stamp(checkout, tmp_path):
    stamp = checkout / ".venv" / ".otel-titan-setup"
    (checkout / "requirements-dev.txt").write_text("pytest\n")  # satisfied: the set-up succeeds and stamps
    first = setup_sh(checkout, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert stamp.exists()
    again = setup_sh(checkout, tmp_path)  # nothing changed: instant, nothing installed
    assert again.returncode == 0 and "installing" not in again.stdout and stamp.exists()
    (checkout / "requirements-nodeps.txt").write_text("otel-titan-no-such-package==1.0\n")
    failed = setup_sh(checkout, tmp_path)
    assert failed.returncode != 0 and "setup: FAILED: pip could not install requirements-nodeps.txt" in failed.stderr
    assert not stamp.exists()  # the old stamp does not vouch for a .venv whose last install failed

"""The watch screen as a user sees it: in a real terminal (tmux, read back with ``capture-pane``),
narrow and wide.

A generated 16-rank run with a hung rank, its files dated a minute back (the
job has been stuck that long), is watched by the real command in a tmux
window of 80×24 and one of 200×50; the captured screen must show the run,
the process states, the steps, the alert naming the culprit and its cost,
drawn in place (one header, not one per refresh), and no line may be cut
mid-word beyond the window's width. Without rich the same screen is drawn by
clearing the terminal; with output to a pipe it is plain lines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis.watch.screen import frame_lines
from tests.conftest import REPO

pytestmark = pytest.mark.slow
TMUX = shutil.which("tmux")


def stuck_run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    generate_run(str(out), RunSpec(ranks=16, steps=40, seed=1, hung=(5, 30), step_ms=200.0))
    old = time.time() - 60
    for name in os.listdir(out / "structured_logs"):
        os.utime(out / "structured_logs" / name, (old, old))
    return out


def tmux_screen(
    tmp_path: Path,
    run: Path,
    width: int,
    height: int,
    env_extra: dict[str, str] | None = None,
    wait_for: str = "hang: training rank 5",
) -> str:
    socket = f"otel-titan-test-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [*(env_extra or {}).get("PYTHONPATH_FIRST", "").split(os.pathsep), str(REPO)]
        ).strip(os.pathsep),
        "TERM": "xterm-256color",
    }
    env.pop("PYTHONPATH_FIRST", None)
    command = f"{sys.executable} -m otel_titan.cli watch {run} --interval 1 --no-trigger"
    subprocess.run(
        [
            TMUX,
            "-L",
            socket,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            str(width),
            "-y",
            str(height),
            command,
        ],
        env=env,
        check=True,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 30
        screen = ""
        while time.monotonic() < deadline:
            screen = subprocess.run(
                [TMUX, "-L", socket, "capture-pane", "-p", "-t", "0"],
                capture_output=True,
                text=True,
            ).stdout
            if wait_for in screen.replace("\n", ""):
                time.sleep(1.5)  # one more refresh: it must redraw in place, not scroll
                return subprocess.run(
                    [TMUX, "-L", socket, "capture-pane", "-p", "-t", "0"],
                    capture_output=True,
                    text=True,
                ).stdout
            time.sleep(0.3)
        raise AssertionError(f"the alert never appeared on the {width}x{height} screen:\n{screen}")
    finally:
        subprocess.run([TMUX, "-L", socket, "kill-server"], capture_output=True)


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
@pytest.mark.parametrize("width, height", [(80, 24), (200, 50)])
def test_the_screen_in_a_real_terminal_narrow_and_wide(tmp_path, width, height):
    screen = tmux_screen(tmp_path, stuck_run(tmp_path), width, height)
    print(f"--- {width}x{height} ---\n{screen}")
    flat = " ".join(screen.split())
    assert screen.count("otel-titan watch · run gen-run") == 1, (
        "drawn in place: one header, not one per refresh"
    )
    assert "16/16 processes" in flat and "hung 1" in flat and "stalled 15" in flat
    assert "steps: min 30" in flat and "step 2" in flat
    assert "hang: training rank 5 in bwd (step 30)" in flat and "15 ranks wait for it" in flat
    assert "15 ranks waiting" in flat, "the alert's cost is shown"
    assert all(len(line) <= width for line in screen.splitlines())
    if width >= 200:
        assert any(
            "hang: training rank 5 in bwd (step 30), behind in the step at "
            "train.py:88:train_step; 15 ranks wait for it" in line
            for line in screen.splitlines()
        ), "a wide window keeps the alert on one line"
    else:
        # The alert wraps under its message ("hang: …"), not under its "▲ time": at that column it
        # would read as the next alert.
        rows = screen.splitlines()
        at = next(i for i, row in enumerate(rows) if "▲" in row)
        column = rows[at].index("hang:")
        assert rows[at + 1][:column].strip() == "" and rows[at + 1][column : column + 1].strip(), (
            rows[at],
            rows[at + 1],
        )


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
def test_without_rich_the_screen_is_still_drawn_in_place(tmp_path):
    fake = tmp_path / "no-rich"
    (fake / "rich").mkdir(parents=True)
    (fake / "rich" / "__init__.py").write_text(
        "raise ImportError('rich is not installed (test)')\n"
    )
    screen = tmux_screen(tmp_path, stuck_run(tmp_path), 120, 30, {"PYTHONPATH_FIRST": str(fake)})
    assert screen.count("otel-titan watch · run gen-run") == 1
    assert "hang: training rank 5" in " ".join(screen.split())


def test_to_a_pipe_it_prints_plain_lines_with_each_alert_once(tmp_path):
    run = stuck_run(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_titan.cli",
            "watch",
            str(run),
            "--interval",
            "0.2",
            "--no-trigger",
            "--exit-on",
            "hang",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert "\x1b" not in done.stdout, "no terminal control sequences in a pipe"
    assert done.stdout.count("ALERT hang: hang: training rank 5") == 1
    assert done.stdout.rstrip().endswith("15 ranks wait for it")


def test_text_from_the_records_is_escaped_on_the_screen():
    frame = {
        "run_id": "r\x1b[2J",
        "attempt": 0,
        "age_s": 5,
        "processes": 2,
        "world_size": 2,
        "states": {"running": 2},
        "steps": None,
        "phases": [{"name": "fwd\x1b[31m", "ms": 1.0, "share_pct": 50.0}],
        "alerts": [
            {
                "kind": "hang",
                "message": "hang: rank 1 in \x07bell",
                "line": "x.py:1 f\x1b]0;",
                "detected_utc": "2026-01-01T00:00:00.000Z",
                "cost": {},
                "evidence": [],
            }
        ],
    }
    text = "\n".join(line for line, _ in frame_lines(frame))
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[2J" in text

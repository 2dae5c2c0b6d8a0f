"""Regenerate the README's two pictures: docs/images/report.png and docs/images/watch.png.

    .venv/bin/python scripts/screenshots.py        # about a minute; needs chromium and tmux (make
    setup-tests)

Both come from the real tools the tests use: `otel-titan report` on a generated 64-rank run with
rank 21 slower in ``fwd``, opened in headless Chromium; `otel-titan watch` following a generated
16-rank run whose rank 5 hangs at step 30, on a real tmux screen, whose captured cells (colours
included) are drawn by rich as HTML and photographed by the same Chromium. Nothing is left behind:
the runs are in a temporary folder, the tmux server is a private one, killed at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.generate_run import RunSpec, generate_run  # noqa: E402 - after the sys.path set-up (run as a script)

IMAGES = REPO / "docs" / "images"
OTEL_TITAN = str(Path(sys.executable).with_name("otel-titan"))
WATCH_SECONDS = 24  # two refreshes past the hang threshold (8 s at least) and a black box read
SCREEN = (100, 30)  # tmux columns and rows


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("screenshots: no chromium on the PATH (make setup-tests installs it)")


def photograph(html: Path, png: Path, width: int, height: int) -> None:
    """Headless Chromium's picture of a local page, after its scripts ran (Plotly draws on load)."""
    subprocess.run(
        [
            chromium(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            "--virtual-time-budget=20000",
            f"--screenshot={png}",
            html.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )


def report_picture(folder: Path) -> None:
    run = folder / "straggler"
    generate_run(str(run), RunSpec(ranks=64, steps=60, seed=7, straggler=(21, "fwd", 25.0)))
    subprocess.run(
        [OTEL_TITAN, "report", str(run), "-o", str(folder / "report.html"), "--no-progress"],
        check=True,
        timeout=300,
    )
    photograph(folder / "report.html", IMAGES / "report.png", 1400, 1800)


def watch_picture(folder: Path) -> None:
    from rich.console import Console
    from rich.terminal_theme import MONOKAI
    from rich.text import Text

    run = folder / "hung"
    generate_run(
        str(run),
        RunSpec(
            ranks=16,
            steps=40,
            seed=2,
            hung=(5, 30),
            black_boxes=True,
            start_us=int(time.time() * 1e6) - 4_000_000,
        ),
    )
    socket = f"otel-titan-screenshots-{os.getpid()}"
    tmux = ["tmux", "-L", socket]
    columns, rows = SCREEN
    try:
        subprocess.run(
            [
                *tmux,
                "new-session",
                "-d",
                "-x",
                str(columns),
                "-y",
                str(rows),
                f"{OTEL_TITAN} watch {run} --no-trigger",
            ],
            check=True,
            timeout=30,
        )
        time.sleep(WATCH_SECONDS)
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p", "-e"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)
    console = Console(
        record=True,
        width=columns,
        file=open(os.devnull, "w"),
        force_terminal=True,
        color_system="truecolor",
    )
    console.print(Text.from_ansi(screen.rstrip("\n")))
    page = folder / "watch.html"
    page.write_text(console.export_html(theme=MONOKAI, inline_styles=True))
    photograph(page, IMAGES / "watch.png", 990, 330)


def main() -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="otel-titan-screenshots-") as folder:
        report_picture(Path(folder))
        watch_picture(Path(folder))
    print(f"screenshots: wrote {IMAGES / 'report.png'} and {IMAGES / 'watch.png'}")


if __name__ == "__main__":
    main()

"""What a file's spans say per step, as the reader pairs them: the ground truth a ``step_rollup``
record must match."""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from otel_titan.analysis.model.timeline import TimelineVisitor, walk_process
from otel_titan.schema import MetaEvent, StepCloser
from tests.conftest import REPO
from tests.helpers import processes
from tests.helpers.analysis import _SESSION_DIR, SLOW_MS, TOY_STEPS, _torchrun_command


def rollups_by_step(records: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """step → its ``step_rollup`` record (the last one written: a rollup after SIGTERM is superseded
    by a later one)."""
    out: dict[int, dict[str, Any]] = {}
    for record in records:
        if record["log_type_name"] == MetaEvent.STEP_ROLLUP:
            out[record["step"]] = record
    return out


class _Truth(TimelineVisitor):
    def __init__(self) -> None:
        self.steps: dict[int, dict[str, Any]] = {}
        self.phases: dict[int, dict[str, list[int]]] = {}
        self.closer = StepCloser()

    def span(self, span: Any, end: Any, end_us: int, dur_us: float, incomplete: bool) -> None:
        if incomplete:
            return
        first = span.start if span.start is not None else end
        step = first.get("step")
        if type(step) is not int:
            return
        self.closer.span_ended(
            step, span.name, span.start_us, end_us, first.get("parent_span_id") is None
        )
        phase = self.phases.setdefault(step, {}).setdefault(span.name, [0, 0])
        phase[0] += 1
        phase[1] += int(dur_us)

    def step(self, step: int, begin_us: int, end_us: int, first: dict[str, Any]) -> None:
        self.steps[step] = {
            "begin_us": begin_us,
            "end_us": end_us,
            "closing": self.closer.closing(step),
        }


def spans_by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """step → {"phases": {name: [count, total µs]}, "begin_us", "end_us", "closing": (name, start,
    end) | None} from the spans."""
    truth = _Truth()
    walk_process(records, truth)
    return {
        step: {**extent, "phases": truth.phases.get(step, {})}
        for step, extent in truth.steps.items()
    }


def closing_of(rollup: dict[str, Any]) -> tuple[str, int, int] | None:
    """A rollup's ``closing`` field as the tuple `StepCloser.closing` gives."""
    closing = rollup.get("closing")
    return None if closing is None else (closing["name"], closing["start_us"], closing["end_us"])


@functools.cache
def toy_run_with_rollups() -> Path:
    """A finished 2-rank torchrun (gloo) toy run with rollups on: 8 steps, rank 1 slower in
    data_fetch, gc and checkpoints every 4 steps.

    Made once per session (tests/helpers/analysis.py's session folder, removed at exit).
    """
    output = _SESSION_DIR / "toy-rollups"
    command, env = _torchrun_command(
        output,
        "--steps",
        str(TOY_STEPS),
        "--slow-rank",
        "1",
        "--slow-ms",
        str(SLOW_MS),
        "--gc-every",
        "4",
        "--checkpoint-every",
        "4",
    )
    env["OTEL_TITAN_STEP_ROLLUPS"] = "1"
    result = processes.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return output


def strip_rollups(run_dir: Path, into: Path) -> Path:
    """A copy of `run_dir`'s logs without their rollup lines, ``seq_id`` renumbered: the same run as
    written without rollups.

    Every other line is kept byte for byte but for its ``seq_id``.
    """
    logs = into / "structured_logs"
    logs.mkdir(parents=True)
    for path in sorted((run_dir / "structured_logs").iterdir()):
        kept: list[bytes] = []
        for line in path.read_bytes().splitlines():
            if json.loads(line)["log_type_name"] == MetaEvent.STEP_ROLLUP:
                continue
            kept.append(re.sub(rb'"seq_id":\d+', b'"seq_id":%d' % (len(kept) + 1), line, count=1))
        (logs / path.name).write_bytes(b"".join(line + b"\n" for line in kept))
        shutil.copystat(path, logs / path.name)
    return into

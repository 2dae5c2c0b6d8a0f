"""`otel-titan watch`: follow a running job, refresh the detector, show the frame, ask for black boxes.

`Watch.refresh` is one cycle: `follow.RunFollower.poll` (the bytes appended
since the last cycle), `detect.Detector` (records in, frame and alerts out),
and, the first time a hang is suspected, a touch of the dump trigger file
(``OTEL_TITAN_DUMP_TRIGGER``, docs/hangs.md) so that every rank writes its
black box and the culprit's line of code arrives within seconds instead of
after the 120 s watchdog. `run_watch` is the command's loop around it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, TextIO

from otel_titan.environment_variables import OTEL_TITAN_DUMP_TRIGGER
from otel_titan.analysis.model.hang import read_faulthandler_stacks, side_file_of
from otel_titan.analysis.watch.detect import Detector, Rules
from otel_titan.analysis.read.follow import RunFollower
from otel_titan.analysis.read.records import NotARunError, find_log_dir
from otel_titan.analysis.watch.screen import Screen
from otel_titan.analysis.read.safe_text import json_bytes

__all__ = ["Watch", "run_watch", "wait_for_run", "parse_seconds", "EXIT_ALERT", "EXIT_ON_KINDS", "TRIGGER_ENV", "default_trigger"]

#: Exit status of ``--exit-on`` when a confirmed alert of one of its kinds is raised.
EXIT_ALERT = 3
#: Alerts ``--exit-on`` may name: never ``slow`` (killing 1,024 GPUs over a slowdown is the operator's call).
EXIT_ON_KINDS = ("hang", "crashed", "terminated", "missing")
#: The writer's variable (`structured_logger.lifecycle.DUMP_TRIGGER_ENV`; the reader may not import the writer).
TRIGGER_ENV = OTEL_TITAN_DUMP_TRIGGER


def default_trigger(run_dir: str) -> str:
    """The trigger file `watch` touches: ``$OTEL_TITAN_DUMP_TRIGGER`` when set here, else ``RUN_DIR/dump-now``."""
    return os.environ.get(TRIGGER_ENV, "").strip() or os.path.join(run_dir, "dump-now")


def wait_for_run(path: str, *, wait_s: float | None, say: Callable[[str], None], poll_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str:
    """Return the run directory of `path` once it is a run; until then wait, saying so once through `say`.

    `watch` is started before the job in the docs' own recipes (a SLURM
    sidecar step, ``torchrun … &`` then ``watch``): the folder, or its
    ``structured_logs/``, appears only when the first rank opens its file. A
    path that does not exist yet, or a folder with no log files yet, is
    waited for (every `poll_s`); `wait_s` seconds without it (None: for ever)
    raise `NotARunError` naming the wait (0: at once, as it was). A path that cannot become a run (a
    file that is not a ``.jsonl``, a folder that cannot be listed) raises at once.

    Example:
        >>> import tempfile, os
        >>> run = os.path.join(tempfile.mkdtemp(), "outputs")
        >>> wait_for_run(run, wait_s=0.2, say=print, poll_s=0.1)
        Traceback (most recent call last):
        ...
        otel_titan.analysis.read.records.NotARunError: ...outputs: no such file or directory (waited 0.2 s for the job to write its files: --wait)
        >>> os.makedirs(os.path.join(run, "structured_logs")); wait_for_run(run, wait_s=0.0, say=print) == run
        True
    """
    started = clock()
    said = False
    while True:
        try:
            return find_log_dir(path)[0]
        except NotARunError as error:
            if not _may_appear(path):
                raise
            waited = clock() - started
            if wait_s is not None and waited >= wait_s:
                if wait_s <= 0:
                    raise
                raise NotARunError(f"{error} (waited {wait_s:g} s for the job to write its files: --wait)") from None
            if not said:
                said = True
                limit = "until it does (Ctrl-C to stop)" if wait_s is None else f"for up to {wait_s:g} s (--wait)"
                say(f"watch: {error}: waiting for the job to write its files there, {limit}")
        sleep(poll_s if wait_s is None else max(0.0, min(poll_s, wait_s - (clock() - started))))


def parse_seconds(text: str) -> float:
    """A duration as ``watch``'s options take it: seconds (``90``, ``2.5``, ``90s``), minutes (``10m``) or hours (``1h``).

    Example:
        >>> parse_seconds("90"), parse_seconds("10m"), parse_seconds("1.5h"), parse_seconds("45s")
        (90.0, 600.0, 5400.0, 45.0)
        >>> parse_seconds("soon")
        Traceback (most recent call last):
        ...
        ValueError: expected a duration such as 30, 45s, 10m or 1h, got 'soon'
    """
    value = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(value[-1:], None)
    number = value[:-1] if scale is not None else value
    try:
        seconds = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"expected a duration such as 30, 45s, 10m or 1h, got {text!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"expected a duration of 0 s or more, got {text!r}")
    return seconds


def _may_appear(path: str) -> bool:
    """Whether a path that is not a run yet may become one: it does not exist yet, or is a folder the logger writes into."""
    if not os.path.lexists(path):
        return True
    if not os.path.isdir(path):
        return False
    try:
        os.listdir(path)
    except OSError:
        return False
    return True


class Watch:
    """One run followed live (see the module docstring).

    Example:
        >>> # watch = Watch("outputs"); frame, events = watch.refresh()
    """

    def __init__(self, path: str, *, rules: Rules | None = None, trigger: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.follower = RunFollower(path)
        self.detector = Detector(rules)
        self.trigger = trigger
        self.clock = clock
        self.triggered: list[float] = []
        self.trigger_error: str | None = None
        #: Per process (its active JSONL path): its faulthandler side file, and that file's mtime when last parsed.
        self._side_files: dict[str, str] = {}
        self._side_file_seen: dict[str, int] = {}

    def refresh(self, now: float | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Read what is new, evaluate, and return (frame, events)."""
        cpu = time.process_time()
        now = self.clock() if now is None else now
        batch = self.follower.poll(now)
        detector = self.detector
        for cursor in batch.new:
            detector.observe(cursor.process.base, _identity(cursor.process), (), self._arrival(cursor, now))
        for cursor, records in batch.records:
            detector.observe(cursor.process.base, _identity(cursor.process), records, self._arrival(cursor, now))
        for cursor in self.follower.cursors.values():
            detector.file_facts(cursor.process.base, torn_since=cursor.torn_since, gone=cursor.gone)
        if detector.suspected or any(key[0] == "hang" for key in detector.book.active):
            self._read_side_files(now)
        frame, events = detector.evaluate(now)
        if detector.want_black_box:
            detector.want_black_box = False
            if self.trigger:
                self._touch(now)
        frame["run_dir"] = self.follower.run_dir
        frame["black_box_requested_utc"] = [_utc(t) for t in self.triggered[-3:]]
        if self.trigger_error:
            frame["trigger_error"] = self.trigger_error
        frame["read"] = {"files": len(self.follower.cursors), "bytes": batch.bytes_read, "skipped_lines": self.follower.skipped.count,
                         "cpu_s": round(time.process_time() - cpu, 4)}
        return frame, events

    def _read_side_files(self, now: float) -> None:
        """While a hang is suspected or raised: the faulthandler side files of the processes with no black box since their last progress.

        A rank stuck in a C call that holds the interpreter lock cannot write
        its ``stall`` record; its faulthandler dump (the side file beside its
        JSONL file, named as `hang.side_file_of` finds it: the opening record's
        ``stacks_file``, else `schema.stacks_file_name`) is then the only
        line of code there is. One ``stat`` per such process and refresh; a
        file is parsed again only when it changed.
        """
        for process in self.detector.current():
            box = process.black_box
            if box is not None and box.arrival >= (process.progress_arrival or 0.0):
                continue
            path = self._side_files.get(process.key)
            if path is None:
                path = self._side_files[process.key] = side_file_of(process.key)
            try:
                changed = os.stat(path).st_mtime_ns
            except OSError:
                continue
            if self._side_file_seen.get(process.key) == changed:
                continue
            self._side_file_seen[process.key] = changed
            dump = read_faulthandler_stacks(path)
            if dump is not None:
                process.apply_stacks(dump, now)

    @staticmethod
    def _arrival(cursor: Any, now: float) -> float:
        # What a first read finds was written before `watch` started: it arrived when the file was last written.
        if cursor.reads <= 1 and cursor.mtime is not None:
            return min(now, cursor.mtime)
        return now

    def _touch(self, now: float) -> None:
        try:
            with open(self.trigger, "ab"):  # type: ignore[arg-type]
                pass
            os.utime(self.trigger, None)  # type: ignore[arg-type]
            self.triggered.append(now)
            self.trigger_error = None
        except OSError as error:
            self.trigger_error = f"cannot touch the dump trigger {self.trigger}: {error.strerror or error}"


def _identity(process: Any) -> dict[str, Any]:
    return {"label": process.label, "source": process.source, "rank": process.rank, "attempt": process.attempt, "run_id": process.run_id,
            "host": process.host_name, "world_size": process.world_size, "pid": process.pid}


def _utc(seconds: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def run_watch(path: str, *, interval: float = 2.0, once: bool = False, json_lines: bool = False, exit_on: tuple[str, ...] = (), trigger: str | None = None,
              rules: Rules | None = None, out: TextIO | None = None, plain: bool | None = None, max_refreshes: int | None = None,
              frame_facts: Callable[[], dict[str, Any]] | None = None) -> int:
    """The command's loop; returns the exit status (0, or `EXIT_ALERT` for ``--exit-on``). Ctrl-C ends it with 0.

    `frame_facts`: what the records' source adds to each frame as ``receive`` (``watch --otlp``: the receiver's counts).
    """
    out = out if out is not None else sys.stdout
    watch = Watch(path, rules=rules, trigger=trigger)
    screen = None if json_lines else Screen(out, plain=plain)
    refreshes = 0
    try:
        while True:
            started = time.monotonic()
            frame, events = watch.refresh()
            if frame_facts is not None:
                frame["receive"] = frame_facts()
            refreshes += 1
            if json_lines:
                lines = [json_bytes(event) for event in events] + [json_bytes(frame)]
                out.write("".join(line.decode() + "\n" for line in lines))
                out.flush()
            else:
                screen.show(frame, events)  # type: ignore[union-attr]
            hit = [e for e in events if e["type"] == "alert" and e["kind"] in exit_on and e.get("confirmed")]
            if hit:
                if screen is not None:
                    screen.close(f"exit {EXIT_ALERT}: {hit[0]['message']}")
                return EXIT_ALERT
            if once or (max_refreshes is not None and refreshes >= max_refreshes):
                if screen is not None:
                    screen.close(None)
                return 0
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        if screen is not None:
            screen.close(None)
        return 0

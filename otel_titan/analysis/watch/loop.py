"""`otel-titan watch`: follow a running job, refresh the detector, show the frame, ask for black
boxes.

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
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

from otel_titan.analysis.model.hang import read_faulthandler_stacks, side_file_of
from otel_titan.analysis.read.follow import RunFollower
from otel_titan.analysis.read.processes_here import alive_here
from otel_titan.analysis.read.records import NotARunError, find_log_dir
from otel_titan.analysis.read.safe_text import json_bytes
from otel_titan.analysis.watch.alerts import Alert
from otel_titan.analysis.watch.detect import Detector, Rules
from otel_titan.analysis.watch.screen import Screen
from otel_titan.environment_variables import OTEL_TITAN_DUMP_TRIGGER

__all__ = [
    "Watch",
    "run_watch",
    "wait_for_run",
    "parse_seconds",
    "parse_exit_on",
    "EXIT_ALERT",
    "EXIT_ON_KINDS",
    "TRIGGER_ENV",
    "default_trigger",
]

#: Exit status of ``--exit-on`` when a confirmed alert of one of its kinds is raised.
EXIT_ALERT = 3
#: Alerts ``--exit-on`` may name: never ``slow`` (killing 1,024 GPUs over a slowdown is the
#: operator's call).
EXIT_ON_KINDS = ("hang", "crashed", "terminated", "missing")
#: The writer's variable (`structured_logger.lifecycle.DUMP_TRIGGER_ENV`; the reader may not import
#: the writer).
TRIGGER_ENV = OTEL_TITAN_DUMP_TRIGGER


def default_trigger(run_dir: str) -> str:
    """The trigger file `watch` touches: ``$OTEL_TITAN_DUMP_TRIGGER`` when set here, else
    ``RUN_DIR/dump-now``."""
    return os.environ.get(TRIGGER_ENV, "").strip() or os.path.join(run_dir, "dump-now")


def wait_for_run(
    path: str,
    *,
    wait_s: float | None,
    say: Callable[[str], None],
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Return the run directory of `path` once it is a run; until then wait, saying so once through
    `say`.

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
                raise NotARunError(
                    f"{error} (waited {wait_s:g} s for the job to write its files: --wait)"
                ) from None
            if not said:
                said = True
                limit = (
                    "until it does (Ctrl-C to stop)"
                    if wait_s is None
                    else f"for up to {wait_s:g} s (--wait)"
                )
                say(f"watch: {error}: waiting for the job to write its files there, {limit}")
        sleep(poll_s if wait_s is None else max(0.0, min(poll_s, wait_s - (clock() - started))))


def parse_seconds(text: str) -> float:
    """A duration as ``watch``'s options take it: seconds (``90``, ``2.5``, ``90s``), minutes
    (``10m``) or hours (``1h``).

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
    """Whether a path that is not a run yet may become one: it does not exist yet, or is a folder
    the logger writes into."""
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

    def __init__(
        self,
        path: str,
        *,
        rules: Rules | None = None,
        trigger: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.follower = RunFollower(path)
        self.detector = Detector(rules)
        self.trigger = trigger
        self.clock = clock
        self.triggered: list[float] = []
        self.trigger_error: str | None = None
        #: Per process (its active JSONL path): its faulthandler side file, and that file's mtime
        #: when last parsed.
        self._side_files: dict[str, str] = {}
        self._side_file_seen: dict[str, int] = {}

    def refresh(self, now: float | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Read what is new, evaluate, and return (frame, events)."""
        cpu = time.process_time()
        now = self.clock() if now is None else now
        batch = self.follower.poll(now)
        detector = self.detector
        for cursor in batch.new:
            detector.observe(
                cursor.process.base, _identity(cursor.process), (), self._arrival(cursor, now)
            )
        for cursor, records in batch.records:
            detector.observe(
                cursor.process.base,
                _identity(cursor.process),
                records,
                now,
                self._arrivals(cursor, records, now),
            )
        for cursor in self.follower.cursors.values():
            state = detector.processes.get(cursor.process.base)
            detector.file_facts(
                cursor.process.base,
                torn_since=cursor.torn_since,
                gone=cursor.gone,
                # the process table, where the writer ran on this host: what its records cannot say
                alive=None
                if state is None or state.closed
                else alive_here(
                    state.host,
                    state.pid,
                    state.opened_us if state.opened_us is not None else state.first_us,
                ),
            )
        stopped = detector.suspected or any(key[0] == "hang" for key in detector.book.active)
        if stopped:
            self._read_side_files(now)
        frame, events = detector.evaluate(now)
        if (
            not stopped
            and (detector.suspected or any(key[0] == "hang" for key in detector.book.active))
            and self._read_side_files(now)
        ):
            # A hang seen at once (files already still for long: `--once`, a watch started on a
            # stuck job) may have a faulthandler dump waiting beside a rank's file: its line of code
            # goes into the alert before anyone acts on it.
            frame, more = detector.evaluate(now)
            events = events + more
        if detector.want_black_box:
            detector.want_black_box = False
            if self.trigger:
                self._touch(now)
        assert frame is not None  # evaluated with its frame (`with_frame` is True by default)
        frame["run_dir"] = self.follower.run_dir
        frame["black_box_requested_utc"] = [_utc(t) for t in self.triggered[-3:]]
        if self.trigger_error:
            frame["trigger_error"] = self.trigger_error
        frame["read"] = {
            "files": len(self.follower.cursors),
            "bytes": batch.bytes_read,
            "skipped_lines": self.follower.skipped.count,
            "cpu_s": round(time.process_time() - cpu, 4),
        }
        return frame, events

    def _read_side_files(self, now: float) -> bool:
        """While a hang is suspected or raised: the faulthandler side files of the processes with no
        black box since their last progress.

        A rank stuck in a C call that holds the interpreter lock cannot write
        its ``stall`` record; its faulthandler dump (the side file beside its
        JSONL file, named as `hang.side_file_of` finds it: the opening record's
        ``stacks_file``, else `schema.stacks_file_name`) is then the only
        line of code there is. One ``stat`` per such process and refresh; a
        file is parsed again only when it changed. True when a dump was taken as a black box.
        """
        taken = False
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
            if dump is not None and process.apply_stacks(dump, now):
                taken = True
        return taken

    @staticmethod
    def _arrival(cursor: Any, now: float) -> float:
        # What a first read finds was written before `watch` started: it arrived when the file was
        # last written.
        if cursor.reads <= 1 and cursor.mtime is not None:
            return min(now, cursor.mtime)
        return now

    @staticmethod
    def _arrivals(cursor: Any, records: list[dict[str, Any]], now: float) -> list[float] | None:
        """For a first read, when each record was written, on the watcher's clock; None for a later
        one (all read `now`).

        What a first read finds was written before `watch` started. Anchored
        at the file's modification time (the newest record's write), each
        record earlier by its own distance from the newest on the writer's
        clock (differences on one clock: no host offset enters). A hung rank
        whose logger still writes a heartbeat every 10 s has a fresh file but
        an old last progress: `watch --once` sees how long it has been stuck.
        """
        if cursor.reads > 1 or cursor.mtime is None or not records:
            return None
        newest = max(record["time_us"] for record in records)
        written = min(now, cursor.mtime)
        return [min(written, written - (newest - record["time_us"]) / 1e6) for record in records]

    def _touch(self, now: float) -> None:
        try:
            with open(self.trigger, "ab"):  # type: ignore[arg-type]  # called with a trigger only
                pass
            os.utime(self.trigger, None)  # type: ignore[arg-type]  # called with a trigger only
            self.triggered.append(now)
            self.trigger_error = None
        except OSError as error:
            self.trigger_error = (
                f"cannot touch the dump trigger {self.trigger}: {error.strerror or error}"
            )


def _identity(process: Any) -> dict[str, Any]:
    return {
        "label": process.label,
        "source": process.source,
        "rank": process.rank,
        "attempt": process.attempt,
        "run_id": process.run_id,
        "host": process.host_name,
        "world_size": process.world_size,
        "pid": process.pid,
    }


def _utc(seconds: float) -> str:
    import datetime

    return (
        datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def parse_exit_on(text: str) -> dict[str, float]:
    """``--exit-on``'s value: kinds, each with how long its confirmed alert must have lasted
    (``hang:10m``; none: at once).

    Page early, kill late: the alert is raised (on the screen, in ``--json``)
    as soon as it is confirmed; the command exits only once it has held for
    its limit, so a storage hiccup the job recovers from is shown and resolved
    rather than cancelling the job. Raises ValueError naming what is wrong.

    Example:
        >>> parse_exit_on("hang:10m,crashed")
        {'hang': 600.0, 'crashed': 0.0}
        >>> parse_exit_on("hang,slow")
        Traceback (most recent call last):
        ...
        ValueError: slow is not one of hang, crashed, terminated, missing (never slow: stopping a job over a slowdown is the operator's call)
    """
    limits: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind, _, limit = part.partition(":")
        kind = kind.strip()
        if kind not in EXIT_ON_KINDS:
            raise ValueError(
                f"{kind} is not one of {', '.join(EXIT_ON_KINDS)} (never slow: stopping a job "
                "over a slowdown is the operator's call)"
            )
        try:
            limits[kind] = parse_seconds(limit) if limit.strip() else 0.0
        except ValueError as error:
            raise ValueError(f"{part}: {error}") from None
    return limits


def _exit_alert(
    active: Iterable[Alert], limits: dict[str, float], now: float
) -> tuple[Alert, float] | None:
    """The first confirmed active alert of a kind in `limits` that has lasted its limit, and how
    long it has; None when none has."""
    for alert in sorted(active, key=lambda a: a.detected or 0.0):
        if alert.kind not in limits or not alert.confirmed:
            continue
        lasted = now - (
            alert.since
            if alert.since is not None
            else alert.detected
            if alert.detected is not None
            else now
        )
        if lasted >= limits[alert.kind]:
            return alert, max(0.0, lasted)
    return None


def run_watch(
    path: str,
    *,
    interval: float = 2.0,
    once: bool = False,
    json_lines: bool = False,
    exit_on: tuple[str, ...] | Mapping[str, float] = (),
    trigger: str | None = None,
    rules: Rules | None = None,
    out: TextIO | None = None,
    plain: bool | None = None,
    max_refreshes: int | None = None,
    frame_facts: Callable[[], dict[str, Any]] | None = None,
) -> int:
    """The command's loop; returns the exit status (0, or `EXIT_ALERT` for ``--exit-on``). Ctrl-C
    ends it with 0.

    `exit_on`: alert kinds (exit at the first confirmed one), or kind → seconds
    (`parse_exit_on`: exit once a confirmed alert of that kind has lasted that long).

    `frame_facts`: what the records' source adds to each frame as ``receive`` (``watch --otlp``: the
    receiver's counts).
    """
    out = out if out is not None else sys.stdout
    limits = dict(exit_on) if isinstance(exit_on, Mapping) else {kind: 0.0 for kind in exit_on}
    watch = Watch(path, rules=rules, trigger=trigger)
    screen = None if json_lines else Screen(out, plain=plain)
    refreshes = 0
    try:
        while True:
            started = time.monotonic()
            now = watch.clock()
            frame, events = watch.refresh(now)
            if frame_facts is not None:
                frame["receive"] = frame_facts()
            refreshes += 1
            if json_lines:
                lines = [json_bytes(event) for event in events] + [json_bytes(frame)]
                out.write("".join(line.decode() + "\n" for line in lines))
                out.flush()
            else:
                screen.show(frame, events)  # type: ignore[union-attr]  # a screen unless --json
            hit = _exit_alert(watch.detector.book.active.values(), limits, now)
            if hit is not None:
                alert, lasted = hit
                why = f"exit {EXIT_ALERT}: {alert.message}" + (
                    f" (for {lasted:,.0f} s: --exit-on {alert.kind}:{limits[alert.kind]:g}s)"
                    if limits[alert.kind]
                    else ""
                )
                if screen is not None:
                    screen.close(why)
                else:
                    out.write(
                        json_bytes(
                            {
                                "type": "exit",
                                "status": EXIT_ALERT,
                                "kind": alert.kind,
                                "id": alert.to_json()["id"],
                                "message": why,
                                "lasted_s": round(lasted, 1),
                                "limit_s": limits[alert.kind],
                            }
                        ).decode()
                        + "\n"
                    )
                    out.flush()
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

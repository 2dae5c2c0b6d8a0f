"""Live analysis: `otel-titan watch` names the hung or slowing rank while the job runs.

It stands on `otel_titan.analysis.read.follow` (the incremental read of a
run folder: only the bytes appended since the last refresh; rotation, new and
vanished files, torn lines and NUL tails). Layers, each importing only those
below: `state` (one process as its
records say) → `alerts` and `detect` (the rules: a pure function of the
records read and when, so runs can be replayed faster than real time) →
`screen` (rich or plain lines) → `loop` (the command's loop, the dump
trigger) and `replay` (generated runs through the detector at any speed).

Example:
    >>> from otel_titan.analysis.watch import Watch
    >>> # frame, events = Watch("outputs").refresh()
"""

from otel_titan.analysis.read.follow import RunFollower
from otel_titan.analysis.watch.alerts import Alert, AlertBook
from otel_titan.analysis.watch.detect import Detector, Rules
from otel_titan.analysis.watch.loop import EXIT_ALERT, Watch, run_watch
from otel_titan.analysis.watch.state import ProcessState

__all__ = [
    "Alert",
    "AlertBook",
    "Detector",
    "EXIT_ALERT",
    "ProcessState",
    "Rules",
    "RunFollower",
    "Watch",
    "run_watch",
]

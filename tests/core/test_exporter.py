"""The declared exporter interface (core/exporter.py): each hook reaches exporters that declare it,
and only those."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_titan.core.exporter import (
    Discardable,
    Drainable,
    ForkAware,
    HeartbeatAware,
    StartAwareSpanExporter,
    TitanSpanExporter,
    close_exporter_after_fork,
    discard_exporter,
    drain_exporter,
)
from otel_titan.exporters.jsonl import JsonlSpanExporter
from otel_titan.exporters.queued import QueuedSpanExporter
from tests.conftest import REPO


class _Plain(SpanExporter):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def export(self, spans):
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.calls.append("shutdown")


class _Hooked(TitanSpanExporter):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def export(self, spans):
        return SpanExportResult.SUCCESS

    def discard(self) -> None:
        self.calls.append("discard")

    def drain(self, timeout: float) -> bool:
        self.calls.append(f"drain {timeout}")
        return False

    def close_after_fork(self) -> None:
        self.calls.append("close_after_fork")


def test_a_plain_sdk_exporter_gets_no_hook_it_did_not_declare():
    plain = _Plain()
    assert not isinstance(plain, (Drainable, Discardable, ForkAware, HeartbeatAware))
    assert drain_exporter(plain, 1.0) is True  # nothing of its own in flight
    close_exporter_after_fork(plain)
    assert plain.calls == []
    discard_exporter(plain)  # undoing a failed init: shutdown is all it has
    assert plain.calls == ["shutdown"]


def test_declared_hooks_are_called():
    hooked = _Hooked()
    assert drain_exporter(hooked, 2.5) is False
    discard_exporter(hooked)
    close_exporter_after_fork(hooked)
    assert hooked.calls == ["drain 2.5", "discard", "close_after_fork"]


def test_the_defaults_are_harmless():
    class Minimal(StartAwareSpanExporter):
        def export_timeline(self, timeline):
            return SpanExportResult.SUCCESS

    minimal = Minimal()
    assert isinstance(minimal, (Drainable, Discardable, ForkAware, HeartbeatAware))
    assert minimal.drain(0.1) is True
    minimal.close_after_fork()
    minimal.heartbeat(0, [])
    minimal.discard()  # = shutdown


def test_the_library_exporters_declare_what_they_implement():
    assert isinstance(QueuedSpanExporter, type) and issubclass(
        QueuedSpanExporter, TitanSpanExporter
    )
    assert issubclass(JsonlSpanExporter, StartAwareSpanExporter)
    for hook in ("discard", "close_after_fork", "heartbeat"):
        assert getattr(JsonlSpanExporter, hook) is not getattr(StartAwareSpanExporter, hook), hook
    assert QueuedSpanExporter.drain is not TitanSpanExporter.drain


_USER_EXPORTERS = r"""
import json, os, sys, time
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from otel_titan import structured_logger as sl
from otel_titan.core.exporter import TitanSpanExporter

LOG = sys.argv[2]

def note(**entry):
    with open(LOG, "a") as handle:
        handle.write(json.dumps(entry) + "\n")

class Network(TitanSpanExporter):          # declares the hook by subclassing
    def export(self, spans):
        note(who="network", call="export", spans=len(spans))
        return SpanExportResult.SUCCESS
    def drain(self, timeout):
        note(who="network", call="drain", timeout=timeout)
        return True

class DuckTyped(SpanExporter):             # an SDK exporter that just has the method
    def export(self, spans):
        return SpanExportResult.SUCCESS
    def shutdown(self):
        pass
    def drain(self, timeout):
        note(who="duck", call="drain", timeout=timeout)
        return True

def factory(add_span_exporter, **_):
    add_span_exporter(Network())
    add_span_exporter(DuckTyped())

sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1, handlers=[factory], flush_interval_s=10, exit_timeout_s=3)
with sl.log_trace_span("fwd_bwd"):
    pass
with sl.log_trace_span("data_fetch"):
    print("ready", flush=True)
    time.sleep(60)
"""


def test_a_users_exporter_is_drained_on_sigterm_like_ours(tmp_path):
    log = tmp_path / "calls.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-c", _USER_EXPORTERS, str(tmp_path / "run"), str(log)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        process.stdout.close()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    network = [c["call"] for c in calls if c["who"] == "network"]
    # The SIGTERM flush exported the finished span (and the open one, marked incomplete), then drain
    # ran.
    assert network[-1] == "drain" and "export" in network[:-1]
    drains = {c["who"]: c["timeout"] for c in calls if c["call"] == "drain"}
    assert set(drains) == {"network", "duck"}
    assert all(0 < timeout <= 3 for timeout in drains.values())  # what is left of exit_timeout_s

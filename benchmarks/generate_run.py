"""Generate a realistic multi-rank training run in otel-titan's JSONL record format, with known
faults.

Why: the analysis must be tested and measured at the scale users run at
(hundreds to thousands of ranks, gigabytes of JSONL), with faults whose
answer is known. Running the real library on 1,024 ranks is not possible
here, so this writes, record for record, what the library writes
(docs/schema.md: the ``structured_logger_opened`` line, ``_start``/``_end``
pairs with span ids, trace ids per step, ``seq_id``, identity fields, the
closing record), from a simulation of synchronous data-parallel training:

* ranks on hosts of 8 (``node-000`` …); each step runs ``data_fetch``,
  ``fwd_bwd`` (``fwd`` then ``bwd`` inside), ``optimizer``, a ``loss`` scalar,
  then the step-closing collective ``all_reduce``: every rank waits in it for
  the last to arrive, and all leave it together (in true time, within a few
  µs), then the next step begins;
* every phase has multiplicative noise (lognormal, ``noise`` sigma);
* every host's clock is off by a constant drawn from ±``offset_ms``: the
  timestamps a rank writes are true time + its host's offset; the hosts in
  ``drift_hosts`` also drift, linearly, by ``drift_ms`` over the run (NTP
  leaves milliseconds of drift on multi-host jobs);
* with ``pp`` > 1, a pipeline-parallel mesh ``{"pp": pp, "dp": ranks // pp}``
  (laid out as ``init_device_mesh`` does: rank = stage × dp + dp index), each
  rank's coordinates in its ``structured_logger_opened`` record; the last
  stage's ``fwd`` is longer by ``last_stage_fwd_pct`` % on every rank of it
  (by design, not a fault: it holds the loss);
* faults, each optional: a *straggler* rank slower by ``pct`` % in one phase;
  a *hung* rank that stops inside ``bwd`` at a step (the others then stop
  inside that step's ``all_reduce``, waiting for it), or between spans after
  ``optimizer`` (``hung_between``); *missing* ranks with no file; a *crashed* rank
  (SIGKILL-like: its last line torn mid-write, no closing record; torchrun's
  agent then sends SIGTERM to the others, stuck in ``all_reduce``); a
  *restart* (the crash, then a second attempt of every rank from the last
  checkpoint, to the end).

Every rank also writes its ``step_rollup`` records, as the library does by
default (docs/schema.md, "Step rollups"; ``--no-rollups`` / ``RunSpec.rollups``
leaves them out), summed from the records written with the library's own
rule for the step-closing span (`schema.StepCloser`), so that scale tests and
benchmarks meet the files users have.

The ground truth (offsets, fault ranks) is returned and written to
``<out>/ground_truth.json`` (outside ``structured_logs/``).

Usage::

    python benchmarks/generate_run.py /tmp/run --ranks 1024 --steps 200      # about 2 GB
    python benchmarks/generate_run.py /tmp/run --ranks 64 --steps 50 --hung 17@30
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import orjson

from otel_titan.schema import MetaEvent, StepCloser, heartbeat_fields, rollup_fields

__all__ = ["RunSpec", "generate_run", "PHASES", "COLLECTIVE", "RANKS_PER_HOST"]

RANKS_PER_HOST = 8
#: Phase → median duration in ms. fwd and bwd run inside fwd_bwd.
PHASES = {"data_fetch": 4.0, "fwd": 30.0, "bwd": 60.0, "optimizer": 8.0}
#: The step-closing collective, and its duration once the last rank arrived (ms).
COLLECTIVE = "all_reduce"
COLLECTIVE_MS = 2.0
#: Between leaving the collective and the next step's first record (ms).
GAP_MS = 0.05
#: How far apart (µs, |normal| sigma) ranks leave the collective in true time.
EXIT_JITTER_US = 5.0
_CKPT_EVERY = 10
#: The watchdog's threshold in generated black boxes: the default floor
#: (`core.blackbox.DEFAULT_MIN_STALL_S`).
STALL_AFTER_US = 120e6
#: After a peer crashed, how long the others wait in the collective before the launcher's SIGTERM.
SIGTERM_AFTER_US = 30e6


@dataclass
class RunSpec:
    """What to generate; see the module docstring. Faults: ``(rank, step)``; straggler ``(rank,
    phase, pct)``."""

    ranks: int = 16
    steps: int = 20
    seed: int = 0
    offset_ms: float = 5.0
    noise: float = 0.03
    run_id: str = "gen-run"
    start_us: int | None = None
    straggler: tuple[int, str, float] | None = None
    hung: tuple[int, int] | None = None
    crashed: tuple[int, int] | None = None
    restart: tuple[int, int] | None = None
    ranks_per_host: int = RANKS_PER_HOST
    scalars: int = 1
    host_offsets_us: list[float] = field(default_factory=list)
    #: Hosts (indices) whose clocks drift by `drift_ms` from the start of the run to its end, on top
    #: of their offset.
    drift_hosts: tuple[int, ...] = ()
    drift_ms: float = 0.0
    #: Pipeline stages (a ``pp`` × ``dp`` mesh) and how much longer the last stage's forward is, by
    #: design.
    pp: int = 1
    last_stage_fwd_pct: float = 0.0
    #: How far apart (µs, |normal| sigma) ranks leave the collective in true time: milliseconds make
    #: it no moment at all.
    exit_jitter_us: float = EXIT_JITTER_US
    #: With `hung`: each stuck rank (the hung one and those waiting for it) also writes its black
    #: box, the ``stall`` record the real writer's watchdog writes after `stall_after_s` with no
    #: progress (120 s, the default floor), naming its open spans. Off by default: a run killed
    #: before the watchdog fired has none.
    black_boxes: bool = False
    host_drifts: list[float] = field(default_factory=list)
    # -- for `otel-titan watch` (benchmarks/watch_live.py); every default leaves the run as it was
    # -----------
    #: Median step time in ms (the phases scaled to it); None: the phases' own sum, about 104 ms.
    step_ms: float | None = None
    #: The straggler's slowdown starts at this step (a fail-slow onset); None: from the first step.
    slow_from: int | None = None
    #: ... and ends after this step (a slowdown that comes and goes); None: to the last step.
    slow_to: int | None = None
    #: The straggler's whole host is slow (every rank on it), not only its rank.
    slow_host: bool = False
    #: Every host's clock drifts by a random amount of up to ±this many ms over the run (NTP drift;
    #: `drift_ms` with `drift_hosts` drifts chosen hosts by exactly that much).
    host_drift_ms: float = 0.0
    #: With `pp` > 1: stage k's fwd and bwd take (1 + k × stage_pct / 100) times as long (stages
    #: differ by design).
    stage_pct: float = 0.0
    #: Step lengths that vary together (variable sequence lengths): a per-step factor shared by
    #: every rank (lognormal sigma).
    variable: float = 0.0
    #: Every `pause_every` steps every rank runs a `checkpoint` span of `pause_ms` (a long pause all
    #: ranks share).
    pause_every: int = 0
    pause_ms: float = 0.0
    #: Every rank slower in one phase from one step on (storage, network): ``(phase, pct,
    #: from_step)``.
    job_slow: tuple[str, float, int] | None = None
    #: With `hung`: the hung rank stops *between spans* after its step's ``optimizer`` (host code
    #: outside any span: a data loader, a Python loop), never reaching the ``all_reduce`` the others
    #: wait in; its black box says ``between_spans``.
    hung_between: bool = False
    #: Ranks that write no file at all (never reached ``init_structured_logger``); the others still
    #: record ``world_size``.
    missing: tuple[int, ...] = ()
    #: With `hung`: the hung rank is not stuck but crawling inside ``bwd``: it writes a record every
    #: `crawl_every_s` seconds (a ``bwd_progress`` scalar, as a loop logging per layer does) until
    #: `crawl_s` after the hang began, while the others, waiting in ``all_reduce``, write their
    #: black boxes (with `black_boxes`).
    crawl_every_s: float = 0.0
    crawl_s: float = 200.0
    #: The writer's heartbeat interval (the opening record's ``heartbeat_interval_s``): a rank alive
    #: and quiet with spans open writes a ``heartbeat`` each interval, as the library does, while it
    #: hangs (up to `hang_s` after its last progress), waits for a crashed peer until the launcher's
    #: SIGTERM, or crawls. None: files as a writer before heartbeats left them (no field, none).
    heartbeat_s: float | None = 10.0
    #: With `hung`: how long the hang has lasted when the files are read (seconds after each stuck
    #: rank's last progress): its heartbeats run to it. The default reaches the black box.
    hang_s: float = STALL_AFTER_US / 1e6
    # -- one long run generated in chunks (benchmarks/watch_false_alarms.py: a job-day does not fit
    # on disk at once) ---
    #: The first step's number (a chunk continues the steps of the one before).
    first_step: int = 1
    #: Whether the files begin with the opening record (the first chunk) and end with the closing
    #: one (the last).
    opened: bool = True
    closed: bool = True
    #: The phases' noise from this seed (one per chunk), the clock offsets and each rank's own speed
    #: still from `seed`.
    noise_seed: int | None = None
    #: With `host_drift_ms`: the drift's origin (true time, µs) and the steps it spreads over
    #: (default: this run's).
    clock_origin_us: float | None = None
    drift_steps: int | None = None
    #: Write one ``step_rollup`` record per rank and step, as the library does by default
    #: (docs/schema.md, "Step rollups"): at the next step's first record, the last step's before the
    #: closing record, the step under way after a SIGTERM; none for a step a rank crashed or hung
    #: in. False: files as written with ``step_rollups=False`` (or by a version before rollups).
    rollups: bool = True


def _hosts(spec: RunSpec) -> int:
    return (spec.ranks + spec.ranks_per_host - 1) // spec.ranks_per_host


def _host_name(host: int) -> str:
    return f"node-{host:03d}"


def _stage_ranks(spec: RunSpec, stage: int) -> slice:
    """The ranks of one pipeline stage (pp-major, as ``init_device_mesh(("pp", "dp"))`` lays them
    out)."""
    per_stage = spec.ranks // spec.pp
    return slice(stage * per_stage, (stage + 1) * per_stage)


def _trace_id(run_id: str, attempt: int, step: int | None) -> str:
    key = (
        f"otel-titan|{run_id}|{attempt}|pre-step"
        if step is None
        else f"otel-titan|{run_id}|{attempt}|step|{step}"
    )
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _simulate(
    spec: RunSpec,
    attempt: int,
    first_step: int,
    last_step: int,
    start_us: float,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """True-time schedule of steps first_step..last_step: per rank and step, phase durations and the
    collective's exit."""
    n_steps = last_step - first_step + 1
    shape = (spec.ranks, n_steps)
    durations = {}
    # each rank's own small systematic speed
    speed = rng.lognormal(0.0, spec.noise / 6, size=(spec.ranks, 1))
    if spec.noise_seed is not None:
        # a chunk of a longer run: its own noise, the run's ranks
        rng = np.random.default_rng(spec.noise_seed)
    scale = 1.0 if spec.step_ms is None else spec.step_ms / (sum(PHASES.values()) + COLLECTIVE_MS)
    for phase, ms in PHASES.items():
        durations[phase] = scale * ms * speed * rng.lognormal(0.0, spec.noise, size=shape)
    tokens = None
    if spec.variable:
        shared = rng.lognormal(0.0, spec.variable, size=(1, n_steps))
        for phase in PHASES:
            durations[phase] = durations[phase] * shared
        tokens = np.round(4096 * shared[0])  # the job logs its tokens per step (a `tokens` scalar)
    if spec.pp > 1 and spec.last_stage_fwd_pct:
        durations["fwd"][_stage_ranks(spec, spec.pp - 1)] *= 1.0 + spec.last_stage_fwd_pct / 100.0
    if spec.pp > 1 and spec.stage_pct:
        for stage in range(1, spec.pp):
            for phase in ("fwd", "bwd"):
                durations[phase][_stage_ranks(spec, stage)] *= 1.0 + stage * spec.stage_pct / 100.0
    if spec.straggler is not None:
        rank, phase, pct = spec.straggler
        slow_ranks = (
            [
                r
                for r in range(spec.ranks)
                if r // spec.ranks_per_host == rank // spec.ranks_per_host
            ]
            if spec.slow_host
            else [rank]
        )
        onset = 0 if spec.slow_from is None else max(0, spec.slow_from - first_step)
        end = n_steps if spec.slow_to is None else max(0, spec.slow_to - first_step + 1)
        for r in slow_ranks:
            durations[phase][r, onset:end] *= 1.0 + pct / 100.0
    if spec.job_slow is not None:
        phase, pct, from_step = spec.job_slow
        durations[phase][:, max(0, from_step - first_step) :] *= 1.0 + pct / 100.0
    # between consecutive records, ms
    gaps = 0.010 * rng.lognormal(0.0, 0.3, size=(spec.ranks, n_steps, 8))
    work = sum(durations.values()) + gaps.sum(axis=2)
    pauses = np.zeros(n_steps)
    if spec.pause_every and spec.pause_ms:
        for i in range(n_steps):
            if (first_step + i) % spec.pause_every == 0:
                pauses[i] = spec.pause_ms
        work = work + pauses.reshape(1, -1)
    exits = np.empty(n_steps)
    begins = np.empty(n_steps)
    t = start_us
    for i in range(n_steps):
        begins[i] = t
        arrival = t + work[:, i] * 1000.0
        exits[i] = arrival.max() + scale * COLLECTIVE_MS * 1000.0 * float(
            rng.lognormal(0.0, spec.noise)
        )
        t = exits[i] + GAP_MS * 1000.0
    exit_jitter = np.abs(rng.normal(0.0, spec.exit_jitter_us, size=shape))
    return {
        "durations": durations,
        "gaps": gaps,
        "begins": begins,
        "exits": exits,
        "exit_jitter": exit_jitter,
        "first_step": first_step,
        "attempt": attempt,
        "pauses": pauses,
        "tokens": tokens,
    }


class _Writer:
    """One rank's file: records as the library writes them (docs/schema.md), identity fields spliced
    in as bytes."""

    def __init__(self, path: str, identity: dict[str, Any], tid: int) -> None:
        self.handle = open(path, "wb", buffering=1 << 20)
        self.tail = b"," + orjson.dumps(identity)[1:]
        # A rollup's short identity (docs/schema.md): who and which attempt.
        self.rollup_tail = (
            b","
            + orjson.dumps(
                {key: identity[key] for key in ("schema_version", "rank", "source", "attempt")}
            )[1:]
        )
        self.seq = 0
        self.tid = tid
        self.last_us: float | None = None
        self.span_counter = 0
        self.bytes = 0
        self.rollups = 0  # the logger's own lines, not counted in ``written_records``

    def span_id(self, rank: int) -> str:
        self.span_counter += 1
        return f"{rank & 0xFFFFFF:06x}{self.span_counter:010x}"

    def write(self, record: dict[str, Any], thread: bool = True) -> bytes:
        self.seq += 1
        time_us = int(record["time_us"])
        record["time"], record["time_ms"], record["time_us"] = (
            time_us // 1_000_000,
            time_us // 1000,
            time_us,
        )
        if thread:
            record["delta_ms"] = (
                0.0 if self.last_us is None else round((time_us - self.last_us) / 1000.0, 3)
            )
            record["tid"] = self.tid
            self.last_us = time_us
        record["seq_id"] = self.seq
        line = orjson.dumps(record)[:-1] + self.tail + b"\n"
        self.handle.write(line)
        self.bytes += len(line)
        return line

    def rollup(self, time_us: float, fields: dict[str, Any]) -> None:
        """A ``step_rollup`` record (`schema.rollup_fields`), stamped `time_us` (the latest record
        before it, as the library does)."""
        self.seq += 1
        self.rollups += 1
        time_us = int(time_us)
        record = {
            "time": time_us // 1_000_000,
            "time_ms": time_us // 1000,
            "time_us": time_us,
            "log_type": "instant",
            "log_type_name": MetaEvent.STEP_ROLLUP,
            **fields,
            "seq_id": self.seq,
        }
        line = orjson.dumps(record)[:-1] + self.rollup_tail + b"\n"
        self.handle.write(line)
        self.bytes += len(line)

    def close(self) -> None:
        self.handle.close()


_CALLER = {"caller": "train.py:88:train_step", "log_file": "train.py", "log_function": "train_step"}


def _write_rank(job: tuple) -> int:
    """Write one rank's file for one attempt; returns its size in bytes."""
    spec, rank, attempt, log_dir, sim, stop = job
    host = rank // spec.ranks_per_host
    offset = spec.host_offsets_us[host]
    # µs of drift per µs of true time
    host_drift = spec.host_drifts[host] if spec.host_drifts else 0.0
    pid = 10_000 + rank + 100_000 * attempt
    identity = {
        "schema_version": 1,
        "rank": rank,
        "global_rank": rank,
        "local_rank": rank % spec.ranks_per_host,
        "world_size": spec.ranks,
        "source": "training",
        "host_name": _host_name(host),
        "pid": pid,
        "run_id": spec.run_id,
        "attempt": attempt,
        "job_id": None,
        "logger_name": "otel_titan.structured_logger",
    }
    begins, exits = sim["begins"].tolist(), sim["exits"].tolist()
    start_true = begins[0] - 2000.0
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(start_true / 1e6))
    suffix = hashlib.sha256(f"{spec.run_id}|{rank}|{attempt}".encode()).hexdigest()[:6]
    path = os.path.join(log_dir, f"training.global_rank_{rank}.{stamp}-{suffix}.jsonl")
    w = _Writer(path, identity, pid)
    drift = spec.drift_ms * 1000.0 if host in spec.drift_hosts else 0.0
    span = max(exits[-1] - begins[0], 1.0)
    origin = spec.clock_origin_us if spec.clock_origin_us is not None else start_true

    def clock(true_us: float) -> float:
        """The host's wall clock at true time `true_us`."""
        return (
            true_us
            + offset
            + drift * (true_us - begins[0]) / span
            + host_drift * (true_us - origin)
        )

    if spec.opened:
        _opening(w, spec, rank, clock, start_true)
    pre = _trace_id(spec.run_id, attempt, None)
    if spec.opened:
        w.write(
            {
                "time_us": clock(start_true + 1000.0),
                "log_type": "instant",
                "log_type_name": "training_start",
                "event_name": None,
                **_CALLER,
                "log_level": "INFO",
                "message": "training_start",
                "trace_id": pre,
                "span_id": w.span_id(rank),
                "parent_span_id": None,
            }
        )
    _steps(spec, rank, attempt, w, sim, stop, clock)
    return w.bytes


def _opening(w: _Writer, spec: RunSpec, rank: int, clock: Any, start_true: float) -> None:
    """The ``structured_logger_opened`` record (docs/schema.md), with the rank's mesh coordinates
    under ``pp``."""
    w.write(
        {
            "time_us": clock(start_true),
            "log_type": "instant",
            "log_type_name": "structured_logger_opened",
            "event_name": None,
            "log_level": "INFO",
            "message": f"structured logger opened for training rank {rank}",
            "otel_titan_version": "0.1.0",
            "python_version": "3.11.7",
            "max_file_size_mb": 0.0,
            "backup_count": 0,
            "queue_size": 65536,
            **({} if spec.heartbeat_s is None else {"heartbeat_interval_s": spec.heartbeat_s}),
            **(
                {
                    "mesh": {
                        "pp": rank // (spec.ranks // spec.pp),
                        "dp": rank % (spec.ranks // spec.pp),
                    },
                    "mesh_shape": {"pp": spec.pp, "dp": spec.ranks // spec.pp},
                }
                if spec.pp > 1
                else {}
            ),
        },
        thread=False,
    )


def _steps(
    spec: RunSpec,
    rank: int,
    attempt: int,
    w: _Writer,
    sim: dict[str, Any],
    stop: tuple[int, str] | None,
    clock: Any,
) -> None:
    """Every step of one rank's file, its fault if any, then (unless a later chunk follows)
    training_end and the closing record."""
    first_step = sim["first_step"]
    begins, exits = sim["begins"].tolist(), sim["exits"].tolist()
    pauses = sim["pauses"].tolist()
    durations = {phase: values[rank].tolist() for phase, values in sim["durations"].items()}
    gaps = sim["gaps"][rank].tolist()
    jitter = sim["exit_jitter"][rank].tolist()
    stop_step, stop_kind = stop if stop is not None else (None, None)
    # The step being summed for its rollup: [step, begin_us, phases, open spans, latest record µs],
    # and the rule for its closing span.
    rolling: list[Any] = []
    closer = StepCloser()

    def roll(end_us: int, complete: bool, ended_by: str) -> None:
        if spec.rollups and rolling:
            step_of, begin_us, phases, open_spans, _ = rolling
            w.rollup(
                max(end_us, rolling[4]),
                rollup_fields(
                    step_of,
                    begin_us,
                    end_us,
                    phases,
                    closer.closing(step_of),
                    complete=complete,
                    ended_by=ended_by,
                    open_spans=open_spans,
                ),
            )
        rolling.clear()

    for i in range(len(begins)):
        step = first_step + i
        trace = _trace_id(spec.run_id, attempt, step)
        common = {"step": step, "relative_step": step - first_step + 1, "trace_id": trace}
        t = begins[i] + (jitter[i - 1] if i else 0.0)
        g = [x * 1000.0 for x in gaps[i]]

        def start(name: str, t_us: float, parent: str | None) -> str:
            sid = w.span_id(rank)
            line_us = int(clock(t_us))
            w.write(
                {
                    "time_us": line_us,
                    "log_type": "event",
                    "log_type_name": f"{name}_start",
                    "event_name": None,
                    **_CALLER,
                    "log_level": "INFO",
                    "message": f"[step {step}] {name} {name}_start",
                    "span_id": sid,
                    "parent_span_id": parent,
                    **common,
                }
            )
            if not rolling or rolling[0] != step:  # the step's first record: the one before is over
                roll(line_us, True, "next_step")
                rolling.extend([step, line_us, {}, 0, line_us])
            rolling[3] += 1
            rolling[4] = max(rolling[4], line_us)
            return sid

        def end(name: str, sid: str, parent: str | None, t0: float, t1: float) -> None:
            start_us = int(clock(t0))
            dur = (t1 - t0) / 1000.0
            end_us = start_us + round(t1 - t0)
            w.write(
                {
                    "time_us": end_us,
                    "log_type": "event",
                    "log_type_name": f"{name}_end",
                    "event_name": None,
                    **_CALLER,
                    "log_level": "INFO",
                    "message": f"[step {step}] {name} {name}_end took {dur:.3f} ms",
                    "value": round(dur, 6),
                    "span_id": sid,
                    "parent_span_id": parent,
                    **common,
                }
            )
            closer.span_ended(step, name, start_us, end_us, parent is None)
            phase = rolling[2].setdefault(name, [0, 0])
            phase[0] += 1
            phase[1] += end_us - start_us
            rolling[3] -= 1
            rolling[4] = max(rolling[4], end_us)

        def stopping(where: str) -> bool:
            return stop_step == step and stop_kind == where

        def heartbeats(quiet_since: float, until: float, open_spans: list[str]) -> None:
            """What the writer's processor writes while the rank is alive and quiet with spans
            open: a ``heartbeat`` each interval after `quiet_since`, up to `until` (true µs)."""
            if not spec.heartbeat_s or not open_spans:
                return
            every = spec.heartbeat_s * 1e6
            at = quiet_since + every
            while at <= until:
                w.write(
                    {
                        "time_us": clock(at),
                        "log_type": "instant",
                        "log_type_name": MetaEvent.HEARTBEAT,
                        "event_name": None,
                        "log_level": "INFO",
                        **heartbeat_fields(open_spans),
                    },
                    thread=False,
                )
                at += every

        def black_box(
            t_us: float,
            open_spans: list[tuple[str, str, float]],
            between: tuple[str, float] | None = None,
        ) -> None:
            """The watchdog's ``stall`` record, `STALL_AFTER_US` after the last progress at `t_us`
            (docs/schema.md); `between`: (last span, its end)."""
            if not spec.black_boxes:
                return
            at = t_us + STALL_AFTER_US
            rows = [
                {
                    "name": name,
                    "span_id": span_id,
                    "tid": w.tid,
                    "thread_name": "MainThread",
                    "task_name": None,
                    "step": step,
                    "caller": _CALLER["caller"],
                    "open_s": round((at - began) / 1e6, 3),
                }
                for name, span_id, began in open_spans
            ]
            last = (
                {"name": between[0], "ended_s_ago": round((at - between[1]) / 1e6, 3)}
                if between
                else None
            )
            w.write(
                {
                    "time_us": clock(at),
                    "log_type": "instant",
                    "log_type_name": "stall",
                    "event_name": None,
                    "log_level": "WARNING",
                    "message": f"stall: no span ended for {STALL_AFTER_US / 1e6:.1f} s; "
                    + (
                        f"between spans after {between[0]}"
                        if between
                        else f"open: {', '.join(r['name'] for r in rows)}"
                    ),
                    "reason": "stall",
                    "stalled_s": STALL_AFTER_US / 1e6,
                    "stall_after_s": STALL_AFTER_US / 1e6,
                    "where": "between_spans" if between else "in_span",
                    "step": step,
                    "last_span": last,
                    "open_spans": rows,
                    "threads": [],
                    "flight_recorder": None,
                },
                thread=False,
            )

        sid = start("data_fetch", t, None)
        t1 = t + durations["data_fetch"][i] * 1000.0
        end("data_fetch", sid, None, t, t1)
        t = t1 + g[0]
        outer = start("fwd_bwd", t, None)
        t_outer = t
        t += g[1]
        sid = start("fwd", t, outer)
        t1 = t + durations["fwd"][i] * 1000.0
        if stopping("crash"):
            line = w.write(
                {
                    "time_us": clock(t1),
                    "log_type": "event",
                    "log_type_name": "fwd_end",
                    "event_name": None,
                    **_CALLER,
                    "log_level": "INFO",
                    "message": f"[step {step}] fwd fwd_end",
                    "value": 1.0,
                    "span_id": sid,
                    "parent_span_id": outer,
                    **common,
                }
            )
            w.handle.seek(w.handle.tell() - len(line))
            w.handle.truncate()
            # SIGKILL mid-write: a torn last line, no newline
            w.handle.write(line[: len(line) // 2])
            w.close()
            return
        end("fwd", sid, outer, t, t1)
        t = t1 + g[2]
        sid = start("bwd", t, outer)
        if stopping("hang") and not spec.hung_between:
            if spec.crawl_every_s:
                # Crawling, not stuck: a record every crawl_every_s from inside bwd, long after the
                # others' watchdogs fired.
                every_us, began = spec.crawl_every_s * 1e6, t
                while t + every_us <= began + spec.crawl_s * 1e6:
                    # quiet between its records: a heartbeat in each gap longer than the interval
                    heartbeats(t, t + every_us - 1.0, ["fwd_bwd", "bwd"])
                    t += every_us
                    w.write(
                        {
                            "time_us": clock(t),
                            "log_type": "instant",
                            "log_type_name": "metric_value",
                            "event_name": "bwd_progress",
                            **_CALLER,
                            "log_level": "INFO",
                            "message": f"[step {step}] bwd_progress",
                            "value": round((t - began) / every_us, 1),
                            "span_id": w.span_id(rank),
                            "parent_span_id": sid,
                            **common,
                        }
                    )
                w.close()
                return
            heartbeats(t, t + spec.hang_s * 1e6, ["fwd_bwd", "bwd"])
            black_box(t, [("fwd_bwd", outer, t_outer), ("bwd", sid, t)])
            w.close()  # stuck inside bwd: nothing more is written
            return
        t1 = t + durations["bwd"][i] * 1000.0
        end("bwd", sid, outer, t, t1)
        t = t1 + g[3]
        end("fwd_bwd", outer, None, t_outer, t)
        t += g[4]
        sid = start("optimizer", t, None)
        t1 = t + durations["optimizer"][i] * 1000.0
        end("optimizer", sid, None, t, t1)
        if stopping("hang") and spec.hung_between:
            black_box(t1, [], between=("optimizer", t1))
            w.close()  # stuck between spans: nothing more is written
            return
        t = t1 + g[5]
        for k in range(spec.scalars):
            name = "loss" if k == 0 else f"metric_{k}"
            w.write(
                {
                    "time_us": clock(t),
                    "log_type": "instant",
                    "log_type_name": "metric_value",
                    "event_name": name,
                    **_CALLER,
                    "log_level": "INFO",
                    "message": f"[step {step}] {name}=2.5",
                    "value": round(2.5 + 0.01 * k, 4),
                    "span_id": w.span_id(rank),
                    "parent_span_id": None,
                    **common,
                }
            )
        if pauses[i]:
            sid = start("checkpoint", t, None)
            heartbeats(t, t + pauses[i] * 1000.0 - 1.0, ["checkpoint"])
            end("checkpoint", sid, None, t, t + pauses[i] * 1000.0)
            t += pauses[i] * 1000.0
        if sim["tokens"] is not None:
            w.write(
                {
                    "time_us": clock(t),
                    "log_type": "instant",
                    "log_type_name": "metric_value",
                    "event_name": "tokens",
                    **_CALLER,
                    "log_level": "INFO",
                    "message": f"[step {step}] tokens",
                    "value": float(sim["tokens"][i]),
                    "span_id": w.span_id(rank),
                    "parent_span_id": None,
                    **common,
                }
            )
        t += g[6]
        sid = start(COLLECTIVE, t, None)
        if stopping("wait"):
            heartbeats(t, t + spec.hang_s * 1e6, [COLLECTIVE])
            black_box(t, [(COLLECTIVE, sid, t)])
            w.close()
            return
        if stopping("terminated"):
            # waiting for the crashed peer until the launcher's SIGTERM
            heartbeats(t, t + SIGTERM_AFTER_US - 1.0, [COLLECTIVE])
            w.write(
                {
                    "time_us": clock(t + SIGTERM_AFTER_US),
                    "log_type": "instant",
                    "log_type_name": "signal_received",
                    "event_name": None,
                    "log_level": "WARNING",
                    "message": "received SIGTERM",
                    "signal": "SIGTERM",
                    "signal_number": 15,
                },
                thread=False,
            )
            rolling[4] = int(clock(t + SIGTERM_AFTER_US))
            # the step under way, as it stood (its collective still open)
            roll(rolling[4], False, "signal")
            w.close()
            return
        end(COLLECTIVE, sid, None, t, exits[i] + jitter[i])
    if not spec.closed:
        w.close()  # a later chunk continues the run
        return
    t = exits[-1] + jitter[-1] + 1000.0
    if rolling:
        rolling[4] = max(rolling[4], int(clock(t)))
    w.write(
        {
            "time_us": clock(t),
            "log_type": "instant",
            "log_type_name": "training_end",
            "event_name": None,
            **_CALLER,
            "log_level": "INFO",
            "message": "training_end",
            "trace_id": _trace_id(spec.run_id, attempt, first_step + len(begins) - 1),
            "span_id": w.span_id(rank),
            "parent_span_id": None,
            "step": first_step + len(begins) - 1,
            "relative_step": len(begins),
        }
    )
    if rolling:
        roll(rolling[4], False, "close")  # the last step: no next step ended it
    w.write(
        {
            "time_us": clock(t + 500.0),
            "log_type": "instant",
            "log_type_name": "structured_logger_closed",
            "event_name": None,
            "log_level": "INFO",
            "message": "structured logger closed",
            "dropped_records": 0,
            "failed_records": 0,
            "written_records": w.seq - 1 - w.rollups,
            "closing": True,
            "skipped_values": 0,
        },
        thread=False,
    )
    w.close()


def generate_run(
    out_dir: str, spec: RunSpec, *, jobs: int | None = None, progress: bool = False
) -> dict[str, Any]:
    """Write the run under ``out_dir/structured_logs/``; return (and write to
    ``out_dir/ground_truth.json``) what was injected.

    Example:
        >>> # truth = generate_run("/tmp/run", RunSpec(ranks=64, steps=30, hung=(17, 20)))
        >>> # truth["host_offsets_us"]["node-002"]   → the clock offset injected on that host, µs
    """
    rng = np.random.default_rng(spec.seed)
    spec.host_offsets_us = [
        float(x)
        for x in rng.uniform(-spec.offset_ms * 1000.0, spec.offset_ms * 1000.0, size=_hosts(spec))
    ]
    if spec.pp < 1 or spec.ranks % spec.pp:
        raise ValueError(f"pp={spec.pp} stages do not divide {spec.ranks} ranks")
    for host in spec.drift_hosts:
        if not 0 <= host < _hosts(spec):
            raise ValueError(f"drifting host {host} is not one of the {_hosts(spec)} hosts")
    if spec.host_drift_ms:
        # A rate per host: up to ±host_drift_ms over the run's length (its steps at the nominal step
        # time).
        length_us = (
            (spec.drift_steps or spec.steps)
            * (spec.step_ms or sum(PHASES.values()) + COLLECTIVE_MS)
            * 1000.0
        )
        spec.host_drifts = [
            float(x)
            for x in np.random.default_rng(spec.seed + 7919).uniform(
                -spec.host_drift_ms * 1000.0, spec.host_drift_ms * 1000.0, size=_hosts(spec)
            )
            / length_us
        ]
    for fault in (
        spec.straggler,
        spec.hung,
        spec.crashed,
        spec.restart,
        *((r,) for r in spec.missing),
    ):
        if fault is not None and not 0 <= fault[0] < spec.ranks:
            raise ValueError(f"fault rank {fault[0]} is not one of the {spec.ranks} ranks")
    start_us = (
        spec.start_us
        if spec.start_us is not None
        else time.time() * 1e6 - (spec.steps * 0.2 + 600) * 1e6
    )
    log_dir = os.path.join(out_dir, "structured_logs")
    os.makedirs(log_dir, exist_ok=True)
    jobs_list: list[tuple] = []
    stop_step = spec.steps
    attempts = [(0, spec.first_step, spec.first_step + spec.steps - 1)]
    stops: dict[int, tuple[int, str] | None] = {}
    if spec.first_step != 1 and any(f is not None for f in (spec.hung, spec.crashed, spec.restart)):
        raise ValueError("a run generated in chunks (first_step > 1) has no hang, crash or restart")
    if spec.hung is not None:
        rank, stop_step = spec.hung
        stops = {r: (stop_step, "hang" if r == rank else "wait") for r in range(spec.ranks)}
        attempts = [(0, 1, stop_step)]
    elif spec.crashed is not None or spec.restart is not None:
        rank, stop_step = spec.crashed or spec.restart  # type: ignore[misc]
        stops = {r: (stop_step, "crash" if r == rank else "terminated") for r in range(spec.ranks)}
        attempts = [(0, 1, stop_step)]
        if spec.restart is not None:
            resume = (stop_step - 1) // _CKPT_EVERY * _CKPT_EVERY + 1
            attempts.append((1, resume, spec.steps))
    t = start_us
    sims = []
    for attempt, first, last in attempts:
        sim = _simulate(spec, attempt, first, last, t, rng)
        sims.append(sim)
        for rank in range(spec.ranks):
            if rank not in spec.missing:
                jobs_list.append(
                    (spec, rank, attempt, log_dir, sim, stops.get(rank) if attempt == 0 else None)
                )
        t = float(sim["exits"][-1]) + 60e6  # the agent restarts a minute later
    total = 0
    started = time.monotonic()
    show = progress and sys.stderr.isatty()
    jobs = (
        jobs
        if jobs is not None
        else (1 if spec.ranks * spec.steps < 20_000 else (os.cpu_count() or 1))
    )
    if jobs <= 1:
        results = map(_write_rank, jobs_list)
        pool = None
    else:
        pool = multiprocessing.get_context("fork").Pool(jobs)
        results = pool.imap_unordered(_write_rank, jobs_list, chunksize=4)
    try:
        for done, size in enumerate(results, start=1):
            total += size
            if show:
                sys.stderr.write(
                    f"\rgenerate: {done}/{len(jobs_list)} files, {total / 1e6:,.0f} MB, "
                    f"{time.monotonic() - started:.0f} s\x1b[K"
                )
                sys.stderr.flush()
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        if show:
            sys.stderr.write("\r\x1b[K")
    truth = {
        "spec": {
            k: v for k, v in asdict(spec).items() if k not in ("host_offsets_us", "host_drifts")
        },
        "host_offsets_us": {_host_name(h): off for h, off in enumerate(spec.host_offsets_us)},
        "rank_host": {r: _host_name(r // spec.ranks_per_host) for r in range(spec.ranks)},
        "bytes": total,
        "files": len(jobs_list),
        "straggler": None
        if spec.straggler is None
        else {"rank": spec.straggler[0], "phase": spec.straggler[1], "pct": spec.straggler[2]},
        "hung": None if spec.hung is None else {"rank": spec.hung[0], "step": spec.hung[1]},
        "crashed": None
        if (spec.crashed or spec.restart) is None
        else {"rank": (spec.crashed or spec.restart)[0], "step": (spec.crashed or spec.restart)[1]},  # type: ignore[index]
        "restarted": spec.restart is not None,
        "missing": list(spec.missing),
        "onset_us": _onsets(spec, sims[0]),
        #: When the last step's collective ended (true time, µs): where the next chunk of the run
        #: begins.
        "end_us": float(sims[-1]["exits"][-1]),
    }
    with open(os.path.join(out_dir, "ground_truth.json"), "wb") as handle:
        handle.write(orjson.dumps(truth, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return truth


def _onsets(spec: RunSpec, sim: dict[str, Any]) -> dict[str, float]:
    """When each injected fault began, true time in µs (the live benchmark's detection latency is
    measured from it).

    hang: the hung rank's last record (its ``bwd`` start, or between spans its ``optimizer`` end);
    crash: its torn write; slow: the first slow step's start.
    """
    out: dict[str, float] = {}
    first = sim["first_step"]
    d, gaps, begins = sim["durations"], sim["gaps"], sim["begins"]
    for kind, fault in (("hang", spec.hung), ("crash", spec.crashed or spec.restart)):
        if fault is not None:
            rank, step = fault
            i = step - first
            t = (
                begins[i]
                + (d["data_fetch"][rank, i] + d["fwd"][rank, i] + gaps[rank, i, :3].sum()) * 1000.0
            )
            if kind == "hang" and spec.hung_between:
                t += (
                    d["bwd"][rank, i] + d["optimizer"][rank, i] + gaps[rank, i, 3:5].sum()
                ) * 1000.0
            out[kind] = float(t if kind == "hang" else t - gaps[rank, i, 2] * 1000.0)
    # A chunk of a longer run (`first_step`) has an onset only when it holds the onset's step.
    if spec.straggler is not None and max(0, (spec.slow_from or first) - first) < len(begins):
        out["slow"] = float(begins[max(0, (spec.slow_from or first) - first)])
    if spec.job_slow is not None and max(0, spec.job_slow[2] - first) < len(begins):
        out["job_slow"] = float(begins[max(0, spec.job_slow[2] - first)])
    return out


def _fault(text: str) -> tuple[int, int]:
    rank, _, step = text.partition("@")
    try:
        return int(rank), int(step)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANK@STEP (e.g. 17@30), got {text!r}") from None


def _straggler(text: str) -> tuple[int, str, float]:
    try:
        rank, phase, pct = text.split(":")
        if phase not in PHASES:
            raise ValueError
        return int(rank), phase, float(pct)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected RANK:PHASE:PCT with PHASE one of {', '.join(PHASES)} (e.g. 5:fwd:20), got "
            f"{text!r}"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Generate a multi-rank run in otel-titan's JSONL format, with clock offsets, noise and optional faults."
    )
    parser.add_argument(
        "out_dir", help="run directory to write (structured_logs/ and ground_truth.json inside)"
    )
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--offset-ms",
        type=float,
        default=5.0,
        help="host clock offsets drawn from ±this (default 5)",
    )
    parser.add_argument(
        "--drift-ms",
        type=float,
        default=0.0,
        help="the --drift-hosts' clocks drift by this over the run (default 0)",
    )
    parser.add_argument(
        "--drift-hosts",
        type=lambda text: tuple(int(x) for x in text.split(",")),
        default=(),
        metavar="H,H",
        help="hosts (0-based) whose clocks drift",
    )
    parser.add_argument(
        "--noise",
        type=float,
        default=0.03,
        help="lognormal sigma of every phase duration (default 0.03)",
    )
    parser.add_argument("--run-id", default="gen-run")
    parser.add_argument(
        "--straggler",
        type=_straggler,
        metavar="RANK:PHASE:PCT",
        help="one rank slower by PCT %% in PHASE",
    )
    parser.add_argument(
        "--hung",
        type=_fault,
        metavar="RANK@STEP",
        help="RANK hangs inside bwd at STEP; the others wait in all_reduce",
    )
    parser.add_argument(
        "--hung-between",
        action="store_true",
        help="with --hung: the rank stops between spans after optimizer, not inside bwd",
    )
    parser.add_argument(
        "--crawl-every-s",
        type=float,
        default=0.0,
        metavar="S",
        help="with --hung: the rank crawls inside bwd instead, writing a record every S seconds",
    )
    parser.add_argument(
        "--missing",
        type=lambda text: tuple(int(x) for x in text.split(",")),
        default=(),
        metavar="R,R",
        help="ranks that write no file (never reached init)",
    )
    parser.add_argument(
        "--black-boxes",
        action="store_true",
        help="with --hung: the stuck ranks also write the watchdog's stall record (120 s later)",
    )
    parser.add_argument(
        "--crashed",
        type=_fault,
        metavar="RANK@STEP",
        help="RANK dies mid-write at STEP (torn last line); the others get SIGTERM",
    )
    parser.add_argument(
        "--restart",
        type=_fault,
        metavar="RANK@STEP",
        help="as --crashed, then a second attempt of every rank from the last checkpoint",
    )
    parser.add_argument(
        "--jobs", type=int, help="worker processes (default: one per CPU for big runs)"
    )
    parser.add_argument(
        "--no-rollups",
        dest="rollups",
        action="store_false",
        help="write no step_rollup records (as step_rollups=False, or files from before rollups); default: one per rank and step, as the library writes them",
    )
    live = parser.add_argument_group("live runs (for otel-titan watch)")
    live.add_argument(
        "--live",
        action="store_true",
        help="write in real time: the run starts in 3 s and every line reaches its file at its time (benchmarks/live_run.py)",
    )
    live.add_argument("--step-ms", type=float, help="median step time in ms (default: about 104)")
    live.add_argument(
        "--slow-from",
        type=int,
        metavar="STEP",
        help="the --straggler's slowdown begins at STEP (a fail-slow onset)",
    )
    live.add_argument(
        "--slow-to",
        type=int,
        metavar="STEP",
        help="... and ends after STEP (a slowdown that comes and goes)",
    )
    live.add_argument(
        "--slow-host",
        action="store_true",
        help="the --straggler's whole host is slow, not only its rank",
    )
    live.add_argument(
        "--host-drift-ms",
        type=float,
        default=0.0,
        help="every host's clock also drifts by up to ±this over the run",
    )
    live.add_argument(
        "--pp",
        type=int,
        default=1,
        help="pipeline stages (pp-major, as init_device_mesh; ranks record their mesh)",
    )
    live.add_argument(
        "--stage-pct",
        type=float,
        default=0.0,
        help="with --pp: stage k's fwd/bwd longer by k times this %%",
    )
    live.add_argument(
        "--variable",
        type=float,
        default=0.0,
        help="step lengths that vary together (lognormal sigma of a per-step factor)",
    )
    live.add_argument(
        "--pause-every",
        type=int,
        default=0,
        metavar="N",
        help="every N steps, a checkpoint span every rank shares",
    )
    live.add_argument("--pause-ms", type=float, default=0.0, help="the checkpoint's length in ms")
    args = parser.parse_args(argv)
    if sum(x is not None for x in (args.hung, args.crashed, args.restart)) > 1:
        parser.error("at most one of --hung, --crashed, --restart")
    spec = RunSpec(
        ranks=args.ranks,
        steps=args.steps,
        seed=args.seed,
        offset_ms=args.offset_ms,
        noise=args.noise,
        run_id=args.run_id,
        straggler=args.straggler,
        hung=args.hung,
        black_boxes=args.black_boxes,
        crashed=args.crashed,
        restart=args.restart,
        drift_ms=args.drift_ms,
        drift_hosts=args.drift_hosts,
        step_ms=args.step_ms,
        slow_from=args.slow_from,
        slow_to=args.slow_to,
        slow_host=args.slow_host,
        host_drift_ms=args.host_drift_ms,
        pp=args.pp,
        stage_pct=args.stage_pct,
        variable=args.variable,
        pause_every=args.pause_every,
        pause_ms=args.pause_ms,
        hung_between=args.hung_between,
        crawl_every_s=args.crawl_every_s,
        missing=args.missing,
        rollups=args.rollups,
    )
    if args.live:
        spec.start_us = int((time.time() + 3.0) * 1e6)
    started = time.monotonic()
    target = os.path.join(args.out_dir, ".generated") if args.live else args.out_dir
    try:
        truth = generate_run(target, spec, jobs=args.jobs, progress=True)
    except ValueError as error:
        parser.error(str(error))
    if args.live:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from benchmarks.live_run import play  # only the live mode needs it

        os.replace(
            os.path.join(target, "ground_truth.json"),
            os.path.join(args.out_dir, "ground_truth.json"),
        )
        print(
            f"{args.out_dir}: playing {truth['files']} files in real time (ground truth in "
            "ground_truth.json)",
            flush=True,
        )
        lines = play(target, args.out_dir, truth)
        print(f"{args.out_dir}: {lines:,} lines written live in {time.monotonic() - started:.1f} s")
        return 0
    print(
        f"{args.out_dir}: {truth['files']} files, {truth['bytes'] / 1e6:,.1f} MB in "
        f"{time.monotonic() - started:.1f} s; ground truth in ground_truth.json"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

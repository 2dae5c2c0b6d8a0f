"""Runs that fail the way real training jobs fail, with a known culprit: the axes of
tests/analysis/test_failure_matrix.py.

The axes come from the field's failure taxonomy (how real jobs fail: the Llama 3 paper's
interruption causes, MegaScale's and C4D's fault kinds), not from our generator's knobs:

* **how the culprit's process ends** (`ENDS`): ``clean`` (no fault); ``exception_in_span`` /
  ``exception_between`` (a CUDA error or OOM raised by the next call: the most common crash);
  ``interrupt`` (Ctrl-C on a hung job: the hung rank gets KeyboardInterrupt, the ranks stuck in the
  collective ignore it); ``sigterm`` (a hung job stopped by torchrun's agent or ``scancel``: every
  rank SIGTERMed); ``sigkill`` (the OOM killer, a node agent: nothing written after its last record,
  sometimes a torn line); ``stuck`` and ``crawling`` (still alive: stopped, or writing a record
  every 20 s from inside ``fwd``). Healthy jobs stopped from outside (``ctrl_c_healthy``,
  ``sigterm_healthy``, ``sigkill_healthy``: the whole job killed at once, nothing written) have no
  culprit;
* **how its peers react** (`peers`): ``fail`` (gloo fails their collective at once: they raise
  ``Connection reset by peer``, the exit hook closes their files) or ``wait`` (NCCL fails nothing:
  they wait, their watchdogs write black boxes, then torchrun SIGTERMs them, or, after Ctrl-C, kills
  them);
* **who wrote the files** (`WRITERS`): ``otel-titan`` (opening and closing records,
  ``uncaught_exception``, ``signal_received``, ``stall`` black boxes, heartbeats); ``torchtitan``
  (its logger: no span ids, no closing record, no black box, nothing about how the process ended);
  ``pimm`` (the same, with pimm's fields and no logger name);
* **the loop** (`LOOPS`): ``collective`` (data_fetch, fwd_bwd [fwd, bwd], then an ``all_reduce``
  span closes the step); ``readme`` (the README's loop: fwd_bwd [fwd, bwd], then ``optimizer``; the
  all-reduce runs inside ``bwd``, as DDP's hooks do, with no span of its own); ``nospan``
  (data_fetch, fwd_bwd, the all-reduce between spans, then optimizer); ``pipeline`` (torchtitan's
  mesh ``[pp, dp]``: `stages` stages, each step one micro-batch in GPipe's order, every hand-over in
  a span of its own: the first stage fetches data, each sends its activations on
  (``send_activations`` / ``recv_activations``) and its gradients back (``send_grads`` /
  ``recv_grads``), then each stage's data-parallel group all-reduces; the flight recorder holds the
  sends and receives of the stage's pipeline group and the all-reduces of its data-parallel one);
* **onset**: the fault in step 1 (``start``) or in the last step (``late``); or in the last step
  after a stall it recovered from in step 2 (``intermittent``: the same rank stopped 45 s inside
  ``fwd`` while the others waited for it), after a pause every rank shares in step 2 (``pause, every
  rank``: 45 s in a ``checkpoint`` span, a sharded save), or after one on rank 0 only (``pause, rank
  0``: its ``checkpoint`` while the others wait in an untraced barrier). Healthy jobs get the same:
  a recovered stall, a pause, is no culprit;
* **evidence** (``boxes``): black boxes from every stuck rank, from all but the culprit (its call
  holds the interpreter lock: neither its watchdog nor its heartbeat can run), or from none (the
  watchdog off, or its threshold, minutes by default, not reached); the flight recorder in them on
  or off. Whatever the boxes, a process alive and quiet with spans open writes a ``heartbeat`` every
  10 s (the opening record's ``heartbeat_interval_s``), as the writer does.

Each rank's records are written as the writer writes them; where a rank is stuck, where the others
wait and what each writes follows from the loop, never from the expected answer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_titan.schema import heartbeat_fields
from tests.helpers.analysis import T0

ONSETS = ("start", "late", "intermittent", "pause, every rank", "pause, rank 0")
#: The step of the recovered stall or the pause (`ONSETS`), and how long it lasts (s): longer than
#: `watch`'s patience for a hang.
PAUSE_STEP, PAUSE_S = 2, 45.0
#: An onset outside the sampled axis (`ONSETS`): rank 0's pause, the others waiting in a traced span
#: named for no collective.
PAUSE_IN_A_SPAN = "pause, rank 0, the others in a span"
ENDS = (
    "clean",
    "exception_in_span",
    "exception_between",
    "interrupt",
    "sigterm",
    "sigkill",
    "stuck",
    "crawling",
    "ctrl_c_healthy",
    "sigterm_healthy",
    "sigkill_healthy",
)
WRITERS = ("otel-titan", "torchtitan", "pimm")
LOOPS = ("collective", "readme", "nospan", "pipeline")
#: Ends with no culprit: the job was healthy until stopped from outside.
HEALTHY = ("clean", "ctrl_c_healthy", "sigterm_healthy", "sigkill_healthy")
STEP_US = 100_000
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"
RESET = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:41234"


@dataclass(frozen=True)
class Case:
    end: str
    writer: str = "otel-titan"
    loop: str = "collective"
    world: int = 3
    onset: str = "late"
    boxes: str = "all"  # "all" | "not the culprit" | "none"
    recorder: bool = True
    peers: str = "wait"  # "fail" | "wait"
    steps: int = 5
    seed: int = 0

    @property
    def culprit(self) -> int | None:
        return None if self.end in HEALTHY else self.slow_rank

    @property
    def slow_rank(self) -> int:
        """The rank the fault is in; in a healthy job, the one whose stall (``intermittent``) it
        recovered from."""
        return (self.seed * 7 + 1) % self.world

    @property
    def fault_step(self) -> int:
        return 1 if self.onset == "start" else self.steps

    def __str__(self) -> str:
        return (
            f"{self.end}/{self.writer}/{self.loop}/{self.world} ranks/onset {self.onset}/boxes "
            f"{self.boxes}/fr {'on' if self.recorder else 'off'}"
            f"/peers {self.peers}/culprit {self.culprit}"
        )


def _ops(loop: str) -> list[tuple]:
    """One step's program: ("open", name), ("close",), ("coll",) (the all-reduce every rank must
    reach), ("fault",) where the culprit stops in a span, ("fault_between",) where it stops between
    spans."""
    if loop == "collective":
        return [
            ("open", "data_fetch"),
            ("close",),
            ("fault_between",),
            ("open", "fwd_bwd"),
            ("open", "fwd"),
            ("fault",),
            ("close",),
            ("open", "bwd"),
            ("close",),
            ("close",),
            ("open", "all_reduce"),
            ("coll",),
            ("close",),
        ]
    if loop == "readme":
        return [
            ("fault_between",),
            ("open", "fwd_bwd"),
            ("open", "fwd"),
            ("fault",),
            ("close",),
            ("open", "bwd"),
            ("coll",),
            ("close",),
            ("close",),
            ("open", "optimizer"),
            ("close",),
        ]
    return [
        ("open", "data_fetch"),
        ("close",),
        ("fault_between",),
        ("open", "fwd_bwd"),
        ("open", "fwd"),
        ("fault",),
        ("close",),
        ("open", "bwd"),
        ("close",),
        ("close",),
        ("coll",),
        ("open", "optimizer"),
        ("close",),
    ]


class _Writer:
    """One rank's file as `case.writer` writes it."""

    def __init__(self, case: Case, rank: int) -> None:
        self.case, self.rank = case, rank
        self.ours = case.writer == "otel-titan"
        self.out: list[dict[str, Any]] = []
        self.stack: list[tuple[str, str, int, int]] = []
        self.entries: list[dict[str, Any]] = []
        self.seqs: dict[str, dict[str, int]] = {}
        self.last_closed: tuple[str, int] | None = None
        self.pid = 7000 + rank
        #: The process groups its flight recorder knows (name → desc, members): the default group;
        #: a pipeline's stage and data-parallel groups (`_mesh`).
        self.groups: dict[str, tuple[str, list[int]]] = {
            "0": ("default_pg", list(range(case.world)))
        }
        self.call = "all_reduce"  # the library call it waits in, for its black box's stack

    def add(self, name: str, time_us: int, log_type: str = "event", **fields: Any) -> None:
        record: dict[str, Any] = {
            "time_us": time_us,
            "time_ms": time_us // 1000,
            "time": time_us // 1_000_000,
            "log_type": log_type,
            "log_type_name": name,
            "event_name": None,
            "log_level": "INFO",
            "tid": self.pid,
            "pid": self.pid,
            "caller": "train.py:10:main",
            "rank": self.rank,
            "global_rank": self.rank,
            "local_rank": self.rank % 8,
            "world_size": self.case.world,
            "source": "training",
            "host_name": f"node-{self.rank // 8:03d}",
            **fields,
        }
        if "step" in record and record["step"] is None:
            del record["step"]  # before the first set_step: the writer writes no step
        if self.ours:
            record.update(
                schema_version=1,
                run_id="failure-matrix",
                attempt=0,
                job_id=None,
                logger_name="otel_titan.structured_logger",
                seq_id=len(self.out) + 1,
            )
            if name.endswith(("_start", "_end", "_error")) and "span_id" not in fields:
                raise AssertionError(name)
        else:
            for key in ("span_id", "parent_span_id"):
                record.pop(key, None)
            if self.case.writer == "torchtitan":
                record.update(
                    logger_name="torchtitan.structured_logger", message=name, delta_ms=0.0
                )
            else:  # pimm's writer: its own fields, no logger name
                record.update(
                    schema_version=1,
                    attempt=0,
                    job_id="123",
                    trace_id="run-abc",
                    epoch=0,
                    iteration=record.get("step"),
                )
        self.out.append(record)

    def open(self, name: str, step: int | None, time_us: int) -> None:
        sid = hashlib.sha256(f"{self.rank}|{step}|{len(self.out)}".encode()).hexdigest()[:16]
        self.add(
            f"{name}_start",
            time_us,
            span_id=sid,
            parent_span_id=self.stack[-1][1] if self.stack else None,
            step=step,
        )
        self.stack.append((name, sid, time_us, step))

    def close(self, time_us: int, error: tuple[str, str] | None = None) -> None:
        name, sid, start, step = self.stack.pop()
        parent = self.stack[-1][1] if self.stack else None
        if error is not None and self.ours:
            self.add(
                f"{name}_error",
                time_us,
                span_id=sid,
                parent_span_id=parent,
                step=step,
                error_type=error[0],
                error_message=error[1],
            )
        self.add(
            f"{name}_end",
            time_us,
            span_id=sid,
            parent_span_id=parent,
            step=step,
            value=(time_us - start) / 1000,
        )
        self.last_closed = (name, time_us)

    def collective(
        self, state: str, time_us: int, group: str = "0", op: str = "all_reduce"
    ) -> None:
        """One entry of its flight recorder: a collective of `group` (its seq counted per group), or
        a send/recv (`op` ``send 0->1``, ``recv 1<-0``: group-local ranks; its p2p seq)."""
        p2p = op.startswith(("send", "recv"))
        counts = self.seqs.setdefault(group, {"coll": 0, "p2p": 0})
        counts["p2p" if p2p else "coll"] += 1
        self.entries.append(
            {
                "pg_id": sorted(self.groups, key=int).index(group),
                "pg_name": group,
                "pg_desc": self.groups[group][0],
                "collective_seq_id": 0 if p2p else counts["coll"],
                "p2p_seq_id": counts["p2p"] if p2p else 0,
                "is_p2p": p2p,
                "op": f"nccl:{op}",
                "input_sizes": [[16]],
                "output_sizes": [[16]],
                "input_dtypes": ["Float"],
                "state": state,
                "retired": state == "completed",
                "time_created_ns": time_us * 1000,
            }
        )

    def box(self, time_us: int, reason: str, step: int, stuck_here: bool, between: bool) -> None:
        """The watchdog's ``stall`` record (or SIGTERM's black box): open spans, the main thread's
        stack, the flight recorder."""
        if not self.ours:
            return
        frame = (
            {"file": "train.py", "line": 34, "function": "read_shard"}
            if stuck_here
            else {"file": "train.py", "line": 80, "function": "main"}
        )
        library = (
            []
            if stuck_here
            else [
                {
                    "file": ".venv/lib/python3.11/site-packages/torch/distributed/c10d.py",
                    "line": 2800,
                    "function": self.call,
                }
            ]
        )
        fields: dict[str, Any] = {
            "reason": reason,
            "stalled_s": 3.0,
            "stall_after_s": 3.0,
            "message": reason,
            "open_spans": [
                {
                    "name": n,
                    "span_id": sid,
                    "step": st,
                    "open_s": round((time_us - t) / 1e6, 3),
                    "tid": self.pid,
                    "thread_name": "MainThread",
                }
                for n, sid, t, st in self.stack
            ],
            "threads": [{"thread_name": "MainThread", "main": True, "frames": library + [frame]}],
            "where": "in_span" if self.stack else ("between_spans" if between else "idle"),
            "last_span": {
                "name": self.last_closed[0],
                "ended_s_ago": round((time_us - self.last_closed[1]) / 1e6, 3),
            }
            if self.last_closed and not self.stack
            else None,
            "step": step,
        }
        if self.case.recorder:
            fields["flight_recorder"] = {
                "version": "2.10",
                "entries": self.entries[-64:],
                "pg_config": {
                    name: {"desc": desc, "ranks": ranks}
                    for name, (desc, ranks) in self.groups.items()
                },
            }
        self.add("stall", time_us, log_type="instant", **fields)

    def raise_(self, time_us: int, error: tuple[str, str], step: int, frame: str) -> None:
        """An exception nothing caught: it fails every open span, innermost first; the excepthook's
        record; the exit hook's close."""
        while self.stack:
            self.close(time_us, error)
        if self.ours:
            self.add(
                "uncaught_exception",
                time_us,
                log_type="instant",
                step=step,
                error_type=error[0],
                error_message=error[1],
                error_frames=[
                    ".venv/lib/python3.11/site-packages/torch/cuda/memory.py:120:alloc",
                    frame,
                ],
                fatal=True,
            )
            self.add("structured_logger_closed", time_us + 1000, log_type="instant", closing=True)

    def write(self, run_dir: Path, torn: bool = False) -> None:
        path = (
            run_dir
            / "structured_logs"
            / f"training.global_rank_{self.rank}.20261202-000000-abcdef.jsonl"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(
            b"".join(json.dumps(r).encode() + b"\n" for r in self.out)
            + (b'{"time_us": 1, "log_ty' if torn else b"")
        )


def _begun(case: Case, rank: int) -> _Writer:
    """One rank's writer, past what every rank writes before the loop: the opening record (ours),
    the model's build (every writer logs something there: one span)."""
    w = _Writer(case, rank)
    if w.ours:
        w.add(
            "structured_logger_opened",
            T0,
            log_type="instant",
            otel_titan_version="0.1.0",
            stacks_file=None,
            heartbeat_interval_s=HEARTBEAT_S,
        )
    w.open("build_model", None, T0 + 100 + rank * 3)  # before the loop's first set_step: no step
    w.close(T0 + 50_000 + rank * 11)
    return w


def write_failure_run(run_dir: Path, case: Case) -> int | None:
    """Write the case's run; returns the rank to blame (None: a healthy job)."""
    culprit = case.culprit
    ops = _ops(case.loop)
    stop_at = ("fault_between",) if case.end == "exception_between" else ("fault",)
    fault_step = case.fault_step
    coll_index = ops.index(("coll",))
    if case.loop == "pipeline":
        _write_pipeline_run(run_dir, case)
        return culprit
    for rank in range(case.world):
        w = _begun(case, rank)
        t = T0
        ended = False
        for step in range(1, case.steps + 1):
            step_start = (
                T0
                + 60_000
                + (step - 1) * STEP_US
                + (
                    int(PAUSE_S * 1e6)
                    if step > PAUSE_STEP and case.onset not in ("start", "late")
                    else 0
                )
            )
            t = step_start + rank * 7  # a few µs apart
            last_step = step == fault_step and case.end not in ("clean",)
            stall_here = step == PAUSE_STEP and case.onset == "intermittent"
            if step == PAUSE_STEP and case.onset.startswith("pause"):
                _pause(w, case, step, t)
                step_start += int(PAUSE_S * 1e6)
                t += int(PAUSE_S * 1e6)
            for index, op in enumerate(ops):
                t += 5000
                if stall_here and op == ("fault",):
                    # stopped inside fwd; it recovers, the others waited for it at the collective
                    if rank == case.slow_rank:
                        _stall(w, case, t, t + int(PAUSE_S * 1e6), own=True)
                        t += int(PAUSE_S * 1e6)
                    continue
                faulty_here = (
                    rank == culprit
                    and last_step
                    and op[0] in ("fault", "fault_between")
                    and op == stop_at
                )
                if (
                    case.end in ("stuck", "crawling", "interrupt", "sigterm")
                    and rank == culprit
                    and last_step
                    and op == ("fault",)
                ):
                    faulty_here = True
                if faulty_here:
                    _culprit_end(w, case, step, t, between=op == ("fault_between",))
                    ended = True
                    break
                if (
                    last_step
                    and case.end in ("ctrl_c_healthy", "sigterm_healthy", "sigkill_healthy")
                    and index == (rank % 3) + 2
                ):
                    _healthy_stop(w, case, step, t)
                    ended = True
                    break
                if op[0] in ("fault", "fault_between"):
                    continue
                if op[0] == "open":
                    w.open(op[1], step, t)
                elif op[0] == "close":
                    w.close(t)
                elif op[0] == "coll":
                    if last_step and culprit is not None and rank != culprit:
                        w.collective("scheduled", t)
                        _victim_end(w, case, step, t, between=not w.stack)
                        ended = True
                        break
                    leave = (
                        step_start
                        + (coll_index + 2) * 5000
                        + (int(PAUSE_S * 1e6) if stall_here else 0)
                    )
                    if stall_here and rank != case.slow_rank:
                        _stall(w, case, t, leave, own=False)
                    w.collective("completed", t)
                    t = max(t, leave)  # everyone leaves together, once the last arrived
            if ended:
                break
        if not ended and w.ours:
            w.add("structured_logger_closed", t + 1000, log_type="instant", closing=True)
        w.write(
            run_dir, torn=ended and rank == culprit and case.end == "sigkill" and case.seed % 2 == 0
        )
    return culprit


#: When the peers' watchdogs fire, when torchrun's agent stops everyone, after the last progress
#: (s).
STALL_S, SIGTERM_S = 3.0, 40.0
#: The writer's heartbeat interval (its opening record says it), when the peers Ctrl-C could not
#: stop are killed, and how long a still-alive rank's file runs past its last progress (s).
HEARTBEAT_S, KILLED_AFTER_CTRL_C_S, ALIVE_S = 10.0, 30.0, 200.0


def _stall(w: _Writer, case: Case, since: int, until: int, own: bool) -> None:
    """A stall it recovers from (µs `since` → `until`): its watchdog's black box (as the case's
    evidence has it), its heartbeats."""
    if case.boxes == "all" or (case.boxes == "not the culprit" and not own):
        w.box(since + int(STALL_S * 1e6), "stall", PAUSE_STEP, own, not w.stack)
    if own and case.boxes == "not the culprit":
        return  # a call holding the interpreter lock: no heartbeat either
    _heartbeats(w, since, until)


def _pause(w: _Writer, case: Case, step: int, t: int) -> None:
    """A pause at the start of `step` (`ONSETS`): every rank's checkpoint, or rank 0's while the
    others wait in an untraced barrier (or, for the onset `PAUSE_IN_A_SPAN`, in a span whose name
    says nothing of a wait: ``with sl.log_trace_span("after_save"): barrier()``)."""
    until = t + int(PAUSE_S * 1e6)
    if case.onset == "pause, every rank" or w.rank == 0:
        w.open("checkpoint", step, t)
        _stall(w, case, t, until, own=False)
        w.close(until)
    elif case.onset == PAUSE_IN_A_SPAN:
        w.open("after_save", step, t)
        _stall(w, case, t, until, own=False)
        w.close(until)
    else:
        _stall(w, case, t, until, own=False)


def _heartbeats(w: _Writer, quiet_since: int, until: int) -> None:
    """What the writer's processor writes while the process is alive and quiet with spans open: a
    ``heartbeat`` each interval, up to `until` (µs)."""
    if not (w.ours and w.stack):
        return
    at = quiet_since + int(HEARTBEAT_S * 1e6)
    while at < until:
        w.add("heartbeat", at, log_type="instant", **heartbeat_fields([s[0] for s in w.stack]))
        at += int(HEARTBEAT_S * 1e6)


def _victim_end(w: _Writer, case: Case, step: int, t: int, between: bool) -> None:
    """A rank that reached the all-reduce the culprit never will."""
    if case.end in ("exception_in_span", "exception_between", "sigkill") and case.peers == "fail":
        # gloo fails it once the peer is gone
        w.raise_(t + 500_000, ("RuntimeError", RESET), step, "train.py:60:train_step")
        return
    if case.boxes != "none":
        w.box(t + int(STALL_S * 1e6), "stall", step, False, between)
    # Alive and waiting, its spans open: heartbeats, whatever the watchdog's threshold (the stall
    # record's default is minutes).
    if case.end == "interrupt" and case.peers == "wait":
        _heartbeats(w, t, t + int(KILLED_AFTER_CTRL_C_S * 1e6))
        return  # stuck in gloo, Ctrl-C never reaches Python: killed later, nothing more written
    if case.end in ("stuck", "crawling"):
        _heartbeats(w, t, t + int(ALIVE_S * 1e6))
        return  # alive, waiting
    _heartbeats(w, t, t + int(SIGTERM_S * 1e6))
    if w.ours:  # torchrun's agent (or the operator) stops them
        w.add("signal_received", t + int(SIGTERM_S * 1e6), log_type="instant", signal="SIGTERM")
        w.box(t + int(SIGTERM_S * 1e6) + 100, "SIGTERM", step, False, between)


def _culprit_end(w: _Writer, case: Case, step: int, t: int, between: bool) -> None:
    own = case.boxes == "all"
    if case.end in ("exception_in_span", "exception_between"):
        w.raise_(t, ("torch.OutOfMemoryError", OOM), step, "train.py:88:fwd_bwd")
    elif case.end == "sigkill":
        pass  # nothing after its last record
    elif case.end in ("stuck", "interrupt", "sigterm"):
        # Its own evidence: "not the culprit" is a call that holds the interpreter lock (no
        # watchdog, no heartbeat can run); "none" a stall shorter than the watchdog's threshold,
        # with the writer's heartbeats.
        if own:
            w.box(t + int(STALL_S * 1e6), "stall", step, True, between)
        end_s = {"stuck": ALIVE_S, "interrupt": 20.9, "sigterm": SIGTERM_S}[case.end]
        if case.boxes != "not the culprit":
            _heartbeats(w, t, t + int(end_s * 1e6))
        if case.end == "interrupt":  # Ctrl-C: KeyboardInterrupt unwinds the span it was stuck in
            w.raise_(
                t + int(end_s * 1e6), ("KeyboardInterrupt", ""), step, "train.py:34:read_shard"
            )
        elif case.end == "sigterm" and w.ours:
            w.add("signal_received", t + int(SIGTERM_S * 1e6), log_type="instant", signal="SIGTERM")
            w.box(t + int(SIGTERM_S * 1e6) + 100, "SIGTERM", step, True, between)
    # still inside fwd, one record every 20 s (a loop logging per layer); a heartbeat in each quiet
    # 10 s
    elif case.end == "crawling":
        for k in range(1, 11):
            if case.boxes != "not the culprit":
                _heartbeats(w, t + (k - 1) * 20_000_000, t + k * 20_000_000)
            w.add(
                "metric_value",
                t + k * 20_000_000,
                log_type="instant",
                event_name="fwd_progress",
                value=float(k),
                step=step,
            )


def _healthy_stop(w: _Writer, case: Case, step: int, t: int) -> None:
    """A healthy job stopped from outside mid-step: every rank, wherever it is."""
    if case.end == "ctrl_c_healthy":
        w.raise_(t + 1000, ("KeyboardInterrupt", ""), step, "train.py:50:train_step")
    elif case.end == "sigkill_healthy":
        pass  # the whole job killed at once (a node agent, a scheduler's hard kill): nothing written
    elif w.ours:
        w.add("signal_received", t + 1000, log_type="instant", signal="SIGTERM")
        w.box(t + 1100, "SIGTERM", step, False, not w.stack)


# -- a pipeline: stages hand activations forward and gradients back -------------------------------
#: How long (µs) a span's own work takes; a send/recv, an all-reduce, once every side is there.
WORK_US, P2P_US, COLL_US = 5000, 1000, 1000


def stages(world: int) -> int:
    """The pipeline's depth on `world` ranks (torchtitan's mesh ``[pp, dp]``, pp outermost): 4
    stages where each keeps a data-parallel group of 2 or more, else 2, else one rank a stage."""
    if world % 4 == 0 and world >= 8:
        return 4
    return 2 if world % 2 == 0 else world


def _pipeline_ops(stage: int, pp: int, dp: int) -> list[tuple]:
    """One step of a stage's program (one micro-batch, GPipe's order), each hand-over in a span of
    its own: ("recv", s) / ("send", s) with stage s of the same pipeline (a rendezvous, as NCCL's
    send of a large tensor is); ("coll",) the stage's data-parallel all-reduce; ("work",) the
    span's own work; the culprit's ``fault`` / ``fault_between`` as in `_ops`."""
    ops: list[tuple] = (
        [("open", "data_fetch"), ("work",), ("close",)]
        if stage == 0
        else [("open", "recv_activations"), ("recv", stage - 1), ("close",)]
    )
    ops += [("fault_between",), ("open", "fwd"), ("fault",), ("work",), ("close",)]
    if stage < pp - 1:
        ops += [("open", "send_activations"), ("send", stage + 1), ("close",)]
        ops += [("open", "recv_grads"), ("recv", stage + 1), ("close",)]
    ops += [("open", "bwd"), ("work",), ("close",)]
    if stage > 0:
        ops += [("open", "send_grads"), ("send", stage - 1), ("close",)]
    if dp > 1:
        ops += [("open", "all_reduce"), ("coll",), ("close",)]
    return ops + [("open", "optimizer"), ("work",), ("close",)]


def _handover(op: tuple, rank: int, dp: int) -> tuple[Any, set[int], str]:
    """A wait's key (shared by every side of it), its ranks, its op as the flight recorder names it
    (group-local ranks: the stages)."""
    stage, index = divmod(rank, dp)
    if op[0] == "coll":
        return ("coll", stage), {stage * dp + d for d in range(dp)}, "all_reduce"
    peer = op[1] * dp + index
    sender, receiver = (rank, peer) if op[0] == "send" else (peer, rank)
    arrow = f"send {stage}->{op[1]}" if op[0] == "send" else f"recv {stage}<-{op[1]}"
    return (sender, receiver), {sender, receiver}, arrow


def _schedule(
    case: Case, step: int, starts: dict[int, int], halts: dict[int, int]
) -> dict[int, list[tuple[int, int | None]]]:
    """When each rank reached and left each op of `step`, from its start (µs), ranks `halts` stops
    at (never leaving it): a wait is left once every side reached it; the ops a rank never reached
    are not listed, the one it stopped or waits in is left at None."""
    pp = stages(case.world)
    dp = case.world // pp
    programs = {r: _pipeline_ops(r // dp, pp, dp) for r in starts}
    clock = dict(starts)
    times: dict[int, list[tuple[int, int | None]]] = {r: [] for r in starts}
    arrived: dict[Any, dict[int, int]] = {}
    moved = True
    while moved:
        moved = False
        for rank, ops in programs.items():
            while len(times[rank]) < len(ops) and halts.get(rank) != len(times[rank]):
                op = ops[len(times[rank])]
                t = clock[rank]
                if op[0] in ("send", "recv", "coll"):
                    key, sides, _ = _handover(op, rank, dp)
                    there = arrived.setdefault(key, {})
                    there.setdefault(rank, t)
                    if not sides <= set(there):
                        break
                    done = max(there.values()) + (COLL_US if op[0] == "coll" else P2P_US)
                elif op[0] == "work":
                    done = t + WORK_US
                elif op == ("fault",) and step == PAUSE_STEP and case.onset == "intermittent":
                    done = t + (int(PAUSE_S * 1e6) if rank == case.slow_rank else 0)
                else:
                    done = t
                times[rank].append((t, done))
                clock[rank] = done
                moved = True
    for rank, ops in programs.items():
        if len(times[rank]) < len(ops):
            times[rank].append((clock[rank], None))
    return times


def _write_pipeline_run(run_dir: Path, case: Case) -> None:
    """`write_failure_run` for the loop ``pipeline``: each stage's program (`_pipeline_ops`), timed
    by what each hand-over waits for (`_schedule`); where the culprit stops, the ranks whose
    hand-overs wait for it, and those that wait for them, stop in theirs."""
    pp = stages(case.world)
    dp = case.world // pp
    writers = {rank: _begun(case, rank) for rank in range(case.world)}
    for rank, w in writers.items():
        stage, index = divmod(rank, dp)
        w.groups[str(1 + index)] = ("mesh_pp", [s * dp + index for s in range(pp)])
        if dp > 1:
            w.groups[str(1 + dp + stage)] = ("mesh_dp", [stage * dp + d for d in range(dp)])
    starts = {rank: T0 + 60_000 + rank * 7 for rank in writers}
    stop_at = ("fault_between",) if case.end == "exception_between" else ("fault",)
    for step in range(1, case.steps + 1):
        if step == PAUSE_STEP and case.onset.startswith("pause"):
            for rank, w in writers.items():
                _pause(w, case, step, starts[rank])
                starts[rank] += int(PAUSE_S * 1e6)
        last = step == case.fault_step and case.end != "clean"
        culprit = case.culprit if last else None
        halts = (
            {culprit: _pipeline_ops(culprit // dp, pp, dp).index(stop_at)}
            if culprit is not None
            else {}
        )
        times = _schedule(case, step, starts, halts)
        # A healthy job stopped from outside: every rank at one moment, wherever it is then.
        killed_at = min(starts.values()) + 12_000 if last and case.culprit is None else None
        for rank in list(starts):
            ended = _write_pipeline_step(
                writers[rank], case, step, times[rank], halts.get(rank), killed_at
            )
            if ended:
                del starts[rank]
            else:
                starts[rank] = times[rank][-1][1] + 1000  # type: ignore[operator]  # left every op
    for rank, w in writers.items():
        if rank in starts and w.ours:
            w.add("structured_logger_closed", starts[rank], log_type="instant", closing=True)
        w.write(run_dir, torn=rank == case.culprit and case.end == "sigkill" and case.seed % 2 == 0)


def _write_pipeline_step(
    w: _Writer,
    case: Case,
    step: int,
    times: list[tuple[int, int | None]],
    halt: int | None,
    killed_at: int | None,
) -> bool:
    """One rank's records of one pipeline step, as `_schedule` timed it; whether it ended there."""
    dp = case.world // stages(case.world)
    ops = _pipeline_ops(w.rank // dp, stages(case.world), dp)
    for index, (op, (reached, left)) in enumerate(zip(ops, times)):
        if index == halt:
            _culprit_end(w, case, step, reached, between=op == ("fault_between",))
            return True
        if killed_at is not None and (left is None or left > killed_at):
            _healthy_stop(w, case, step, killed_at)
            return True
        if op[0] in ("send", "recv", "coll"):
            _, _, name = _handover(op, w.rank, dp)
            group = str(1 + dp + w.rank // dp) if op[0] == "coll" else str(1 + w.rank % dp)
            w.call = op[0] if op[0] != "coll" else "all_reduce"
            if left is None:  # it waits for a rank that never comes
                w.collective("scheduled", reached, group, name)
                _victim_end(w, case, step, reached, between=not w.stack)
                return True
            if left - reached > STALL_S * 1e6:  # a long wait it recovers from
                _stall(w, case, reached, left, own=False)
            w.collective("completed", reached, group, name)
        elif op[0] == "open":
            w.open(op[1], step, reached)
        elif op[0] == "close":
            w.close(reached)
        elif op == ("fault",) and left is not None and left - reached > STALL_S * 1e6:
            _stall(
                w, case, reached, left, own=True
            )  # the stall it recovers from (``intermittent``)
    return False

"""Hung runs with a known culprit, written record for record as otel-titan writes them (spans,
``stall`` black boxes, flight recorder).

The hang is *simulated*, not described: every rank runs the same steps of
ops (spans, collectives on its process groups, point-to-point send/recv),
a collective completes only when every member of its group arrived, a
send/recv only when both sides did; the culprit stops at its fault point in
the last step, and every other rank stops wherever that leaves it waiting.
So where the victims wait (which span, which group's sequence number, which
recv) follows from the layout, exactly as in a real job, and the only rank to
blame is the culprit.

Layouts: ``world`` (one all_reduce per step on the default group), ``tp``
(also an all_reduce on tensor-parallel sub-groups of `TP` ranks inside
``fwd``, created with ``new_group`` so each has its own name and
membership), ``pp`` (pairs of pipeline stages: stage 0 sends, stage 1
receives inside ``fwd``). Faults: ``span`` (stuck inside ``data_fetch``),
``between`` (stuck between spans at the step's start), ``before_init`` (no
file at all), ``subgroup`` (tp: stuck in ``fwd`` before its sub-group's
collective), ``p2p`` (pp: a sender stuck in ``fwd`` before its send).
Flight recorder: ``on`` (the black box's entries with group names and
``pg_config``), ``legacy`` (as the writer wrote before names were kept:
``pg_name`` holds the description), ``off``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tests.helpers.analysis import T0

TP = 2
STEPS = 6
FAULTS = ("span", "between", "before_init", "subgroup", "p2p")
LAYOUT_OF_FAULT = {"subgroup": ("tp",), "p2p": ("pp",)}


def groups_of(layout: str, world: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every process group, in creation order: (torch's group name, members). The default group is
    "0"."""
    groups = [("0", tuple(range(world)))]
    size = TP if layout in ("tp", "pp") else 0
    if size:
        for index, first in enumerate(range(0, world, size)):
            groups.append((str(index + 1), tuple(range(first, min(first + size, world)))))
    return groups


def _ops(layout: str, rank: int, groups: list[tuple[str, tuple[int, ...]]]) -> list[tuple]:
    """One step's ops on `rank`: ("open", name), ("close",), ("coll", group), ("send"|"recv", group,
    peer)."""
    ops: list[tuple] = [("open", "data_fetch"), ("close",)]
    mine = next((g for g in groups[1:] if rank in g[1]), None)
    if layout == "tp" and mine:
        ops += [
            ("open", "fwd"),
            ("open", "tp_all_reduce"),
            ("coll", mine[0]),
            ("close",),
            ("close",),
        ]
    elif layout == "pp" and mine and len(mine[1]) == 2:
        send = mine[1][0] == rank
        peer = mine[1][1] if send else mine[1][0]
        ops += [
            ("open", "fwd"),
            ("open", "send" if send else "recv"),
            ("send" if send else "recv", mine[0], peer),
            ("close",),
            ("close",),
        ]
    else:
        ops += [("open", "fwd"), ("close",)]
    ops += [("open", "all_reduce"), ("coll", "0"), ("close",)]
    return ops


def fault_point(
    fault: str, layout: str, rank: int, groups: list[tuple[str, tuple[int, ...]]]
) -> int:
    """The op index in the last step where the culprit stops (it never runs that op)."""
    ops = _ops(layout, rank, groups)
    if fault in ("between", "before_init"):
        return 0
    if fault == "span":
        return 1  # inside data_fetch
    return ops.index(("open", "fwd")) + 1  # inside fwd, before its sub-group collective or its send


def culprit_for(fault: str, layout: str, world: int, seed: int) -> int:
    """A culprit rank that can have the fault (a p2p culprit is a sender: stage 0 of a full
    pair)."""
    groups = groups_of(layout, world)
    candidates = list(range(world))
    if fault == "p2p":
        candidates = [g[1][0] for g in groups[1:] if len(g[1]) == 2]
    if fault == "subgroup":
        candidates = [r for g in groups[1:] if len(g[1]) >= 2 for r in g[1]]
    return candidates[(seed * 7 + 1) % len(candidates)]


def simulate(
    layout: str, world: int, culprit: int, fault: str, steps: int = STEPS
) -> dict[int, list[list]]:
    """Per rank, the ops it ran in order: ``[clock, step, op, state, seq]`` (state "done",
    "completed", or "waiting": where it is stuck)."""
    groups = groups_of(layout, world)
    members = dict(groups)
    per_step = {r: _ops(layout, r, groups) for r in range(world)}
    programs = {
        r: [
            (step, index, op)
            for step in range(1, steps + 1)
            for index, op in enumerate(per_step[r])
        ]
        for r in range(world)
    }
    stop = {
        culprit: (
            1 if fault == "before_init" else steps,
            fault_point(fault, layout, culprit, groups),
        )
    }
    position = {r: 0 for r in range(world)}
    waiting: dict[int, list | None] = {r: None for r in range(world)}
    done: dict[int, list[list]] = {r: [] for r in range(world)}
    arrived: dict[tuple, set[int]] = {}
    seqs: dict[tuple[int, str, bool], int] = {}
    clock = 0
    progressed = True
    while progressed:
        progressed = False
        for rank in range(world):
            while position[rank] < len(programs[rank]) and waiting[rank] is None:
                step, index, op = programs[rank][position[rank]]
                if rank in stop and (step, index) >= stop[rank]:
                    break
                clock += 1
                progressed = True
                if op[0] in ("open", "close"):
                    done[rank].append([clock, step, op, "done", None])
                    position[rank] += 1
                    continue
                collective = op[0] == "coll"
                seq = seqs[(rank, op[1], collective)] = seqs.get((rank, op[1], collective), 0) + 1
                entry = [clock, step, op, "waiting", seq]
                done[rank].append(entry)
                waiting[rank] = entry
                key = (op[1], collective, seq)
                arrived.setdefault(key, set()).add(rank)
                need = set(members[op[1]]) if collective else {rank, op[2]}
                if arrived[key] >= need:
                    for other in need:  # everyone in it leaves together
                        waiting[other][3] = "completed"  # type: ignore[index]
                        waiting[other] = None
                        position[other] += 1
    return done


def _span_id(rank: int, step: int, index: int) -> str:
    return hashlib.sha256(f"{rank}|{step}|{index}".encode()).hexdigest()[:16]


def write_hang_run(
    run_dir: Path,
    layout: str,
    world: int,
    fault: str,
    fr: str = "on",
    seed: int = 0,
    steps: int = STEPS,
    boxes: bool = True,
    culprit_box: bool = True,
) -> int:
    """Write the run; returns the culprit's rank. Every rank but a ``before_init`` culprit writes a
    file and (with `boxes`) a live stall record.

    `culprit_box` False: the culprit wrote none (killed before its watchdog fired, or an older
    writer between spans).
    """
    culprit = culprit_for(fault, layout, world, seed)
    groups = groups_of(layout, world)
    done = simulate(layout, world, culprit, fault, steps)
    for rank in range(world):
        if rank == culprit and fault == "before_init":
            continue
        _write_rank(
            run_dir,
            rank,
            world,
            layout,
            groups,
            done[rank],
            fault if rank == culprit else None,
            fr,
            boxes and (culprit_box or rank != culprit),
            steps,
        )
    return culprit


def _write_rank(
    run_dir: Path,
    rank: int,
    world: int,
    layout: str,
    groups: list,
    ops: list[tuple],
    fault: str | None,
    fr: str,
    boxes: bool,
    steps: int,
) -> None:
    identity = {
        "schema_version": 1,
        "rank": rank,
        "global_rank": rank,
        "local_rank": rank % 8,
        "world_size": world,
        "source": "training",
        "host_name": f"node-{rank // 8:03d}",
        "pid": 5000 + rank,
        "run_id": "hang-matrix",
        "attempt": 0,
        "job_id": None,
        "logger_name": "otel_titan.structured_logger",
    }
    records: list[dict[str, Any]] = []

    def add(name: str, time_us: int, log_type: str = "event", **fields: Any) -> None:
        records.append(
            {
                "time_us": time_us,
                "time_ms": time_us // 1000,
                "time": time_us // 1_000_000,
                "log_type": log_type,
                "log_type_name": name,
                "event_name": None,
                "log_level": "INFO",
                "tid": identity["pid"],
                "caller": "train.py:10:main",
                **fields,
                "seq_id": len(records) + 1,
                **identity,
            }
        )

    add("structured_logger_opened", T0, log_type="instant", otel_titan_version="0.1.0")
    stack: list[tuple[str, str, int]] = []
    entries: list[dict[str, Any]] = []
    mine = [(name, ranks) for name, ranks in groups if rank in ranks]
    local_pg = {name: index for index, (name, _) in enumerate(mine)}
    last_closed: tuple[str, int] | None = None
    time_us = T0
    step = 1
    for clock, step, op, state, seq in ops:
        time_us = T0 + clock * 1000
        if op[0] == "open":
            sid = _span_id(rank, step, clock)
            add(
                f"{op[1]}_start",
                time_us,
                span_id=sid,
                parent_span_id=stack[-1][1] if stack else None,
                step=step,
                relative_step=step,
            )
            stack.append((op[1], sid, time_us))
        elif op[0] == "close":
            name, sid, start = stack.pop()
            add(
                f"{name}_end",
                time_us,
                span_id=sid,
                parent_span_id=stack[-1][1] if stack else None,
                step=step,
                relative_step=step,
                value=(time_us - start) / 1000,
            )
            last_closed = (name, time_us)
        else:
            members = dict(groups)[op[1]]
            if op[0] == "coll":
                profiling = "nccl:all_reduce"
            else:
                me, peer = members.index(rank), members.index(op[2])
                profiling = (
                    f"nccl:send {me}->{peer}" if op[0] == "send" else f"nccl:recv {me}<-{peer}"
                )
            p2p = op[0] != "coll"
            entries.append(
                {
                    "pg_id": local_pg[op[1]],
                    "pg_name": op[1],
                    "pg_desc": "default_pg" if op[1] == "0" else "undefined",
                    "collective_seq_id": 0 if p2p else seq,
                    "p2p_seq_id": seq if p2p else 0,
                    "is_p2p": p2p,
                    "op": profiling,
                    "input_sizes": [[16]],
                    "output_sizes": [[16]],
                    "input_dtypes": ["Float"],
                    "state": "scheduled" if state == "waiting" else "completed",
                    "retired": state != "waiting",
                    "time_created_ns": time_us * 1000,
                }
            )
    if boxes:
        stall_us = time_us + 3_000_000
        frame = (
            {"file": "train.py", "line": 34, "function": "read_shard"}
            if fault
            else {"file": "train.py", "line": 80, "function": "main"}
        )
        library = (
            [
                {
                    "file": ".venv/lib/python3.11/site-packages/torch/distributed/c10d.py",
                    "line": 2800,
                    "function": "all_reduce",
                }
            ]
            if not fault
            else []
        )
        box: dict[str, Any] = {
            "reason": "stall",
            "stalled_s": 3.0,
            "stall_after_s": 3.0,
            "message": "stall",
            "open_spans": [
                {
                    "name": name,
                    "span_id": sid,
                    "step": step,
                    "open_s": round((stall_us - start) / 1e6, 3),
                }
                for name, sid, start in stack
            ],
            "threads": [{"thread_name": "MainThread", "main": True, "frames": library + [frame]}],
            "where": "in_span" if stack else "between_spans",
            "last_span": {
                "name": last_closed[0],
                "ended_s_ago": round((stall_us - last_closed[1]) / 1e6, 3),
            }
            if last_closed and not stack
            else None,
            "step": steps if fault == "between" else step,
        }
        if fr != "off":
            window = entries[-64:]
            if fr == "legacy":
                window = [
                    {k: v for k, v in e.items() if k not in ("pg_desc", "input_dtypes")}
                    | {"pg_name": e["pg_desc"]}
                    for e in window
                ]
                box["flight_recorder"] = {"version": "2.10", "entries": window}
            else:
                box["flight_recorder"] = {
                    "version": "2.10",
                    "entries": window,
                    "pg_config": {name: {"desc": "", "ranks": list(ranks)} for name, ranks in mine},
                }
        add("stall", stall_us, log_type="instant", **box)
    path = run_dir / "structured_logs" / f"training.global_rank_{rank}.20261130-000000-abcdef.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))


def fr_entry(
    pg: str,
    seq: int,
    op: str = "all_reduce",
    state: str = "completed",
    ranks: tuple[int, ...] | None = None,
    pg_id: int | None = None,
    sizes: list | None = None,
    dtype: str = "Float",
    p2p: bool = False,
) -> dict[str, Any]:
    """One flight-recorder entry as the black box keeps it (group name and description, dtypes)."""
    return {
        "pg_id": int(pg) if pg_id is None else pg_id,
        "pg_name": pg,
        "pg_desc": "default_pg" if pg == "0" else "undefined",
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "is_p2p": p2p,
        "op": f"nccl:{op}",
        "input_sizes": sizes or [[16]],
        "output_sizes": sizes or [[16]],
        "input_dtypes": [dtype],
        "state": "scheduled" if state != "completed" else "completed",
        "retired": state == "completed",
        "time_created_ns": (T0 + seq * 1000) * 1000,
    }


def write_rank(
    run_dir: Path,
    rank: int,
    world: int,
    records: list[tuple],
    *,
    closed: bool = False,
    run_id: str = "hang-rules",
    torn: bool = False,
) -> Path:
    """One rank's file from a short script: ("span", name, step[, parent]) opens, ("end",) closes
    the innermost, ("stall", fields) writes a black box, ("instant", name, step), ("heartbeat",) 10
    s later, ("raise", type, message[, step]) an uncaught exception unwinding every open span (their
    ``_error`` and ``_end``, then ``uncaught_exception``, as the writer's excepthook); each 1 ms
    after the last (("same",) keeps the next at this one's time, ("wait", s) adds s seconds)."""
    identity = {
        "schema_version": 1,
        "rank": rank,
        "global_rank": rank,
        "local_rank": rank,
        "world_size": world,
        "source": "training",
        "host_name": "vm",
        "pid": 6000 + rank,
        "run_id": run_id,
        "attempt": 0,
        "job_id": None,
        "logger_name": "otel_titan.structured_logger",
    }
    out: list[dict[str, Any]] = []
    time_us = T0
    stack: list[tuple[str, str, int, int]] = []
    keep = False

    def add(name: str, log_type: str = "event", **fields: Any) -> None:
        out.append(
            {
                "time_us": time_us,
                "log_type": log_type,
                "log_type_name": name,
                "tid": identity["pid"],
                **fields,
                "seq_id": len(out) + 1,
                **identity,
            }
        )

    add("structured_logger_opened", "instant")
    for index, item in enumerate(records):
        kind = item[0]
        if kind == "same":
            keep = True
            continue
        if not keep:
            time_us += 1000
        keep = False
        if kind == "wait":
            time_us += int(item[1] * 1e6)
            continue
        if kind == "span":
            sid = _span_id(rank, item[2], index)
            add(
                f"{item[1]}_start",
                span_id=sid,
                parent_span_id=stack[-1][1] if stack else None,
                step=item[2],
            )
            stack.append((item[1], sid, time_us, item[2]))
        elif kind == "end":
            name, sid, start, step = stack.pop()
            add(
                f"{name}_end",
                span_id=sid,
                parent_span_id=stack[-1][1] if stack else None,
                step=step,
                value=(time_us - start) / 1000,
            )
        elif kind == "stall":
            fields = {
                "reason": "stall",
                "stalled_s": 3.0,
                "stall_after_s": 3.0,
                "message": "stall",
                "open_spans": [
                    {"name": n, "span_id": sid, "step": st, "open_s": 3.0}
                    for n, sid, _, st in stack
                ],
                "where": "in_span" if stack else "between_spans",
                **item[1],
            }
            add("stall", "instant", **fields)
        elif kind == "instant":
            add(item[1], "instant", step=item[2])
        elif kind == "signal":  # torchrun's agent stopping it
            add("signal_received", "instant", signal="SIGTERM")
        # an exception nothing caught: it fails every open span, innermost first
        elif kind == "raise":
            # between spans: the step it set, when given
            step = stack[-1][3] if stack else (item[3] if len(item) > 3 else None)
            while stack:
                name, sid, start, span_step = stack.pop()
                add(
                    f"{name}_error",
                    span_id=sid,
                    parent_span_id=stack[-1][1] if stack else None,
                    step=span_step,
                    error_type=item[1],
                    error_message=item[2],
                )
                add(
                    f"{name}_end",
                    span_id=sid,
                    parent_span_id=stack[-1][1] if stack else None,
                    step=span_step,
                    value=(time_us - start) / 1000,
                )
            add(
                "uncaught_exception",
                "instant",
                step=step,
                error_type=item[1],
                error_message=item[2],
                error_frames=["train.py:88:step_fn"],
                fatal=True,
            )
        elif kind == "heartbeat":  # the logger's: 10 s of quiet with spans open
            time_us += 10_000_000
            add("heartbeat", "instant", open_spans=len(stack))
    if closed:
        time_us += 1000
        add("structured_logger_closed", "instant", closing=True)
    path = run_dir / "structured_logs" / f"training.global_rank_{rank}.20261130-000000-abcdef.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"".join(json.dumps(r).encode() + b"\n" for r in out)
        + (b'{"time_us": 1, "log_ty' if torn else b"")
    )
    return path


def frames(function: str, line: int = 34) -> list[dict[str, Any]]:
    """A main thread's stack in the black box, innermost first."""
    return [
        {
            "thread_name": "MainThread",
            "main": True,
            "frames": [{"file": "train.py", "line": line, "function": function}],
        }
    ]

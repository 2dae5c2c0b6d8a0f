"""torch's flight recorder, as the Hang section compares it: per process group, where each rank got
to.

Two inputs hold the same facts: the ``model.flight_recorder`` field of a ``stall``
record (the black box: entries abridged by the writer) and the files torch
writes itself on a collective timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``,
``TORCH_FR_DUMP_TEMP_FILE=<prefix>``: one pickle per rank, ``<prefix><rank>``,
written by torch's watchdog even when Python is wedged). Both become one
`digest`: per process group, its last collective, the last few by sequence
number (to find a desync), and its point-to-point ops.

Groups are compared across ranks by *identity*, never by ``pg_id``: ``pg_id``
counts the groups a rank belongs to, so group [1, 2] is pg 2 on rank 1 and
pg 1 on rank 2 (checked on torch 2.13, gloo). The identity is torch's group
name (``process_group[0]``: given by a counter or a hash of the ranks, the
same on every member) with its membership from ``pg_config``; torch 2.13
leaves ``pg_config`` empty for gloo (``{"": {"ranks": "[]"}}``), so the
membership is then the writer's own (``get_process_group_ranks``), or, for a
group other than the default one, inferred from the ranks that report it.
A writer that kept only the description (``pg_name``: "default_pg",
"undefined", before ``pg_desc`` was added) leaves sub-groups unidentified:
they are not compared (the default group, ``pg_id`` 0, always is).

The pickles are read with an unpickler that builds only plain containers,
strings and numbers: a file in a shared folder must not run code.
"""

from __future__ import annotations

import ast
import io
import os
import pickle
import re
from collections.abc import Iterable
from typing import Any

__all__ = [
    "digest_recorder",
    "read_torch_dump",
    "find_torch_dumps",
    "group_label",
    "COMPARED_SIZES",
    "DEFAULT_GROUP",
]

#: The default group's name in torch (``dist.init_process_group`` creates it first).
DEFAULT_GROUP = "0"
#: Entries of one group kept per process, by sequence number, for the desync check.
RECENT_PER_GROUP = 4
#: Point-to-point entries kept per group and process.
P2P_PER_GROUP = 8
#: The black box keeps this many entries (core/blackbox.py MAX_FR_ENTRIES): fewer means nothing was
#: cut.
WRITER_MAX_ENTRIES = 64
#: Ops whose input sizes and dtypes must be equal on every rank (all_to_all, gather and scatter
#: legitimately differ).
COMPARED_SIZES = frozenset(
    {
        "all_reduce",
        "allreduce",
        "broadcast",
        "all_gather",
        "_allgather_base",
        "allgather",
        "reduce_scatter",
        "_reduce_scatter_base",
        "reduce",
        "barrier",
        "allreduce_coalesced",
    }
)
_DUMP_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")
_P2P = re.compile(r"^(send|recv) (\d+)(->|<-)(\d+)$")


def _op_name(profiling: Any) -> tuple[str | None, int | None]:
    """``"nccl:send 0->1"`` → ("send", 1) (the group-local peer); ``"gloo:all_reduce"`` →
    ("all_reduce", None)."""
    if not isinstance(profiling, str):
        return None, None
    name = profiling.split(":", 1)[1] if ":" in profiling else profiling
    p2p = _P2P.match(name)
    if p2p:
        kind, left, _, right = p2p.groups()
        # "send s->d" and "recv d<-s": the peer is d for a send, s for a recv.
        return kind, int(right)
    return name, None


def _state(entry: dict[str, Any]) -> Any:
    # gloo leaves a finished entry "scheduled" and retired; torch's fr_trace reads retired as done.
    state = entry.get("state")
    return "completed" if entry.get("retired") and state == "scheduled" else state


def _ranks(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    if isinstance(value, (list, tuple)) and value and all(type(r) is int for r in value):
        return tuple(sorted(value))
    return None


def digest_recorder(recorder: Any, world: tuple[int, ...] | None = None) -> dict[str, Any] | None:
    """One rank's flight recorder (black-box field or torch dump) → ``{"groups": {name: ...},
    "complete": bool}``; None when off.

    Each group: ``name`` (None: unidentified), ``pg_id`` (this rank's), ``desc``, ``ranks``
    (membership, None when unknown), ``last`` (the latest collective: seq, op, state,
    sizes, dtypes), ``recent`` (seq → (op, sizes, dtypes)), ``p2p`` (latest point-to-point
    ops: op, peer (group-local), seq, state). `world`: the default group's members.
    """
    if not isinstance(recorder, dict) or not isinstance(recorder.get("entries"), list):
        return None
    configs: dict[str, tuple[int, ...]] = {}
    for name, config in (recorder.get("pg_config") or {}).items():
        ranks = _ranks((config or {}).get("ranks")) if isinstance(config, dict) else None
        if name and ranks:
            configs[str(name)] = ranks
    groups: dict[Any, dict[str, Any]] = {}
    entries = recorder["entries"]
    record_ids = [e.get("record_id") for e in entries if type(e.get("record_id")) is int]
    complete = (min(record_ids) == 0) if record_ids else len(entries) < WRITER_MAX_ENTRIES
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        name, desc = _identity(entry)
        pg_id = entry.get("pg_id") if type(entry.get("pg_id")) is int else None
        if name is None and pg_id == 0:
            name = DEFAULT_GROUP
        key = name if name is not None else ("pg_id", pg_id)
        group = groups.get(key)
        if group is None:
            ranks = configs.get(name) if name is not None else None
            if ranks is None and name == DEFAULT_GROUP:
                ranks = world
            group = groups[key] = {
                "name": name,
                "pg_id": pg_id,
                "desc": desc,
                "ranks": ranks,
                "last": None,
                "recent": {},
                "p2p": [],
            }
        op, peer = _op_name(entry.get("op") if "op" in entry else entry.get("profiling_name"))
        sizes = entry.get("input_sizes")
        dtypes = entry.get("input_dtypes")
        if entry.get("is_p2p") or op in ("send", "recv"):
            seq = entry.get("p2p_seq_id")
            group["p2p"].append({"op": op, "peer": peer, "seq": seq, "state": _state(entry)})
            del group["p2p"][:-P2P_PER_GROUP]
            continue
        seq = entry.get("collective_seq_id")
        if type(seq) is not int:
            continue
        last = group["last"]
        if last is None or seq >= last["seq"]:
            group["last"] = {
                "seq": seq,
                "op": op,
                "state": _state(entry),
                "sizes": sizes,
                "dtypes": dtypes,
            }
        group["recent"][seq] = (op, _freeze(sizes), _freeze(dtypes))
        if len(group["recent"]) > RECENT_PER_GROUP:
            del group["recent"][min(group["recent"])]
    return {"groups": groups, "complete": complete, "configs": configs}


def _identity(entry: dict[str, Any]) -> tuple[str | None, Any]:
    """(torch's group name, its description) of one entry, in either format."""
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) == 2:  # torch's own: [name, desc]
        return (str(pg[0]) if pg[0] not in (None, "") else None), pg[1]
    if "pg_desc" in entry:  # the black box, with the name kept
        name = entry.get("pg_name")
        return (str(name) if name not in (None, "") else None), entry.get("pg_desc")
    return None, entry.get("pg_name")  # an older black box: pg_name held the description only


def _freeze(value: Any) -> Any:
    """Lists → tuples (hashable, compared across ranks); anything else not hashable → its text."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def group_label(name: Any, pg_id: Any, ranks: tuple[int, ...] | None, compress: Any) -> str:
    """``pg 0`` for the default group; ``pg 1 (ranks 0-1)`` for a sub-group of known members."""
    if name is None:
        return f"pg id {pg_id} (unidentified)"
    if name == DEFAULT_GROUP or not ranks:
        return f"pg {name}"
    return f"pg {name} (ranks {compress(list(ranks))})"


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers only: loading never runs code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a flight-recorder dump")


def read_torch_dump(path: str, max_bytes: int = 256 << 20) -> dict[str, Any] | None:
    """torch's flight-recorder dump file (a pickle: entries, pg_config, pg_status, version), or None
    when it is not one."""
    try:
        with open(path, "rb") as handle:
            if handle.read(1) != b"\x80":  # pickle protocol 2+
                return None
            handle.seek(0)
            data = handle.read(max_bytes + 1)
    except OSError:
        return None
    if len(data) > max_bytes:
        return None
    try:
        dump = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - not a dump, or a hostile one: skipped
        return None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        return None
    return dump


def find_torch_dumps(
    folders: Iterable[str], prefix: str | None = None
) -> dict[int, tuple[str, dict[str, Any]]]:
    """Global rank → (path, dump) of torch's flight-recorder files found in `folders` (and at
    `prefix`, torch's ``TORCH_FR_DUMP_TEMP_FILE``).

    A file qualifies when its name ends in the rank's number and it unpickles (plainly) to a dump;
    when a rank has several, the newest.
    """
    candidates: list[str] = []
    for folder in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        candidates += [
            os.path.join(folder, n) for n in names if _DUMP_NAME.match(n) and ".jsonl" not in n
        ]
    if prefix:
        folder, start = os.path.split(prefix)
        try:
            candidates += [
                os.path.join(folder or ".", n)
                for n in os.listdir(folder or ".")
                if n.startswith(start) and n[len(start) :].isdigit()
            ]
        except OSError:
            pass
    found: dict[int, tuple[float, str, dict[str, Any]]] = {}
    for path in sorted(set(candidates)):
        if not os.path.isfile(path):
            continue
        match = _DUMP_NAME.match(os.path.basename(path))
        dump = read_torch_dump(path) if match else None
        if dump is None:
            continue
        rank = int(match.group("rank"))  # type: ignore[union-attr]  # the file name matched the pattern when it was listed
        mtime = os.path.getmtime(path)
        if rank not in found or mtime > found[rank][0]:
            found[rank] = (mtime, path, dump)
    return {rank: (path, dump) for rank, (_, path, dump) in found.items()}

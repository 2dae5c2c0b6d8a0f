"""Who this process is: rank, world, run and attempt, found without being told.

Each field is taken, in order, from the argument to `init_structured_logger`,
the launcher's environment, and an initialised ``torch.distributed``:

=============  ===========================================================  ==============
field          environment (first set wins)                                 torch fallback
=============  ===========================================================  ==============
rank           ``RANK``, ``SLURM_PROCID``                                   ``get_rank()``
world_size     ``WORLD_SIZE``, ``SLURM_NTASKS``                             ``get_world_size()``
local_rank     ``LOCAL_RANK``, ``SLURM_LOCALID``                            None
run_id         ``OTEL_TITAN_RUN_ID``, ``TORCHELASTIC_RUN_ID`` (unless       None (see below)
               ``none``), ``SLURM_JOB_ID``, ``RAY_JOB_ID``
attempt        ``TORCHELASTIC_RESTART_COUNT``, ``SLURM_RESTART_COUNT``      0
job_id         ``SLURM_JOB_ID``                                             None
=============  ===========================================================  ==============

The run id is what the user, the launcher or a parent process *shares*: the
``run_id=`` argument; ``OTEL_TITAN_RUN_ID``, which the user may set and which
`export_run_id` sets for this process's children (subprocesses, multiprocessing
workers, forked or spawned, inherit it) once the logger is up, so every process
an RL controller starts by hand names the controller's run; then torchrun's
rendezvous id, the SLURM job (and step), the Ray job. When none of them says,
the run id is None (``null`` in the records): nobody named the run, and a
random id would pass for a name while splitting one job into as many "runs" as
it has processes. Such a process still has a ``process_run_id`` of its own (for
its trace ids): the one its otel-titan parent shared through
``OTEL_TITAN_PROCESS_RUN_ID``, else a new random one; the reader groups
processes with no run id by that id and by overlapping time
(``otel_titan.analysis.read.runs``).

A world size or local rank that no source gives stays unknown (None, written
as ``null``), never guessed: ``rank=3`` alone says nothing about how many ranks
there are or where rank 3 runs. Only facts are derived: a process with no rank,
world size or local rank from any source (a plain ``python train.py``) is rank
0 of a world of 1, local rank 0, and a world of 1 has local rank 0. The rank
names the file, so it is never unknown: without one it is 0, as in torchtitan.

torch is never imported here: it is consulted only if the program already
imported it, so the core works (and starts fast) without it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.resources import Resource

from otel_titan.environment_variables import OTEL_TITAN_PROCESS_RUN_ID, OTEL_TITAN_RUN_ID
from otel_titan.schema import ATTR

__all__ = ["RunIdentity", "discover_identity", "build_resource", "export_run_id", "RESOURCE_ATTR"]

_log = logging.getLogger("otel_titan")


class RESOURCE_ATTR:
    """Resource attribute names (see docs/schema.md)."""

    RANK = "titan.rank"
    LOCAL_RANK = "titan.local_rank"
    WORLD_SIZE = "titan.world_size"
    SOURCE = "titan.source"
    RUN_ID = "titan.run_id"
    #: Present instead of `RUN_ID` when no run id was given (`RunIdentity.process_run_id`).
    PROCESS_RUN_ID = "titan.process_run_id"
    ATTEMPT = "titan.attempt"
    JOB_ID = "titan.job_id"
    #: Which of a step's traces this process's spans are in: rank // trace group size (absent when
    #: all ranks share one trace).
    TRACE_GROUP = "titan.trace_group"
    #: Prefixes of the mesh coordinates (``titan.mesh.pp``) and sizes (``titan.mesh_shape.pp``),
    #: when the job declared a mesh.
    MESH_PREFIX = ATTR.MESH_PREFIX
    MESH_SHAPE_PREFIX = ATTR.MESH_SHAPE_PREFIX


@dataclass(frozen=True)
class RunIdentity:
    """The identity every record and the OpenTelemetry Resource carry."""

    source: str
    rank: int
    #: None when no source gives it (never derived from the rank).
    local_rank: int | None
    #: None when no source gives it (never derived from the rank).
    world_size: int | None
    #: The run's id as the user, the launcher or a parent process gave it; None when none did.
    run_id: str | None
    attempt: int
    job_id: str | None
    host_name: str | None
    pid: int = field(default_factory=os.getpid)
    service_instance_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    #: Where each field came from ("argument", "RANK", "torch.distributed", "default"...).
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)
    #: This rank's coordinate per mesh dimension and each dimension's size (`core.mesh`); None
    #: without a declared mesh.
    mesh: Mapping[str, int] | None = None
    mesh_shape: Mapping[str, int] | None = None
    #: The id this process's trace ids are made from and its children inherit: `run_id` when there
    #: is one, else the one an otel-titan parent shared (``OTEL_TITAN_PROCESS_RUN_ID``), else a
    #: random one (None: made here).
    process_run_id: str | None = None

    def __post_init__(self) -> None:
        if self.process_run_id is None:
            object.__setattr__(
                self, "process_run_id", self.run_id if self.run_id is not None else uuid.uuid4().hex
            )


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _torch_distributed() -> Any | None:
    # Only if the program imported torch already: importing it here would cost
    # seconds and make torch a hard dependency.
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # noqa: BLE001 - a broken torch install must not break logging
        return None
    return None


def _pick_int(
    name: str,
    explicit: int | None,
    environ: Mapping[str, str],
    env_names: tuple[str, ...],
    torch_value: Any,
    default: int | None,
    origins: dict[str, str],
) -> int | None:
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int):
            raise TypeError(f"{name} must be an int, got {type(explicit).__name__} {explicit!r}")
        origins[name] = "argument"
        return explicit
    for env_name in env_names:
        value = _env_int(environ, env_name)
        if value is not None:
            origins[name] = env_name
            return value
    if torch_value is not None:
        origins[name] = "torch.distributed"
        return int(torch_value())
    origins[name] = "default"
    return default


def discover_identity(
    source: str,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    run_id: str | None = None,
    attempt: int | None = None,
    job_id: str | None = None,
    include_hostname: bool = True,
    environ: Mapping[str, str] | None = None,
) -> RunIdentity:
    """Find this process's identity from arguments, the launcher and torch.distributed.

    Raises `ValueError` for an environment variable that is set but not an
    integer, or a rank outside ``[0, world_size)``. A world size or local rank
    that no source gives is None (see the module docstring).

    Example:
        >>> ident = discover_identity("training", environ={"RANK": "3", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "r1"})
        >>> ident.rank, ident.world_size, ident.run_id, ident.origins["rank"]
        (3, 8, 'r1', 'RANK')
        >>> ident = discover_identity("training", rank=3, environ={})
        >>> ident.world_size, ident.local_rank, ident.origins["world_size"]
        (None, None, 'unknown')
    """
    env = os.environ if environ is None else environ
    origins: dict[str, str] = {}
    dist = _torch_distributed() if environ is None else None
    rank_value = _pick_int(
        "rank", rank, env, ("RANK", "SLURM_PROCID"), dist.get_rank if dist else None, None, origins
    )
    world_value = _pick_int(
        "world_size",
        world_size,
        env,
        ("WORLD_SIZE", "SLURM_NTASKS"),
        dist.get_world_size if dist else None,
        None,
        origins,
    )
    local_value = _pick_int(
        "local_rank", local_rank, env, ("LOCAL_RANK", "SLURM_LOCALID"), None, None, origins
    )
    if rank_value is None and world_value is None and local_value is None:
        # Nothing says this is one of several processes: a plain single process.
        rank_value, world_value, local_value = 0, 1, 0
    else:
        if rank_value is None:
            # The rank names the file, so it cannot stay unknown: 0, as in
            # torchtitan (``int(os.environ.get("RANK", 0))``); origin "default".
            rank_value = 0
        if local_value is None and world_value == 1:
            # the only process is local rank 0: known, not guessed
            local_value, origins["local_rank"] = (
                0,
                "world_size",
            )
        for name, value in (("world_size", world_value), ("local_rank", local_value)):
            if value is None:
                origins[name] = "unknown"
    attempt_value = _pick_int(
        "attempt",
        attempt,
        env,
        ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"),
        None,
        0,
        origins,
    )
    assert attempt_value is not None
    if world_value is not None and world_value < 1:
        raise ValueError(
            f"world_size must be at least 1, got {world_value} (from {origins['world_size']})"
        )
    if rank_value < 0 or (world_value is not None and rank_value >= world_value):
        raise ValueError(
            f"rank {rank_value} (from {origins['rank']}) is outside [0, world_size={world_value}) "
            f"(from {origins['world_size']})"
        )
    if local_value is not None and local_value < 0:
        raise ValueError(f"local_rank must be >= 0, got {local_value}")

    job_value = job_id if job_id is not None else (env.get("SLURM_JOB_ID") or None)
    run_value, process_value = _pick_run_id(run_id, env, origins)
    # several ranks, or not known to be alone
    if run_value is None and origins["process_run_id"] == "random" and world_value != 1:
        _log.warning(
            "otel-titan: no run id (no OTEL_TITAN_RUN_ID, TORCHELASTIC_RUN_ID unset or 'none', no "
            "SLURM_JOB_ID or RAY_JOB_ID); rank %d records "
            "run_id null, so ranks will not share per-step trace ids, and the reader groups the "
            "run's processes by time only. "
            "Pass run_id=... to init_structured_logger, export OTEL_TITAN_RUN_ID, or launch with "
            "--rdzv-id.",
            rank_value,
        )
    host = socket.gethostname() if include_hostname else None
    return RunIdentity(
        source=source,
        rank=rank_value,
        local_rank=local_value,
        world_size=world_value,
        run_id=run_value,
        attempt=attempt_value,
        job_id=job_value,
        host_name=host,
        origins=origins,
        process_run_id=process_value,
    )


def _pick_run_id(
    explicit: str | None, env: Mapping[str, str], origins: dict[str, str]
) -> tuple[str | None, str]:
    """(run id, process run id) and their origins: the first source that names the run (module
    docstring)."""
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit:
            raise TypeError(f"run_id must be a non-empty str, got {explicit!r}")
        origins["run_id"] = origins["process_run_id"] = "argument"
        return explicit, explicit
    run_value: str | None = None
    shared = env.get(OTEL_TITAN_RUN_ID, "").strip()
    elastic = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if shared:
        run_value, origins["run_id"] = shared, OTEL_TITAN_RUN_ID
    elif elastic not in ("", "none"):
        run_value, origins["run_id"] = elastic, "TORCHELASTIC_RUN_ID"
    elif env.get("SLURM_JOB_ID", "").strip():
        step = env.get("SLURM_STEP_ID", "").strip()
        run_value = f"slurm-{env['SLURM_JOB_ID'].strip()}" + (f".{step}" if step else "")
        origins["run_id"] = "SLURM_JOB_ID"
    elif env.get("RAY_JOB_ID", "").strip():
        run_value, origins["run_id"] = f"ray-{env['RAY_JOB_ID'].strip()}", "RAY_JOB_ID"
    if run_value is not None:
        origins["process_run_id"] = "run_id"
        return run_value, run_value
    origins["run_id"] = "none"
    inherited = env.get(OTEL_TITAN_PROCESS_RUN_ID, "").strip()
    if inherited:
        origins["process_run_id"] = OTEL_TITAN_PROCESS_RUN_ID
        return None, inherited
    origins["process_run_id"] = "random"
    return None, uuid.uuid4().hex


def export_run_id(identity: RunIdentity, environ: Any = None) -> Callable[[], None]:
    """Share `identity`'s run with the processes this one starts from now on; returns the undo (for
    shutdown).

    Sets ``OTEL_TITAN_RUN_ID`` to the run id, or, with none, ``OTEL_TITAN_PROCESS_RUN_ID``
    to the process run id, in `environ` (``os.environ``), which subprocesses and
    multiprocessing workers (fork or spawn) inherit. The undo puts back what was
    there, unless something else changed the variable since.

    Example:
        >>> env = {}
        >>> undo = export_run_id(discover_identity("controller", environ={}), env)
        >>> sorted(env), undo(), env
        (['OTEL_TITAN_PROCESS_RUN_ID'], None, {})
    """
    target = os.environ if environ is None else environ
    name, value = (
        (OTEL_TITAN_RUN_ID, identity.run_id)
        if identity.run_id is not None
        else (OTEL_TITAN_PROCESS_RUN_ID, identity.process_run_id)
    )
    assert value is not None
    before = target.get(name)
    target[name] = value

    def undo() -> None:
        if target.get(name) == value:
            if before is None:
                target.pop(name, None)
            else:
                target[name] = before

    return undo


def build_resource(identity: RunIdentity, trace_group: int | None = None) -> Resource:
    """The OpenTelemetry `Resource` of this process.

    Precedence: the identity found above beats ``OTEL_RESOURCE_ATTRIBUTES``
    (they are facts about the process); ``service.name`` comes from
    ``OTEL_SERVICE_NAME``, then ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``,
    then the source. With the host name left out, ``host.name`` is removed even
    if a resource detector or the environment supplied it.

    Example:
        >>> ident = discover_identity("training", environ={"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "r"}, include_hostname=False)
        >>> res = build_resource(ident)
        >>> res.attributes["titan.rank"], "host.name" in res.attributes
        (1, False)
    """
    attributes: dict[str, Any] = {
        RESOURCE_ATTR.RANK: identity.rank,
        RESOURCE_ATTR.SOURCE: identity.source,
        RESOURCE_ATTR.ATTEMPT: identity.attempt,
        "service.instance.id": identity.service_instance_id,
        "process.pid": identity.pid,
    }
    # Unknown is absent: OpenTelemetry attributes cannot be null (the SDK would drop them with a
    # warning).
    if identity.run_id is not None:
        attributes[RESOURCE_ATTR.RUN_ID] = identity.run_id
    else:
        attributes[RESOURCE_ATTR.PROCESS_RUN_ID] = identity.process_run_id
    if identity.local_rank is not None:
        attributes[RESOURCE_ATTR.LOCAL_RANK] = identity.local_rank
    if identity.world_size is not None:
        attributes[RESOURCE_ATTR.WORLD_SIZE] = identity.world_size
    if identity.job_id is not None:
        attributes[RESOURCE_ATTR.JOB_ID] = identity.job_id
    if identity.host_name is not None:
        attributes["host.name"] = identity.host_name
    # which of the step's traces this rank's spans are in (trace_ids.py)
    if trace_group is not None:
        attributes[RESOURCE_ATTR.TRACE_GROUP] = trace_group
    for name, coord in (identity.mesh or {}).items():
        attributes[RESOURCE_ATTR.MESH_PREFIX + name] = coord
    for name, size in (identity.mesh_shape or {}).items():
        attributes[RESOURCE_ATTR.MESH_SHAPE_PREFIX + name] = size
    resource = Resource.create(attributes)
    service_name = resource.attributes.get("service.name")
    explicit = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    if not explicit or not service_name or str(service_name).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": identity.source}))
    attributes = dict(resource.attributes)
    if identity.host_name is None:
        attributes.pop("host.name", None)
    return ProcessResource(attributes, resource.schema_url)


class ProcessResource(Resource):
    """The process's `Resource`, with its hash computed once.

    The OTLP encoder groups every span of a batch by Resource, hashing it each
    time, and `Resource.__hash__` serialises all attributes to JSON: about a
    quarter of the encoder's time per span. A Resource never changes, so once
    is enough.
    """

    def __hash__(self) -> int:
        cached = self.__dict__.get("_otel_titan_hash")
        if cached is None:
            cached = self.__dict__["_otel_titan_hash"] = super().__hash__()
        return cached

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)

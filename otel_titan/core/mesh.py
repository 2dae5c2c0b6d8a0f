"""This rank's place in the job's device mesh: its coordinate in each parallelism dimension.

Why: ranks of one job do different work by design (a pipeline's last stage
runs a longer forward; an expert-parallel or tensor-parallel position its own
share), so the analysis must compare a rank only with the ranks that should do
the same work: the same coordinates but data-parallel. Nothing in a record
says which those are unless the job declares its mesh: the ``mesh`` option of
`init_structured_logger` (a ``{"pp": 2, "dp": 4, "tp": 2}`` of sizes, or
torch's ``DeviceMesh`` itself), else ``OTEL_TITAN_MESH`` (``pp=2,dp=4,tp=2``).

Sizes given as a mapping are laid out as ``torch.distributed.init_device_mesh``
lays them out: row-major in the order given, the last dimension varying
fastest (rank = ((pp × dp_size) + dp) × tp_size + tp). A ``DeviceMesh`` gives
its own names, shape and this rank's coordinate (``get_coordinate()``), so any
layout it was built with is read as it is.

A program that builds a ``DeviceMesh`` and does not pass it in is still
read (`mesh_from_process_groups`): torch keeps no registry of meshes, but each
mesh dimension's process group carries ``group_desc == "mesh_<dim>"`` and its
members are in ``torch.distributed.distributed_c10d._world.pg_group_ranks``;
once the groups exist (the logger looks at the first step boundaries) this
rank's coordinate in each dimension is its rank within that dimension's group.

torch is never imported here: a DeviceMesh is read through its attributes,
the process groups through the module torch has already loaded.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from otel_titan.environment_variables import OTEL_TITAN_MESH

__all__ = ["MeshPlace", "check_mesh_option", "mesh_from_process_groups", "resolve_mesh"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
#: A mesh of more dimensions than this is a mistake (torchtitan's has at most 6).
_MAX_DIMS = 8

MeshPlace = tuple[dict[str, int], dict[str, int]]
"""(this rank's coordinate per dimension, each dimension's size), in the mesh's order."""


def _is_device_mesh(value: object) -> bool:
    return hasattr(value, "mesh_dim_names") and callable(getattr(value, "get_coordinate", None))


def check_mesh_option(value: object) -> None:
    """Raise `TypeError` / `ValueError` naming what is wrong with a ``mesh`` option (None, a mapping
    of sizes, or a DeviceMesh).

    Example:
        >>> check_mesh_option({"pp": 2, "dp": 4})
        >>> check_mesh_option({"pp": 0})
        Traceback (most recent call last):
        ...
        ValueError: option mesh: the size of dimension 'pp' must be an int >= 1, got 0
    """
    if value is None or _is_device_mesh(value):
        return
    if not isinstance(value, Mapping):
        raise TypeError(
            f"option mesh must be a dict of dimension sizes (e.g. {{'pp': 2, 'dp': 4}}) or a "
            f"torch DeviceMesh, got {type(value).__name__} {value!r}"
        )
    _check_sizes(dict(value), "option mesh")


def _check_sizes(sizes: dict[Any, Any], where: str) -> dict[str, int]:
    if not sizes:
        raise ValueError(f"{where}: no dimension given")
    if len(sizes) > _MAX_DIMS:
        raise ValueError(f"{where}: {len(sizes)} dimensions (at most {_MAX_DIMS})")
    for name, size in sizes.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"{where}: dimension name {name!r} must be a short identifier (pp, dp, dp_shard, "
                "cp, tp, ep, ...)"
            )
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(
                f"{where}: the size of dimension {name!r} must be an int >= 1, got {size!r}"
            )
    return sizes


def _from_env(raw: str) -> dict[str, int]:
    """``pp=2,dp=4`` or ``{"pp": 2, "dp": 4}``."""
    text = raw.strip()
    if text.startswith("{"):
        try:
            sizes = json.loads(text)
        except ValueError as error:
            raise ValueError(f"{OTEL_TITAN_MESH}={raw!r} is not valid JSON: {error}") from None
        if not isinstance(sizes, dict):
            raise ValueError(f"{OTEL_TITAN_MESH}={raw!r} must be an object of dimension sizes")
        return _check_sizes(sizes, OTEL_TITAN_MESH)
    sizes = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        if not sep:
            raise ValueError(
                f"{OTEL_TITAN_MESH}={raw!r}: expected NAME=SIZE pairs separated by commas (e.g. "
                f"pp=2,dp=4,tp=2), got {part!r}"
            )
        try:
            sizes[name.strip()] = int(size.strip())
        except ValueError:
            raise ValueError(
                f"{OTEL_TITAN_MESH}={raw!r}: the size of {name.strip()!r} is not an integer: "
                f"{size.strip()!r}"
            ) from None
    return _check_sizes(sizes, OTEL_TITAN_MESH)


def resolve_mesh(
    mesh: object, rank: int, world_size: int | None, environ: Mapping[str, str] | None = None
) -> MeshPlace | None:
    """This rank's coordinates and the mesh's sizes, from the option, else ``OTEL_TITAN_MESH``; None
    when neither declares one.

    Raises `ValueError` when the mesh cannot hold this rank (its sizes
    multiply to less than the rank, or not to a known world size), naming the
    sizes: a wrong mesh would make the analysis compare the wrong ranks.

    Example:
        >>> resolve_mesh({"pp": 2, "dp": 2, "tp": 2}, rank=5, world_size=8)
        ({'pp': 1, 'dp': 0, 'tp': 1}, {'pp': 2, 'dp': 2, 'tp': 2})
        >>> resolve_mesh(None, rank=3, world_size=4, environ={"OTEL_TITAN_MESH": "pp=2,dp=2"})
        ({'pp': 1, 'dp': 1}, {'pp': 2, 'dp': 2})
        >>> resolve_mesh(None, rank=0, world_size=1, environ={}) is None
        True
    """
    env = os.environ if environ is None else environ
    if mesh is not None and _is_device_mesh(mesh):
        return _from_device_mesh(mesh)
    if mesh is not None:
        sizes = _check_sizes(dict(mesh), "option mesh")  # type: ignore[call-overload]  # a mapping of dimension sizes, checked by _check_sizes
        where = "option mesh"
    else:
        raw = env.get(OTEL_TITAN_MESH, "").strip()
        if not raw:
            return None
        sizes, where = _from_env(raw), OTEL_TITAN_MESH
    total = 1
    for size in sizes.values():
        total *= size
    if world_size is not None and total != world_size:
        raise ValueError(f"{where} {sizes} holds {total} ranks, but the world size is {world_size}")
    if rank >= total:
        raise ValueError(f"{where} {sizes} holds {total} ranks: rank {rank} is not in it")
    coords: dict[str, int] = {}
    rest = rank
    for name in reversed(list(sizes)):  # the last dimension varies fastest, as in init_device_mesh
        rest, coords[name] = divmod(rest, sizes[name])
    return {name: coords[name] for name in sizes}, dict(sizes)


def _from_device_mesh(mesh: Any) -> MeshPlace | None:
    """A torch DeviceMesh's names, shape and this rank's coordinate (None when this rank is not in
    it)."""
    names = mesh.mesh_dim_names
    if not names:
        raise ValueError(
            "option mesh: the DeviceMesh has no mesh_dim_names; build it with "
            "init_device_mesh(..., mesh_dim_names=('dp', 'tp', ...)) so its dimensions can be "
            "told apart"
        )
    shape = tuple(int(size) for size in (mesh.shape if hasattr(mesh, "shape") else mesh.mesh.shape))
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    sizes = _check_sizes(dict(zip(names, shape)), "option mesh")
    return {name: int(c) for name, c in zip(names, coordinate)}, sizes


#: The prefix torch's DeviceMesh gives each dimension's process group (``group_desc``);
#: ``mesh_default`` is no dimension.
_MESH_GROUP = "mesh_"


def mesh_from_process_groups(rank: int, world_size: int | None) -> MeshPlace | None:
    """This rank's mesh coordinates from the process groups a torch ``DeviceMesh`` created, None
    when there are none (yet).

    Each group whose ``group_desc`` is ``mesh_<dim>`` is one dimension: its
    size is its member count, this rank's coordinate its rank within it, and
    the dimensions are ordered outermost first (by the stride between
    members, as ``init_device_mesh`` lays them out). Only when torch's
    distributed package is already loaded and initialized (nothing is
    imported here), and only when the sizes multiply to the world size: a
    dimension that spans every rank has no group of its own (torch reuses the
    default one), and coordinates that leave ranks out would compare the
    wrong ranks. Never raises: a torch without these internals finds nothing.

    Example:
        >>> mesh_from_process_groups(0, 4) is None or True  # without an initialized process group: None
        True
    """
    dist = sys.modules.get("torch.distributed")
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    try:
        if dist is None or c10d is None or not dist.is_initialized():
            return None
        groups = c10d._world.pg_group_ranks
        dims: list[tuple[int, str, int, int]] = []  # (stride, name, size, coordinate)
        for group, ranks in list(groups.items()):
            desc = getattr(group, "group_desc", None)
            if (
                not isinstance(desc, str)
                or not desc.startswith(_MESH_GROUP)
                or desc == _MESH_GROUP + "default"
                or rank not in ranks
            ):
                continue
            members = sorted(ranks, key=ranks.__getitem__)
            stride = members[1] - members[0] if len(members) > 1 else 0
            dims.append((stride, desc[len(_MESH_GROUP) :], len(members), int(ranks[rank])))
    except Exception:  # noqa: BLE001 - torch's internals moved: no mesh, never a failed step
        return None
    if not dims:
        return None
    dims.sort(key=lambda dim: -dim[0])
    sizes = {name: size for _, name, size, _ in dims}
    total = 1
    for size in sizes.values():
        total *= size
    if (
        len(sizes) != len(dims)
        or (world_size is not None and total != world_size)
        or any(not _NAME.fullmatch(name) for name in sizes)
    ):
        return None
    return {name: coord for _, name, _, coord in dims}, sizes

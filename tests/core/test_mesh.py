"""A job's declared mesh: each rank's coordinates, laid out as torch lays them out, from the option
or OTEL_TITAN_MESH (issue 18 item 12)."""

from __future__ import annotations

import ast
import glob
import json
import os
import shutil
import sys

import pytest
import torch

from otel_titan import structured_logger as sl
from otel_titan.core.mesh import check_mesh_option, resolve_mesh
from otel_titan.core.options import parse_options
from tests.conftest import REPO
from tests.helpers import processes


@pytest.mark.parametrize(
    "sizes",
    [
        {"pp": 2, "dp": 4},
        {"pp": 2, "dp": 2, "tp": 2},
        {"dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 3},
    ],
)
def test_coordinates_follow_init_device_meshs_layout(sizes):
    # init_device_mesh builds torch.arange(world).view(shape): rank r sits where r is in that
    # tensor.
    world = 1
    for size in sizes.values():
        world *= size
    layout = torch.arange(world).view(*sizes.values())
    for rank in range(world):
        coords, shape = resolve_mesh(sizes, rank, world, environ={})
        assert shape == sizes and list(coords) == list(sizes)
        assert layout[tuple(coords.values())].item() == rank


def test_the_environment_declares_the_mesh_when_the_program_does_not():
    assert resolve_mesh(None, 6, 8, environ={"OTEL_TITAN_MESH": "pp=2, dp=2, tp=2"}) == (
        {"pp": 1, "dp": 1, "tp": 0},
        {"pp": 2, "dp": 2, "tp": 2},
    )
    assert resolve_mesh(None, 1, 2, environ={"OTEL_TITAN_MESH": '{"ep": 2}'}) == (
        {"ep": 1},
        {"ep": 2},
    )
    # the option first
    assert resolve_mesh({"dp": 2}, 1, 2, environ={"OTEL_TITAN_MESH": "pp=2"}) == (
        {"dp": 1},
        {"dp": 2},
    )
    assert resolve_mesh(None, 0, 1, environ={}) is None


@pytest.mark.parametrize(
    ("mesh", "env", "error"),
    [
        (
            {"pp": 2, "dp": 2},
            None,
            r"option mesh \{'pp': 2, 'dp': 2\} holds 4 ranks, but the world size is 8",
        ),
        (None, "pp=2;dp=4", r"OTEL_TITAN_MESH='pp=2;dp=4': the size of 'pp' is not an integer"),
        (None, "pp2", r"expected NAME=SIZE pairs"),
        ({"pp": 0}, None, r"the size of dimension 'pp' must be an int >= 1, got 0"),
        ({"p p": 2}, None, r"dimension name 'p p' must be a short identifier"),
    ],
)
def test_a_mesh_that_cannot_hold_the_ranks_is_a_clear_error(mesh, env, error):
    with pytest.raises(ValueError, match=error):
        resolve_mesh(mesh, 3, 8, environ={} if env is None else {"OTEL_TITAN_MESH": env})


def test_the_option_is_checked_up_front():
    assert (
        parse_options({"mesh": {"pp": 2, "dp": 4}}).mesh == {"pp": 2, "dp": 4}
        and parse_options({"mesh": None}).mesh is None
    )
    with pytest.raises(
        TypeError,
        match=r"option mesh must be a dict of dimension sizes .* or a torch DeviceMesh, got int 8",
    ):
        parse_options({"mesh": 8})
    with pytest.raises(
        ValueError, match=r"option mesh: the size of dimension 'tp' must be an int >= 1, got '2'"
    ):
        check_mesh_option({"tp": "2"})


def test_coordinates_reach_the_opened_record_and_the_resource(tmp_path):
    sl.init_structured_logger(
        "training", tmp_path, rank=5, world_size=8, run_id="mesh", mesh={"pp": 2, "dp": 2, "tp": 2}
    )
    try:
        identity = sl.get_run_identity()
        assert identity.mesh == {"pp": 1, "dp": 0, "tp": 1} and identity.mesh_shape == {
            "pp": 2,
            "dp": 2,
            "tp": 2,
        }
        sl.log_trace_instant("x")
    finally:
        sl.shutdown_structured_logger()
    (path,) = glob.glob(str(tmp_path / "structured_logs" / "*.jsonl"))
    opened = json.loads(open(path).readline())
    assert (
        opened["log_type_name"] == "structured_logger_opened"
        and opened["mesh"] == {"pp": 1, "dp": 0, "tp": 1}
        and opened["mesh_shape"] == {"pp": 2, "dp": 2, "tp": 2}
    )
    from otel_titan.core.identity import build_resource

    attributes = build_resource(identity).attributes
    assert (
        attributes["titan.mesh.pp"],
        attributes["titan.mesh.dp"],
        attributes["titan.mesh.tp"],
        attributes["titan.mesh_shape.pp"],
    ) == (1, 0, 1, 2)


_WITH_A_DEVICE_MESH = """
import sys, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from otel_titan import structured_logger as sl
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
sl.init_structured_logger("training", sys.argv[1], mesh=mesh)
sl.set_step(1)
with sl.log_trace_span("fwd"):
    pass
sl.shutdown_structured_logger()
open(f"{sys.argv[2]}/{dist.get_rank()}", "w").write(repr(tuple(mesh.get_coordinate())))  # a file: torchrun's shared stdout once lost a line
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_real_device_mesh_is_read_on_every_rank(tmp_path):
    script = tmp_path / "mesh_job.py"
    script.write_text(_WITH_A_DEVICE_MESH)
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    (tmp_path / "torch_says").mkdir()
    result = processes.run(
        [
            launcher,
            "--nproc_per_node=4",
            str(script),
            str(tmp_path / "out"),
            str(tmp_path / "torch_says"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    torch_says = {
        int(path.name): ast.literal_eval(path.read_text())
        for path in (tmp_path / "torch_says").iterdir()
    }
    assert sorted(torch_says) == [0, 1, 2, 3]
    for path in glob.glob(str(tmp_path / "out" / "structured_logs" / "*.jsonl")):
        opened = json.loads(open(path).readline())
        assert (opened["mesh"]["pp"], opened["mesh"]["dp"]) == torch_says[
            opened["rank"]
        ] and opened["mesh_shape"] == {"pp": 2, "dp": 2}


def test_a_mesh_that_does_not_match_the_world_stops_init_before_anything_starts(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("OTEL_TITAN_MESH", "pp=2,dp=2")
    with pytest.raises(
        ValueError,
        match=r"OTEL_TITAN_MESH \{'pp': 2, 'dp': 2\} holds 4 ranks, but the world size is 8",
    ):
        sl.init_structured_logger("training", tmp_path, rank=1, world_size=8, run_id="bad-mesh")
    assert not sl.is_initialized() and sl.get_run_identity() is None
    assert list((tmp_path / "structured_logs").iterdir()) == []  # no file: nothing was created


_WITH_A_MESH_NOT_PASSED_IN = """
import sys, time, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from otel_titan import structured_logger as sl
dist.init_process_group("gloo")
sl.init_structured_logger("training", sys.argv[1])  # no mesh: the program never hands its DeviceMesh to the logger
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
stage = mesh.get_coordinate()[0]
dp = mesh.get_group("dp")
for step in range(1, 13):
    sl.set_step(step)
    with sl.log_trace_span("fwd"):
        time.sleep(0.03 if stage == 1 else 0.01)  # the last stage's forward is longer, by design
    with sl.log_trace_span("all_reduce"):
        dist.all_reduce(torch.ones(4), group=dp)
    dist.barrier()
sl.shutdown_structured_logger()
open(f"{sys.argv[2]}/{dist.get_rank()}", "w").write(repr(tuple(mesh.get_coordinate())))  # a file: torchrun's shared stdout once lost a line
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_device_mesh_the_program_does_not_pass_in_is_found_from_its_process_groups(tmp_path):
    # Issue 26 item 12: torch keeps no registry of meshes, but each dimension's group has group_desc
    # "mesh_<dim>". On main, no mesh was recorded, every rank was a peer of every other, and the
    # last stage (3× the forward) was named.
    from otel_titan.analysis import summarize_run

    script = tmp_path / "mesh_job.py"
    script.write_text(_WITH_A_MESH_NOT_PASSED_IN)
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    (tmp_path / "torch_says").mkdir()
    result = processes.run(
        [
            launcher,
            "--nproc_per_node=4",
            str(script),
            str(tmp_path / "out"),
            str(tmp_path / "torch_says"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    torch_says = {
        int(path.name): ast.literal_eval(path.read_text())
        for path in (tmp_path / "torch_says").iterdir()
    }
    assert sorted(torch_says) == [0, 1, 2, 3]
    for path in glob.glob(str(tmp_path / "out" / "structured_logs" / "*.jsonl")):
        records = [json.loads(line) for line in open(path)]
        (found,) = [r for r in records if r["log_type_name"] == "mesh_found"]
        assert (found["mesh"]["pp"], found["mesh"]["dp"]) == torch_says[
            records[0]["rank"]
        ] and found["mesh_shape"] == {"pp": 2, "dp": 2}
    summary = summarize_run(tmp_path / "out", log_skipped=False)
    (group,) = summary.stragglers
    assert sorted(sorted(g["ranks"]) for g in group.peer_groups) == [[0, 1], [2, 3]] and {
        tuple(g["group"].items()) for g in group.peer_groups
    } == {(("pp", 0),), (("pp", 1),)}
    # the last stage is no straggler for being a stage
    assert not [f for f in summary.straggler_findings() if f.verdict == "straggler"]

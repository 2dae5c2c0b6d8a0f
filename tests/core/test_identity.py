"""Identity from arguments, the launcher's environment and torch.distributed; the Resource."""

from __future__ import annotations

import pytest

from otel_titan.core.identity import build_resource, discover_identity
from tests.conftest import jsonl_files, read_records, run_python


def test_torchrun_environment():
    env = {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "TORCHELASTIC_RUN_ID": "abc",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }
    ident = discover_identity("training", environ=env)
    assert (
        ident.rank,
        ident.local_rank,
        ident.world_size,
        ident.run_id,
        ident.attempt,
        ident.job_id,
    ) == (3, 1, 8, "abc", 2, None)
    assert ident.origins == {
        "rank": "RANK",
        "world_size": "WORLD_SIZE",
        "local_rank": "LOCAL_RANK",
        "attempt": "TORCHELASTIC_RESTART_COUNT",
        "run_id": "TORCHELASTIC_RUN_ID",
        "process_run_id": "run_id",
    }
    assert ident.process_run_id == "abc"


def test_slurm_environment():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_ID": "777",
        "SLURM_STEP_ID": "0",
        "SLURM_RESTART_COUNT": "1",
    }
    ident = discover_identity("training", environ=env)
    assert (
        ident.rank,
        ident.local_rank,
        ident.world_size,
        ident.run_id,
        ident.attempt,
        ident.job_id,
    ) == (5, 1, 16, "slurm-777.0", 1, "777")


def test_arguments_win_over_the_environment():
    env = {"RANK": "3", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "abc"}
    ident = discover_identity(
        "training",
        rank=1,
        world_size=2,
        local_rank=0,
        run_id="mine",
        attempt=4,
        job_id="j",
        environ=env,
    )
    assert (
        ident.rank,
        ident.world_size,
        ident.local_rank,
        ident.run_id,
        ident.attempt,
        ident.job_id,
    ) == (1, 2, 0, "mine", 4, "j")
    assert ident.origins["rank"] == "argument"


def test_torchrun_without_rdzv_id_falls_back_to_slurm_then_ray_then_no_run_id(caplog):
    assert (
        discover_identity("t", environ={"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "9"}).run_id
        == "slurm-9"
    )
    assert (
        discover_identity(
            "t", environ={"TORCHELASTIC_RUN_ID": "none", "RAY_JOB_ID": "02000000"}
        ).run_id
        == "ray-02000000"
    )
    ident = discover_identity(
        "t", environ={"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2"}
    )
    # No random id passed off as the run's: null, and an id of the process's own for its trace ids.
    assert ident.run_id is None and ident.origins["run_id"] == "none"
    assert len(ident.process_run_id) == 32 and ident.origins["process_run_id"] == "random"
    assert "will not share per-step trace ids" in caplog.text


@pytest.mark.parametrize(
    "env, run_id, origin",
    [
        (
            {
                "OTEL_TITAN_RUN_ID": "shared",
                "TORCHELASTIC_RUN_ID": "abc",
                "SLURM_JOB_ID": "9",
                "RAY_JOB_ID": "r",
            },
            "shared",
            "OTEL_TITAN_RUN_ID",
        ),
        (
            {"TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "9", "RAY_JOB_ID": "r"},
            "abc",
            "TORCHELASTIC_RUN_ID",
        ),
        ({"SLURM_JOB_ID": "9", "RAY_JOB_ID": "r"}, "slurm-9", "SLURM_JOB_ID"),
        ({"RAY_JOB_ID": "r"}, "ray-r", "RAY_JOB_ID"),
        ({"OTEL_TITAN_RUN_ID": " ", "OTEL_TITAN_PROCESS_RUN_ID": "parent"}, None, "none"),
    ],
)
def test_the_run_id_is_what_a_parent_or_the_launcher_shares_first(env, run_id, origin):
    ident = discover_identity("t", environ=env)
    assert (ident.run_id, ident.origins["run_id"]) == (run_id, origin)
    assert ident.process_run_id == (run_id or "parent")


def test_a_parent_shares_its_run_with_the_processes_it_starts_and_takes_it_back(tmp_path):
    from otel_titan.core.identity import export_run_id

    env = {"OTEL_TITAN_RUN_ID": "user"}
    undo = export_run_id(discover_identity("t", run_id="mine", environ={}), env)
    assert env == {"OTEL_TITAN_RUN_ID": "mine"}
    undo()
    assert env == {"OTEL_TITAN_RUN_ID": "user"}  # put back as it was
    parent = discover_identity("t", environ={})
    undo = export_run_id(parent, env := {})
    child = discover_identity("t", environ=env)
    assert (
        child.run_id is None
        and child.process_run_id == parent.process_run_id
        and child.origins["process_run_id"] == "OTEL_TITAN_PROCESS_RUN_ID"
    )
    env["OTEL_TITAN_PROCESS_RUN_ID"] = "changed since"
    undo()
    assert env == {"OTEL_TITAN_PROCESS_RUN_ID": "changed since"}  # not ours any more: left alone


def test_defaults_for_a_plain_python_process():
    ident = discover_identity("training", environ={})
    assert (ident.rank, ident.world_size, ident.local_rank, ident.attempt) == (0, 1, 0, 0)


@pytest.mark.parametrize(
    "kwargs, env, expected",
    [
        ({"rank": 3}, {}, (3, None, None)),  # was world_size=4, local_rank=3: invented
        ({}, {"RANK": "3"}, (3, None, None)),
        ({}, {"RANK": "0"}, (0, None, None)),
        ({"rank": 3}, {"LOCAL_RANK": "1"}, (3, None, 1)),
        ({"rank": 3}, {"WORLD_SIZE": "8"}, (3, 8, None)),
        ({}, {"SLURM_PROCID": "5", "SLURM_NTASKS": "16"}, (5, 16, None)),
        ({"world_size": 1}, {}, (0, 1, 0)),  # a world of one: local rank 0 is a fact
    ],
)
def test_unknown_world_size_and_local_rank_are_none_never_guessed(kwargs, env, expected):
    ident = discover_identity("training", environ=env, **kwargs)
    assert (ident.rank, ident.world_size, ident.local_rank) == expected
    for name, value in (("world_size", ident.world_size), ("local_rank", ident.local_rank)):
        assert (ident.origins[name] == "unknown") == (value is None)
    attributes = build_resource(ident).attributes
    assert attributes["titan.rank"] == expected[0]
    assert (
        attributes.get("titan.world_size") == expected[1]
        and attributes.get("titan.local_rank") == expected[2]
    )


def test_unknown_identity_is_written_as_null_and_read_back(tmp_path):
    # A real process with rank=3 and no launcher variables at all.
    env = {
        name: ""
        for name in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "SLURM_LOCALID",
            "SLURM_JOB_ID",
        )
    }
    code = """
import sys
from otel_titan import structured_logger as sl
from tests.helpers import factories
sl.init_structured_logger("training", sys.argv[1], rank=3, run_id="r", handlers=["otel_titan.exporters.jsonl.register_jsonl_handler", "tests.helpers.factories.register_memory"])
assert (factories.LAST["rank"], factories.LAST["world_size"], factories.LAST["local_rank"]) == (3, None, None)
with sl.log_trace_span("phase"):
    pass
sl.shutdown_structured_logger()
(span,) = factories.LAST["exporter"].get_finished_spans()
attributes = span.resource.attributes
assert attributes["titan.rank"] == 3 and "titan.world_size" not in attributes and "titan.local_rank" not in attributes, dict(attributes)
print("ok")
"""
    result = run_python(code, str(tmp_path / "run"), env=env)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    (path,) = jsonl_files(tmp_path / "run")
    records = read_records(path)
    assert "global_rank_3." in path and len(records) == 4  # opened, start, end, closed
    assert all(
        r["rank"] == 3 and r["world_size"] is None and r["local_rank"] is None for r in records
    )
    # no attribute dropped by the OpenTelemetry SDK for being null
    assert "Invalid type" not in result.stderr
    from otel_titan.analysis.model.collect import summarize_run

    (process,) = summarize_run(tmp_path / "run").processes
    assert process.rank == 3


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "x"}, "RANK='x'"),
        ({"RANK": "4", "WORLD_SIZE": "2"}, "outside"),
        ({"WORLD_SIZE": "0"}, "world_size"),
    ],
)
def test_bad_environment_is_reported_by_name(env, message):
    with pytest.raises(ValueError, match=message):
        discover_identity("training", environ=env)


def test_torch_distributed_is_consulted_when_initialised(tmp_path, monkeypatch):
    dist = pytest.importorskip("torch.distributed")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        ident = discover_identity("training")
        assert (
            ident.origins["rank"] == "torch.distributed"
            and ident.origins["world_size"] == "torch.distributed"
        )
    finally:
        dist.destroy_process_group()


def test_resource_carries_identity_and_respects_otel_service_name(monkeypatch):
    env = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "r", "SLURM_JOB_ID": "5"}
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,titan.rank=99")
    resource = build_resource(discover_identity("rollouter", environ=env))
    attrs = resource.attributes
    assert attrs["service.name"] == "rollouter"
    assert attrs["titan.rank"] == 1  # the process's facts win over the environment
    assert attrs["deployment.environment"] == "prod"
    assert (
        attrs["titan.world_size"],
        attrs["titan.source"],
        attrs["titan.run_id"],
        attrs["titan.job_id"],
        attrs["titan.attempt"],
    ) == (2, "rollouter", "r", "5", 0)
    assert attrs["service.instance.id"] and attrs["host.name"] and attrs["process.pid"]
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-trainer")
    assert (
        build_resource(discover_identity("rollouter", environ=env)).attributes["service.name"]
        == "my-trainer"
    )
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs")
    assert (
        build_resource(discover_identity("rollouter", environ=env)).attributes["service.name"]
        == "from-attrs"
    )


def test_host_name_can_be_left_out_everywhere(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "host.name=leaky")
    ident = discover_identity("training", environ={}, include_hostname=False)
    assert ident.host_name is None
    assert "host.name" not in build_resource(ident).attributes


def test_each_process_gets_its_own_service_instance_id():
    a = discover_identity("training", environ={})
    b = discover_identity("training", environ={})
    assert a.service_instance_id != b.service_instance_id


def test_with_no_run_id_the_resource_names_the_process_tree_and_no_run():
    ident = discover_identity(
        "reward", environ={"OTEL_TITAN_PROCESS_RUN_ID": "tree-1"}, include_hostname=False
    )
    attributes = build_resource(ident).attributes
    assert "titan.run_id" not in attributes and attributes["titan.process_run_id"] == "tree-1"
    named = build_resource(
        discover_identity("reward", environ={"OTEL_TITAN_RUN_ID": "r"}, include_hostname=False)
    ).attributes
    assert named["titan.run_id"] == "r" and "titan.process_run_id" not in named

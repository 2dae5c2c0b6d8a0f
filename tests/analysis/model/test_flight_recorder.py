"""torch's flight recorder as the Hang section reads it: both formats, group identity, the plain
unpickler."""

from __future__ import annotations

import os
import pickle

from otel_titan.analysis.model.flight_recorder import (
    digest_recorder,
    find_torch_dumps,
    read_torch_dump,
)


def _box_entry(
    pg_id: int,
    name: str | None,
    seq: int,
    state: str = "completed",
    desc: str = "undefined",
    **extra: object,
) -> dict[str, object]:
    entry = {
        "pg_id": pg_id,
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "is_p2p": False,
        "op": "gloo:all_reduce",
        "input_sizes": [[4]],
        "state": "scheduled",
        "retired": state == "completed",
        **extra,
    }
    if name is None:
        entry["pg_name"] = desc  # an older black box: the description only
    else:
        entry["pg_name"], entry["pg_desc"] = name, desc
    return entry


def test_groups_are_keyed_by_torch_s_name_not_by_the_rank_s_own_pg_id():
    # On torch 2.13 gloo, group [1, 2] is pg 2 on rank 1 and pg 1 on rank 2; its name is "2" on
    # both.
    on_rank_1 = digest_recorder(
        {"entries": [_box_entry(2, "2", 1)], "pg_config": {"2": {"ranks": [1, 2]}}}
    )
    on_rank_2 = digest_recorder(
        {"entries": [_box_entry(1, "2", 1)], "pg_config": {"2": {"ranks": "[1, 2]"}}}
    )
    assert set(on_rank_1["groups"]) == set(on_rank_2["groups"]) == {"2"}
    assert on_rank_1["groups"]["2"]["ranks"] == on_rank_2["groups"]["2"]["ranks"] == (1, 2)
    assert on_rank_1["groups"]["2"]["last"]["state"] == "completed"  # gloo: scheduled + retired


def test_an_older_black_box_leaves_sub_groups_unidentified_and_the_default_group_known():
    digest = digest_recorder(
        {"entries": [_box_entry(0, None, 3, desc="default_pg"), _box_entry(1, None, 2)]},
        world=(0, 1, 2),
    )
    assert digest["groups"]["0"]["ranks"] == (0, 1, 2)
    assert digest["groups"][("pg_id", 1)]["name"] is None


def test_point_to_point_ops_keep_their_group_local_peer():
    entries = [
        {
            "pg_id": 1,
            "process_group": ["5", "pp"],
            "p2p_seq_id": 7,
            "collective_seq_id": 0,
            "is_p2p": True,
            "profiling_name": "nccl:recv 1<-0",
            "state": "started",
            "retired": False,
        },
        {
            "pg_id": 1,
            "process_group": ["5", "pp"],
            "p2p_seq_id": 8,
            "collective_seq_id": 0,
            "is_p2p": True,
            "profiling_name": "nccl:send 1->0",
            "state": "scheduled",
            "retired": True,
        },
    ]
    (group,) = digest_recorder({"entries": entries})["groups"].values()
    assert group["p2p"] == [
        {"op": "recv", "peer": 0, "seq": 7, "state": "started"},
        {"op": "send", "peer": 0, "seq": 8, "state": "completed"},
    ]
    assert group["last"] is None


class _Hostile:
    def __reduce__(self):
        return (os.system, ("touch /tmp/otel-titan-should-not-exist",))


def test_torch_dumps_are_found_by_rank_and_a_hostile_pickle_is_never_run(tmp_path):
    dump = {
        "version": "2.10",
        "entries": [
            {
                "record_id": 0,
                "pg_id": 0,
                "process_group": ["0", "default_pg"],
                "collective_seq_id": 1,
                "profiling_name": "nccl:all_reduce",
                "state": "completed",
            }
        ],
        "pg_config": {},
    }
    (tmp_path / "fr_trace_rank_3").write_bytes(pickle.dumps(dump))
    (tmp_path / "nccl_trace_rank_4").write_bytes(pickle.dumps(_Hostile()))
    # a rotated segment is never opened as one
    (tmp_path / "training.global_rank_0.x.jsonl.1").write_bytes(b"\x80 not a dump")
    found = find_torch_dumps([str(tmp_path)])
    assert list(found) == [3] and found[3][1]["entries"][0]["collective_seq_id"] == 1
    assert read_torch_dump(str(tmp_path / "nccl_trace_rank_4")) is None
    assert not os.path.exists("/tmp/otel-titan-should-not-exist")
    # record_id 0 is still there: nothing was overwritten
    assert digest_recorder(found[3][1])["complete"] is True

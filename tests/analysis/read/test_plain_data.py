"""The analysis cache's format (`read.plain_data`): an exact round trip of the model's objects, and
bytes that can only ever be data."""

from __future__ import annotations

import array
import collections
import os
import pickle

import pytest

msgspec = pytest.importorskip("msgspec")  # the analysis extra: without it nothing is cached

from otel_titan.analysis.read.plain_data import _NATIVE, PlainCodec, PlainDataError  # noqa: E402 - after importorskip: without msgspec the module is skipped, not failed


class Span:
    __slots__ = ("name", "parent", "seen")

    def __init__(self, name: str, parent: Span | None = None) -> None:
        self.name, self.parent, self.seen = name, parent, 0


class Tracker:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.hook = self.progress

    def progress(self) -> None:
        self.spans.append(Span("progress"))

    @property
    def count(self) -> int:
        return len(self.spans)


class Loud:
    """A class whose construction has an effect: the codec never constructs, it only sets
    attributes."""

    made = 0

    def __init__(self) -> None:
        Loud.made += 1
        self.x = 1

    def __setstate__(self, state: object) -> None:
        Loud.made += 100


def test_what_is_shared_stays_shared_and_every_type_comes_back() -> None:
    codec = PlainCodec([Span, Tracker, Loud])
    outer = Span("step")
    inner = Span("fwd", outer)
    tracker = Tracker()
    tracker.spans += [outer, inner]
    record = {"step": 3, "name": "fwd_start", "bytes": b"\x00\xff"}
    value = {
        "tracker": tracker,
        "records": [record, record],
        ("training", None): {0: {1: 2.5, 2: float("inf")}},
        "durations": array.array("d", [1.0, 2.0]),
        "counts": collections.Counter({"a.jsonl": 3}),
        "by_step": collections.defaultdict(list, {1: [2]}),
        "ids": {1, 2},
        "frozen": frozenset({"x"}),
        "big": [10**30, -(10**25)],
        "surrogate": {"name": "rank\udcff.jsonl"},
        "empty": ((), [], {}),
        "loud": Loud(),
    }
    made = Loud.made
    back = codec.decode(codec.encode(value))
    assert Loud.made == made and back["loud"].x == 1  # no __init__, no __setstate__
    assert back["tracker"].spans[1].parent is back["tracker"].spans[0]
    assert back["records"][0] is back["records"][1] and back["records"][0] == record
    assert back[("training", None)] == {0: {1: 2.5, 2: float("inf")}}
    assert back["durations"].typecode == "d" and back["durations"] == value["durations"]
    assert type(back["counts"]) is collections.Counter and back["counts"]["missing"] == 0
    assert back["by_step"][9] == [] and back["by_step"][1] == [2]
    assert (
        back["ids"] == {1, 2} and back["frozen"] == frozenset({"x"}) and back["big"] == value["big"]
    )
    assert (
        back["surrogate"] == value["surrogate"]
        and back["empty"] == ((), [], {})
        and type(back["empty"]) is tuple
    )
    back["tracker"].hook()  # the bound method is bound to the tracker that came back
    assert back["tracker"].count == 3


def test_a_pickle_or_anything_else_is_not_data_and_runs_nothing(tmp_path) -> None:
    codec = PlainCodec([Span])
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple:
            return os.system, (f"touch {marker}",)

    for data in (
        pickle.dumps(Evil()),
        b"",
        b"\xc1",
        msgspec.msgpack.encode([1, ["other:Class"], None]),
    ):
        with pytest.raises(PlainDataError):
            codec.decode(data)
    assert not marker.exists()


def test_only_the_codecs_classes_and_plain_attributes_are_ever_made() -> None:
    codec = PlainCodec([Span, Tracker])
    names = [f"{cls.__module__}:{cls.__qualname__}" for cls in (Span, Tracker)]
    forged = [
        [5, 7, []],  # a class index the codec was not given
        [5, 0, ["__class__", 1]],  # an attribute Span has no slot for
        [5, 1, ["count", 3]],  # a property: setting it would run the class's code
        [12, [5, 1, []], "__init__"],  # a "method" that is no plain function of the class
        [12, [5, 1, []], "count"],
        [0, 9],  # a reference to nothing
    ]
    for tree in forged:
        with pytest.raises(PlainDataError):
            codec.decode(msgspec.msgpack.encode([1, names, tree]))
    with pytest.raises(TypeError):
        codec.encode({"x": object()})  # not one of its classes: refused on writing, never pickled
    with pytest.raises(TypeError):
        PlainCodec([collections.OrderedDict])  # rebuilt only by running its own code


def test_decoding_gives_the_cyclic_collector_back_as_it_found_it() -> None:
    """The collector is paused while a graph is built (nothing in it is garbage): on again after,
    after a miss too; left off if it was off."""
    import gc

    codec = PlainCodec([Span])
    data = codec.encode({"span": Span("fwd", Span("step"))})
    original = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            for payload in (
                data,
                b"\xc1",
                msgspec.msgpack.encode([1, ["other:Class"], None]),
                msgspec.msgpack.encode([1, [f"{Span.__module__}:{Span.__qualname__}"], [0, 9]]),
            ):
                try:
                    assert codec.decode(payload)["span"].parent.name == "step"
                except PlainDataError:
                    assert payload != data
                assert gc.isenabled() is enabled
    finally:
        (gc.enable if original else gc.disable)()


def _tags(tree: object) -> set[int]:
    """The tags of every node of a raw decoded entry (MessagePack maps and scalars have none)."""
    found: set[int] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list) and node and type(node[0]) is int:
            found.add(node[0])
            stack += [item for item in node[1:] if isinstance(item, list)]
            stack += [
                item
                for part in node[1:]
                if isinstance(part, list)
                for item in part
                if isinstance(item, list)
            ]
    return found


def test_native_trees_read_back_as_the_node_by_node_path_does_sharing_included() -> None:
    """The fast path (plain dict and list trees written as MessagePack itself) against the reference
    path: equal, and what was shared still is."""
    codec = PlainCodec([Span])
    span = Span("fwd")
    # inside a tree first, then met on its own: the tree is written node by node
    shared = [
        "later",
        "again",
    ]
    twice = [1.5]  # twice in one tree: not a tree
    earlier = {"a": [1, 2]}
    facts = {
        f"rank {rank}": {
            "step": rank,
            "entered": ["fwd", "bwd"],
            "history": [{"at": rank, "open": ["fwd"]}],
            "box": None,
        }
        for rank in range(50)
    }
    value = {
        "facts": facts,
        "holder": {"list": shared, "n": 1, "nested": [[1], [2, [3]]]},
        "shared": shared,
        "dup": {"x": twice, "y": twice},
        "earlier": earlier,
        "later": {"has": earlier, "k": [0]},
        "records": [{"name": "fwd_start", "step": 1}, {"name": "fwd_end", "step": 1, "span": span}],
        "big": {"n": [10**30]},
        "surrogate": {"files": ["rank\udcff.jsonl"]},
    }
    fast, reference = codec.encode(value), codec.encode(value, native=False)
    assert _NATIVE in _tags(msgspec.msgpack.decode(fast)[2]) and _NATIVE not in _tags(
        msgspec.msgpack.decode(reference)[2]
    )
    for back in (codec.decode(fast), codec.decode(reference)):
        assert back["facts"] == facts and back["holder"]["nested"] == [[1], [2, [3]]]
        assert back["holder"]["list"] is back["shared"] and back["shared"] == shared
        assert back["dup"]["x"] is back["dup"]["y"] and back["later"]["has"] is back["earlier"]
        assert back["records"][1]["span"].name == "fwd" and back["records"][0] == {
            "name": "fwd_start",
            "step": 1,
        }
        assert back["big"] == {"n": [10**30]} and back["surrogate"] == value["surrogate"]
    # the same graph: values, types and sharing
    assert _shape(codec.decode(fast)) == _shape(codec.decode(reference)) == _shape(value)


def _shape(value: object, seen: dict[int, int] | None = None) -> object:
    """`value` as nested tuples that say each container's type, contents and which ones are the same
    object (scalars by value)."""
    seen = {} if seen is None else seen
    if type(value) in (type(None), bool, int, float, str, bytes):
        return value
    if id(value) in seen:
        return ("same as", seen[id(value)])
    seen[id(value)] = len(seen)
    if isinstance(value, dict):
        return (
            type(value).__name__,
            tuple((_shape(k, seen), _shape(v, seen)) for k, v in value.items()),
        )
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_shape(item, seen) for item in value))
    return (
        type(value).__name__,
        tuple(
            (name, _shape(getattr(value, name), seen)) for name in getattr(value, "__slots__", ())
        ),
    )

"""Plain data for the analysis cache: a graph of the model's own objects written as MessagePack,
read back without running code.

Why not pickle: unpickling calls whatever callables the bytes name, so a
planted or edited cache entry would run code as whoever reads it. Here the
bytes are data only. Reading them builds containers (lists, tuples, dicts,
sets, `collections.Counter`, `array.array`) and instances of the classes a
`PlainCodec` was given, by name from that list alone (never an import),
each made with ``object.__new__`` and its attributes set one by one: no
``__init__``, no ``__setstate__``, no ``__reduce__``, nothing the bytes
name is ever called. A bound method is rebuilt only when it names a plain
function of its instance's own class. An entry that is not such data is a
`PlainDataError`: the caller treats it as a miss.

Exact round trip: what is shared stays shared (every container and object
is written once, its other uses are references, so a span's ``parent`` is
the same object as the open span it names), tuples stay tuples, ints of
any size stay ints, an array keeps its type code. Dicts of plain keys and
values (``rank → step → ms``, the records), the bulk of an entry, are
MessagePack maps that msgspec reads in C, and so is any tree of plain dicts
and lists that nothing else refers to (a hang fact, a list of records:
`_NATIVE`; ``encode(..., native=False)`` is the node-by-node reference path,
read back equal): loading costs Python work only per container of objects,
one call per object for its attributes (their names checked once per shape).

msgspec is part of the ``analysis`` extra: without it there is no codec
(`available` is False) and the commands run uncached.

Example:
    >>> codec = PlainCodec([])
    >>> shared = [1, 2]
    >>> back = codec.decode(codec.encode({"a": shared, "b": shared, "t": (1, "x"), "big": 10**30}))
    >>> back["a"] is back["b"], back["t"], back["big"]
    (True, (1, 'x'), 1000000000000000000000000000000)
"""

from __future__ import annotations

import array
import collections
import enum
import gc
import inspect
import types
from collections.abc import Iterable
from typing import Any

try:
    import msgspec
except ImportError:  # pragma: no cover - the analysis extra is not installed
    msgspec = None  # type: ignore[assignment]  # the analysis extra is optional: None marks it absent

__all__ = ["FORMAT", "PlainCodec", "PlainDataError", "available"]

#: Whether this interpreter can write and read the format (msgspec installed).
available = msgspec is not None

#: The layout's version (part of the analysis cache's version: `model.cache.cache_version`).
FORMAT = 2
# A node is a scalar, a MessagePack map (a dict of plain keys and values: `_LEAF_KEYS` →
# `_LEAF_VALUES`), or a list whose first item is one of these tags:
(
    _REF,
    _LIST,
    _LEAF_LIST,
    _TUPLE,
    _DICT,
    _OBJECT,
    _ARRAY,
    _INT,
    _SET,
    _FROZENSET,
    _COUNTER,
    _DEFAULTDICT,
    _METHOD,
    _ENUM,
    _LEAF_REF,
    _STR,
    _NATIVE,
) = range(17)
# `_NATIVE`: a tree of dicts (int or str keys), lists and scalars that nothing else refers to,
# written as MessagePack itself (msgspec builds it in C; its containers are not numbered): a hang
# fact, a span's record, a list of dicts.
_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_LEAF_KEYS = frozenset({int, str})
#: What a `collections.defaultdict` may make its missing values with (by name: nothing else is ever
#: called).
_FACTORIES: dict[str, Any] = {"int": int, "float": float, "list": list, "dict": dict, "set": set}


class PlainDataError(ValueError):
    """Bytes that are not an entry of this format (torn, of another version or codec, or made by
    someone else): a miss."""


def _slots(cls: type) -> list[str]:
    """Every ``__slots__`` name of `cls` and its bases (``__dict__`` and ``__weakref__`` aside)."""
    names: list[str] = []
    for base in cls.__mro__:
        slots = base.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return names


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _plain(item: Any) -> bool:
    """Whether MessagePack holds the scalar `item` as it is (an int within 64 bits, a str without
    lone surrogates)."""
    kind = type(item)
    if kind is int:
        return -(2**63) <= item < 2**64
    return kind is not str or _utf8(item)


class PlainCodec:
    """Writes and reads graphs of plain data and of instances of `classes` (exactly these types;
    their state is their attributes).

    A class with a custom ``__new__``, a tuple or dict subclass, or a
    ``__setattr__`` of its own is refused when the codec is made: it could
    not be rebuilt without running its code.
    """

    def __init__(self, classes: Iterable[type]) -> None:
        if msgspec is None:
            raise PlainDataError(
                "the analysis cache needs msgspec (pip install 'otel-titan[analysis]')"
            )
        self._classes = list(classes)
        self._names = [f"{cls.__module__}:{cls.__qualname__}" for cls in self._classes]
        self._index = {cls: index for index, cls in enumerate(self._classes)}
        self._slots = [_slots(cls) for cls in self._classes]
        for cls in self._classes:
            if issubclass(cls, enum.Enum):
                continue
            if (
                cls.__new__ is not object.__new__
                or issubclass(cls, (tuple, dict, list, set))
                or cls.__setattr__ is not object.__setattr__
            ):
                if (
                    not getattr(cls, "__dataclass_params__", None)
                    or not cls.__dataclass_params__.frozen  # type: ignore[attr-defined]  # a dataclass: getattr checked it has the parameters
                ):
                    raise TypeError(f"{cls.__qualname__} cannot be rebuilt as plain data")
        # (class, attributes) → all plain? (asked once per codec)
        self._settable: dict[tuple[type, tuple[str, ...]], bool] = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder()

    # -- writing -----------------------------------------------------------------------------------
    def encode(self, value: Any, native: bool = True) -> bytes:
        """`value` as bytes; TypeError when it holds something that is neither plain data nor an
        instance of the codec's classes.

        `native`: trees of plain dicts and lists that nothing else shares are
        written as MessagePack itself (`_NATIVE`, read in C); False: every
        container node by node (the reference path: both read back equal).
        """
        # containers a native tree held that were met again: written node by node
        shared: set[int] = set()
        checked = False
        for _ in range(4):
            writer = _Writer(
                self._index, self._slots, checked=checked, native=native, shared=shared
            )
            tree = writer.node(value)
            if writer.conflicts:
                shared |= writer.conflicts
                continue
            try:
                return self._encoder.encode([FORMAT, self._names, tree])
            # an int beyond 64 bits, or a str with lone surrogates (a file name's
            except (
                OverflowError,
                UnicodeEncodeError,
            ):
                # undecodable bytes), inside a dict or list of plain values: those are written node
                # by node
                if checked:
                    raise
                checked = True
        writer = _Writer(self._index, self._slots, checked=True, native=False)
        return self._encoder.encode([FORMAT, self._names, writer.node(value)])

    # -- reading -----------------------------------------------------------------------------------
    def decode(self, data: bytes) -> Any:
        """What `encode` wrote; `PlainDataError` for anything else (nothing in `data` is ever
        run)."""
        # Decoding only makes containers that stay alive (no garbage to find): the cyclic collector
        # is paused meanwhile, or it would scan the graph being built every 700 allocations (~10 %
        # of a 1,024-rank entry's load).
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._decode(data)
        finally:
            if collecting:
                gc.enable()

    def _decode(self, data: bytes) -> Any:
        try:
            top = self._decoder.decode(data)
        except (msgspec.DecodeError, ValueError, TypeError) as error:
            raise PlainDataError(f"not plain data: {error}") from None
        if not (
            isinstance(top, list) and len(top) == 3 and top[0] == FORMAT and top[1] == self._names
        ):
            raise PlainDataError("written by another version of the codec, or for other classes")
        try:
            return _Reader(self._classes, self._slots, self._settable).node(top[2])
        except PlainDataError:
            raise
        except (
            IndexError,
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            RecursionError,
        ) as error:
            raise PlainDataError(f"malformed entry: {error!r}") from None


class _Writer:
    """One `encode`: the graph walked in pre-order; each container or object numbered as it is first
    met (`_Reader` numbers alike)."""

    def __init__(
        self,
        index: dict[type, int],
        slots: list[list[str]],
        checked: bool = False,
        native: bool = False,
        shared: set[int] | None = None,
    ) -> None:
        self.index, self.slots, self.checked, self.native = index, slots, checked, native
        self.seen: dict[int, int] = {}
        self.leaves: dict[int, int] = {}
        # what was numbered stays alive (ids are never reused within one encode)
        self.keep: list[Any] = []
        self.shared = shared if shared is not None else set()
        self.in_native: set[int] = set()  # containers written inside a native tree (not numbered)
        # ... met again afterwards: this encode is redone without them native
        self.conflicts: set[int] = set()

    def _native_tree(self, value: Any, inside: set[int]) -> bool:
        """Whether `value` (a dict or list) is a tree of plain dicts, lists and scalars met nowhere
        else so far (its containers added to `inside`)."""
        key = id(value)
        if key in inside or key in self.seen or key in self.leaves or key in self.shared:
            return False
        if key in self.in_native:
            self.conflicts.add(key)
            return False
        inside.add(key)
        if type(value) is dict:
            if not set(map(type, value)) <= _LEAF_KEYS:
                return False
            if self.checked and not all(_plain(item) for item in value):
                return False
            items = value.values()
        else:
            items = value
        for item in items:
            kind = type(item)
            if kind in _SCALARS:
                if self.checked and not _plain(item):
                    return False
            elif kind is dict or kind is list:
                if not self._native_tree(item, inside):
                    return False
            else:
                return False
        return True

    def _number(self, value: Any) -> None:
        self.seen[id(value)] = len(self.seen)
        self.keep.append(value)

    def _leaf(self, value: dict[Any, Any]) -> bool:
        """A dict MessagePack holds as it is: plain keys and values (and, when `checked`, ints
        within 64 bits)."""
        if (
            not set(map(type, value)) <= _LEAF_KEYS
            or not set(map(type, value.values())) <= _SCALARS
        ):
            return False
        return not self.checked or all(_plain(item) for item in (*value, *value.values()))

    def _native(self, value: Any) -> bool:
        inside: set[int] = set()
        conflicts = len(self.conflicts)
        if not self._native_tree(value, inside) or len(self.conflicts) > conflicts:
            return False
        self.in_native |= inside
        self.keep.append(value)
        return True

    def node(self, value: Any) -> Any:
        """`value` as a node (the module's layout): a scalar as it is, a container or object met
        before as a reference, else written by its type's writer (`_WRITERS`)."""
        kind = type(value)
        if kind in _SCALARS:
            return self._scalar(kind, value)
        key = id(value)
        if key in self.seen:
            return [_REF, self.seen[key]]
        if key in self.in_native:
            # shared with a native tree written before: the encode is redone
            self.conflicts.add(key)
            return None
        if kind is dict:
            return self._dict(value, key)
        if kind is list and self.native and not set(map(type, value)) <= _SCALARS:
            if self._native(value):
                return [_NATIVE, value]
        self._number(value)
        write = _WRITERS.get(kind)
        return write(self, value) if write is not None else self._object(kind, value)

    def _scalar(self, kind: type, value: Any) -> Any:
        if kind is int and not -(2**63) <= value < 2**64:
            return [_INT, str(value)]
        if kind is str and self.checked and not _utf8(value):
            return [_STR, value.encode("utf-8", "surrogatepass")]
        return value

    def _dict(self, value: dict[Any, Any], key: int) -> Any:
        if key in self.leaves:
            return [_LEAF_REF, self.leaves[key]]
        if self._leaf(value):
            self.leaves[key] = len(self.leaves)
            self.keep.append(value)
            return value
        if self.native and self._native(value):
            return [_NATIVE, value]
        self._number(value)
        flat: list[Any] = []
        for item_key, item in value.items():
            flat.append(self.node(item_key))
            flat.append(self.node(item))
        return [_DICT, flat]

    def _list(self, value: list[Any]) -> list[Any]:
        if set(map(type, value)) <= _SCALARS and (
            not self.checked or all(_plain(item) for item in value)
        ):
            return [_LEAF_LIST, value]
        return [_LIST, [self.node(item) for item in value]]

    def _tuple(self, value: tuple[Any, ...]) -> list[Any]:
        return [_TUPLE, [self.node(item) for item in value]]

    def _array(self, value: array.array[Any]) -> list[Any]:
        return [_ARRAY, value.typecode, value.tobytes()]

    def _set(self, value: set[Any] | frozenset[Any]) -> list[Any]:
        return [_SET if type(value) is set else _FROZENSET, [self.node(item) for item in value]]

    def _counter(self, value: collections.Counter[Any]) -> list[Any]:
        return [_COUNTER, [self.node(item) for pair in value.items() for item in pair]]

    def _defaultdict(self, value: collections.defaultdict[Any, Any]) -> list[Any]:
        factory = next(
            (name for name, made in _FACTORIES.items() if made is value.default_factory), None
        )
        if factory is None:
            raise TypeError(f"a defaultdict of {value.default_factory!r} is not plain data")
        return [_DEFAULTDICT, factory, [self.node(item) for pair in value.items() for item in pair]]

    def _method(self, value: types.MethodType) -> list[Any]:
        return [_METHOD, self.node(value.__self__), value.__func__.__name__]

    def _object(self, kind: type, value: Any) -> list[Any]:
        index = self.index.get(kind)
        if index is None:
            raise TypeError(
                f"{kind.__module__}.{kind.__qualname__} is not one of the classes the cache may "
                "hold"
            )
        if isinstance(value, enum.Enum):
            return [_ENUM, index, self.node(value.value)]
        state: list[Any] = []
        for name in self.slots[index]:
            if hasattr(value, name):
                state.append(name)
                state.append(self.node(getattr(value, name)))
        for name, item in getattr(value, "__dict__", {}).items():
            state.append(name)
            state.append(self.node(item))
        return [_OBJECT, index, state]


#: Type → the `_Writer` method that writes a container of it (any other type: `_Writer._object`).
_WRITERS: dict[type, Any] = {
    list: _Writer._list,
    tuple: _Writer._tuple,
    array.array: _Writer._array,
    set: _Writer._set,
    frozenset: _Writer._set,
    collections.Counter: _Writer._counter,
    collections.defaultdict: _Writer._defaultdict,
    types.MethodType: _Writer._method,
}


class _Reader:
    """One `decode`: builds the graph `_Writer` numbered, in the same order, calling nothing the
    bytes name."""

    def __init__(
        self,
        classes: list[type],
        slots: list[list[str]],
        settable: dict[tuple[type, tuple[str, ...]], bool],
    ) -> None:
        self.classes, self.slots, self.settable = classes, slots, settable
        self.made: list[Any] = []
        self.leaves: list[dict[Any, Any]] = []
        # tuples being built: a reference to one from inside it is no graph we write
        self.pending: set[int] = set()

    def _pairs(self, flat: list[Any]) -> Iterable[tuple[Any, Any]]:
        if len(flat) % 2:
            raise PlainDataError("a mapping with a key and no value")
        for position in range(0, len(flat), 2):
            yield self.node(flat[position]), self.node(flat[position + 1])

    def node(self, node: Any) -> Any:
        """The value `node` was written from: a plain dict or scalar as it is, a tagged list
        built by the tag's builder (`_BUILDERS`)."""
        kind = type(node)
        if kind is dict:
            self.leaves.append(node)
            return node
        if kind is not list:
            return node
        tag = node[0]
        if tag == _REF:  # the commonest tagged node first: a shared object met again
            index = node[1]
            if index in self.pending:
                raise PlainDataError("a tuple that holds itself")
            return self.made[index]
        build = _BUILDERS.get(tag) if type(tag) is int else None
        if build is None:
            raise PlainDataError(f"unknown tag {tag!r}")
        return build(self, node)

    def _leaf_ref(self, node: list[Any]) -> Any:
        return self.leaves[node[1]]

    def _native(self, node: list[Any]) -> Any:
        tree = node[1]
        if type(tree) is not dict and type(tree) is not list:
            raise PlainDataError("a native tree that is no dict or list")
        return tree  # built by msgspec: dicts, lists and scalars only, none of them numbered

    def _int(self, node: list[Any]) -> int:
        return int(node[1])

    def _str(self, node: list[Any]) -> str:
        text: str = node[1].decode("utf-8", "surrogatepass")
        return text

    def _leaf_list(self, node: list[Any]) -> list[Any]:
        items = node[1]
        if type(items) is not list or not set(map(type, items)) <= _SCALARS:
            raise PlainDataError("a list of plain values that holds containers")
        self.made.append(items)
        return items

    def _list(self, node: list[Any]) -> list[Any]:
        out: list[Any] = []
        self.made.append(out)
        items = node[1]
        out.extend(items if set(map(type, items)) <= _SCALARS else map(self.node, items))
        return out

    def _dict(self, node: list[Any]) -> dict[Any, Any]:
        mapping: dict[Any, Any] = {}
        self.made.append(mapping)
        flat = node[1]
        keys, items = flat[0::2], flat[1::2]
        if len(keys) == len(items) and set(map(type, keys)) <= _SCALARS:
            kinds = set(map(type, items))
            # rank → {step: ms}, the bulk: plain dicts, numbered in order as `node` would
            if kinds == {dict}:
                self.leaves.extend(items)
            if kinds <= _SCALARS or kinds == {dict}:  # nothing inside to build: in C
                mapping.update(zip(keys, items))
                return mapping
        for key, item in self._pairs(flat):
            mapping[key] = item
        return mapping

    def _tuple(self, node: list[Any]) -> tuple[Any, ...]:
        items = node[1]
        # the common tuple, a key or a (name, rank, step): nothing inside to build
        if set(map(type, items)) <= _SCALARS:
            made = tuple(items)
            self.made.append(made)
            return made
        slot = self._pending()
        made = tuple(map(self.node, items))
        self._done(slot, made)
        return made

    def _array(self, node: list[Any]) -> array.array[Any]:
        numbers = array.array(node[1])
        numbers.frombytes(node[2])
        self.made.append(numbers)
        return numbers

    def _set(self, node: list[Any]) -> set[Any] | frozenset[Any]:
        slot = self._pending()
        items = [self.node(item) for item in node[1]]
        made = set(items) if node[0] == _SET else frozenset(items)
        self._done(slot, made)
        return made

    def _counter(self, node: list[Any]) -> collections.Counter[Any]:
        counter: collections.Counter[Any] = collections.Counter()
        self.made.append(counter)
        for key, item in self._pairs(node[1]):
            dict.__setitem__(counter, key, item)
        return counter

    def _defaultdict(self, node: list[Any]) -> collections.defaultdict[Any, Any]:
        defaults: collections.defaultdict[Any, Any] = collections.defaultdict(_FACTORIES[node[1]])
        self.made.append(defaults)
        for key, item in self._pairs(node[2]):
            dict.__setitem__(defaults, key, item)
        return defaults

    def _method(self, node: list[Any]) -> types.MethodType:
        slot = len(self.made)
        self.made.append(None)
        owner = self.node(node[1])
        function = inspect.getattr_static(type(owner), node[2], None)
        if (
            type(owner) not in self.classes
            or not isinstance(function, types.FunctionType)
            or node[2].startswith("__")
        ):
            raise PlainDataError(f"{node[2]!r} is not a method of a class the cache may hold")
        self.made[slot] = method = types.MethodType(function, owner)
        return method

    def _enum(self, node: list[Any]) -> enum.Enum:
        slot = len(self.made)
        self.made.append(None)
        cls = self.classes[node[1]]
        if not issubclass(cls, enum.Enum):
            raise PlainDataError(f"{cls.__qualname__} is not an enum")
        member = cls._value2member_map_[self.node(node[2])]
        self.made[slot] = member
        return member

    def _object(self, node: list[Any]) -> Any:
        cls = self.classes[node[1]]
        if issubclass(cls, enum.Enum):
            raise PlainDataError(f"{cls.__qualname__} is an enum")
        obj = object.__new__(cls)
        self.made.append(obj)
        slots = self.slots[node[1]]
        has_dict = hasattr(obj, "__dict__")
        flat = node[2]
        if len(flat) % 2:
            raise PlainDataError("a mapping with a key and no value")
        names = tuple(flat[0::2])
        if not self._settable(cls, names, slots, has_dict):
            raise PlainDataError(
                f"{cls.__qualname__} has an attribute it cannot set plainly among {names!r}"
            )
        # in order: numbered as written
        values = [item if type(item) in _SCALARS else self.node(item) for item in flat[1::2]]
        if slots or not has_dict:
            for name, item in zip(names, values):
                object.__setattr__(obj, name, item)
        else:  # only plain attributes (checked above): what object.__setattr__ would store, in one call
            obj.__dict__.update(zip(names, values))
        return obj

    def _settable(
        self, cls: type, names: tuple[Any, ...], slots: list[str], has_dict: bool
    ) -> bool:
        """Whether every one of `names` is an attribute of `cls` that only stores a value: asked
        once per class and set of attributes (a cache holds thousands alike)."""
        allowed = self.settable.get((cls, names))
        if allowed is None:
            # an entry of thousands of shapes (forged): asked again rather than kept
            if len(self.settable) > 4096:
                self.settable.clear()
            allowed = self.settable[(cls, names)] = all(
                type(name) is str and (name in slots or (has_dict and _plain_attribute(cls, name)))
                for name in names
            )
        return allowed

    def _pending(self) -> int:
        """A slot numbered for a container built from its items: a reference to it from inside is
        no graph we write."""
        slot = len(self.made)
        self.made.append(None)
        self.pending.add(slot)
        return slot

    def _done(self, slot: int, made: Any) -> None:
        self.pending.discard(slot)
        self.made[slot] = made


#: Tag → the `_Reader` method that builds its node (`_REF` is `_Reader.node`'s own).
_BUILDERS: dict[int, Any] = {
    _LEAF_REF: _Reader._leaf_ref,
    _NATIVE: _Reader._native,
    _INT: _Reader._int,
    _STR: _Reader._str,
    _LEAF_LIST: _Reader._leaf_list,
    _LIST: _Reader._list,
    _DICT: _Reader._dict,
    _TUPLE: _Reader._tuple,
    _ARRAY: _Reader._array,
    _SET: _Reader._set,
    _FROZENSET: _Reader._set,
    _COUNTER: _Reader._counter,
    _DEFAULTDICT: _Reader._defaultdict,
    _METHOD: _Reader._method,
    _ENUM: _Reader._enum,
    _OBJECT: _Reader._object,
}


def _plain_attribute(cls: type, name: str) -> bool:
    """Whether setting `name` on an instance of `cls` only stores a value (no property, no
    descriptor of the class runs)."""
    if name.startswith("__"):
        return False
    found = inspect.getattr_static(cls, name, None)
    return found is None or not (
        hasattr(type(found), "__set__") or hasattr(type(found), "__delete__")
    )

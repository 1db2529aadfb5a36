"""`@record` classes behave as the `@dataclass` classes they replaced: same construction, equality, repr,
hashing, frozen fields and slots."""

from __future__ import annotations

import dataclasses
import pickle
from typing import ClassVar

import pytest

from dispatchlab.core import records
from dispatchlab.core.records import FrozenInstanceError, field, field_names, from_fields, record, replace


@record
class Hit:
    line: int
    rank: str | None
    tags: list[str] = field(default_factory=list)
    count: int = 1
    KIND: ClassVar[str] = "hit"


@dataclasses.dataclass
class DataHit:
    line: int
    rank: str | None
    tags: list[str] = dataclasses.field(default_factory=list)
    count: int = 1
    KIND: ClassVar[str] = "hit"


@record(frozen=True)
class Key:
    patterns: tuple[str, ...] = ()
    limit: int = 25


@record(slots=True)
class Slotted:
    number: int
    style: str = "plain"

    def shown(self) -> str:
        return f"{self.number}:{self.style}"


def test_a_record_is_made_read_and_shown_as_the_dataclass_was():
    for made in (Hit(3, "TP0"), Hit(line=3, rank="TP0"), Hit(3, "TP0", ["a"], 2)):
        twin = DataHit(made.line, made.rank, list(made.tags), made.count)
        assert repr(made) == repr(twin).replace("DataHit", "Hit")
        assert vars(made) == vars(twin)
    assert Hit(1, None).tags is not Hit(1, None).tags  # a fresh list per instance
    assert field_names(Hit) == ("line", "rank", "tags", "count")
    assert Hit.count == 1 and "tags" not in vars(Hit)  # defaults stay class attributes, factories do not
    with pytest.raises(TypeError, match=r"Hit.__init__\(\) missing 1 required positional argument: 'rank'"):
        Hit(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'kind'"):
        Hit(1, None, kind="x")  # type: ignore[call-arg]


def test_records_compare_field_by_field_and_only_with_their_own_class():
    assert Hit(1, "TP0", ["a"]) == Hit(1, "TP0", ["a"])
    assert Hit(1, "TP0") != Hit(2, "TP0")
    assert Hit(1, "TP0") != DataHit(1, "TP0")
    nan = float("nan")
    assert Hit(1, None, count=nan) == Hit(1, None, count=nan)  # type: ignore[arg-type]  # as tuples compare
    with pytest.raises(TypeError, match="unhashable"):
        hash(Hit(1, None))  # mutable with equality: unhashable, as a dataclass


def test_a_frozen_record_refuses_assignment_and_hashes_by_value():
    key = Key(("a", "b"))
    with pytest.raises(FrozenInstanceError):
        key.limit = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del key.limit  # type: ignore[misc]
    assert {Key(("a", "b")): 1}[Key(("a", "b"))] == 1
    assert hash(Key()) == hash(Key((), 25)) and Key() != Key(limit=3)


def test_a_slotted_record_has_no_instance_dict_and_keeps_its_methods():
    item = Slotted(4)
    assert not hasattr(item, "__dict__") and Slotted.__slots__ == ("number", "style")
    assert item.shown() == "4:plain" and repr(item) == "Slotted(number=4, style='plain')"
    item.style = "sglang"
    with pytest.raises(AttributeError):
        item.other = 1  # type: ignore[attr-defined]


def test_replace_copies_a_record_with_some_fields_changed():
    hit = Hit(1, "TP0", ["a"])
    moved = replace(hit, line=9)
    assert moved == Hit(9, "TP0", ["a"]) and hit.line == 1
    assert replace(Key(("a",)), limit=2) == Key(("a",), 2)
    assert replace(Slotted(1), style="vllm").shown() == "1:vllm"


def test_records_survive_a_pickle_round_trip():
    for value in (Hit(1, "TP0", ["a"]), Key(("a",)), Slotted(2, "vllm")):
        assert pickle.loads(pickle.dumps(value)) == value


def test_a_field_without_a_default_after_one_with_a_default_is_refused():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        @record
        class Wrong:
            a: int = 1
            b: int


def _fresh_hit_class() -> type:
    @record
    class Fresh:
        line: int
        rank: str | None
        tags: list[str] = field(default_factory=list)
        count: int = 1

    return Fresh


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((3, "TP0"), {}),
        ((3,), {"rank": None, "count": 2}),
        ((), {"line": 1, "rank": "DP1", "tags": ["x"]}),
        ((1, "TP0", ["a"], 5), {}),
        ((1,), {}),  # missing rank
        ((1, "TP0"), {"line": 2}),  # line twice
        ((1, "TP0"), {"colour": "red"}),  # no such field
        ((1, "TP0", [], 1, 9), {}),  # one too many
    ],
)
def test_the_first_instances_and_the_compiled_init_bind_arguments_alike(args: tuple, kwargs: dict):
    shared, compiled = _fresh_hit_class(), _fresh_hit_class()
    compiled.__init__ = records._init(
        compiled, list(field_names(compiled)), compiled.__record_defaults__, False
    )
    outcomes = []
    for cls in (shared, compiled):
        try:
            made = cls(*args, **kwargs)
            outcomes.append(("made", list(vars(made).items())))
        except TypeError as error:
            outcomes.append(("refused", str(error)))
    assert outcomes[0] == outcomes[1]


def test_a_class_gets_its_compiled_init_once_it_makes_many_instances():
    cls = _fresh_hit_class()
    shared = cls.__init__
    made = [cls(n, None) for n in range(records.COMPILE_AFTER + 5)]
    assert cls.__init__ is not shared and cls.__init__.__code__.co_varnames[:3] == ("self", "line", "rank")
    assert [m.line for m in made] == list(range(records.COMPILE_AFTER + 5))
    assert all(m.tags == [] for m in made) and len({id(m.tags) for m in made}) == len(made)


def test_a_record_read_back_from_its_fields_equals_the_one_that_wrote_them():
    for value in (Hit(1, "TP0", ["a"], 3), Key(("a",), 2)):
        copy = from_fields(type(value), vars(value).copy())
        assert copy == value and repr(copy) == repr(value) and list(vars(copy)) == list(vars(value))

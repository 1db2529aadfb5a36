"""`@record`: the dataclasses of the core's hot path, made for a fast start.

`@dataclass` writes and compiles up to six methods per class when its module is imported (about 1.3 ms a
class), and a one-line `dispatchlab match` defines some thirty such classes before it reads a byte. `@record`
reads the same class body (annotated fields, defaults, `field(default_factory=...)`) and compiles only
`__init__`, the one method whose speed matters (the parser makes records by the million), and only for a
class that makes a hundred instances; equality, repr and the frozen guard are shared methods that read the
class's field names.

Instances behave as the dataclass's would: made from the same arguments (or refused with the same TypeError),
`==` field by field between
instances of one class, `Name(field=value, ...)` repr, unhashable unless frozen, `FrozenInstanceError` on
assignment to a frozen one, `__slots__` with `slots=True`. `replace` and `field_names` stand in for
`dataclasses.replace` and `dataclasses.fields`, which do not take records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["FrozenInstanceError", "field", "field_names", "from_fields", "record", "replace"]

_T = TypeVar("_T")
_MISSING: Any = object()
_FACTORY: Any = object()  # the default of a field with a default_factory: "make one"


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen record."""


class _Field:
    __slots__ = ("default", "default_factory")

    def __init__(self, default: Any, default_factory: Callable[[], Any] | None) -> None:
        self.default = default
        self.default_factory = default_factory


@overload
def field(*, default: _T) -> _T: ...
@overload
def field(*, default_factory: Callable[[], _T]) -> _T: ...
def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] | None = None) -> Any:
    """A field's default, or the function that makes a fresh default for each instance."""
    return _Field(default, default_factory)


def field_names(obj: object) -> tuple[str, ...]:
    """The record's (or record class's) fields, in declaration order."""
    names: tuple[str, ...] = getattr(obj, "__record_fields__")  # noqa: B009 - set by @record
    return names


def replace(obj: _T, /, **changes: Any) -> _T:
    """A copy of the record with some fields changed (`dataclasses.replace`)."""
    for name in field_names(obj):
        if name not in changes:
            changes[name] = getattr(obj, name)
    return obj.__class__(**changes)


def from_fields(cls: type[_T], fields: dict[str, Any]) -> _T:
    """An instance holding `fields` (all of them, in declaration order), made as pickle makes one: without
    calling `__init__`. For reading back a cache this code wrote, where binding the arguments of a few hundred
    records would cost more than reading them. Not for records with `slots=True`."""
    made = cls.__new__(cls)
    made.__dict__.update(fields)
    return made


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_fields__)
    return f"{self.__class__.__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = self.__record_fields__
    return [getattr(self, n) for n in names] == [getattr(other, n) for n in names]


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, n) for n in self.__record_fields__))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    if type(self) is self.__record_class__ or name in self.__record_fields__:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _frozen_delattr(self: Any, name: str) -> None:
    if type(self) is self.__record_class__ or name in self.__record_fields__:
        raise FrozenInstanceError(f"cannot delete field {name!r}")
    object.__delattr__(self, name)


def _is_class_var(annotation: Any) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def _init(cls: type, names: list[str], defaults: dict[str, Any], frozen: bool) -> Callable[..., None]:
    """`__init__` compiled from source, as dataclasses does it: as fast as a hand-written one."""
    scope: dict[str, Any] = {"_FACTORY": _FACTORY, "_setattr": object.__setattr__}
    params, body = ["self"], []
    for name in names:
        value = defaults.get(name, _MISSING)
        if isinstance(value, _Field):  # a default_factory
            scope[f"_make_{name}"] = value.default_factory
            params.append(f"{name}=_FACTORY")
            value_text = f"_make_{name}() if {name} is _FACTORY else {name}"
        else:
            if value is not _MISSING:
                scope[f"_default_{name}"] = value
                params.append(f"{name}=_default_{name}")
            else:
                params.append(name)
            value_text = name
        body.append(f"_setattr(self, {name!r}, {value_text})" if frozen else f"self.{name} = {value_text}")
    source = f"def __init__({', '.join(params)}):\n    " + "\n    ".join(body or ["pass"])
    exec(source, scope)
    init: Callable[..., None] = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


# instances a class's shared `__init__` makes before the class gets its own compiled one
COMPILE_AFTER = 100


def _shared_init(cls: type, names: list[str], defaults: dict[str, Any], frozen: bool) -> Callable[..., None]:
    """An `__init__` that binds the arguments in a loop: compiling one takes as long as making a hundred
    instances this way, and most records a command defines it makes a few times. The class's hundredth
    instance compiles its own (`_init`); so does any call with arguments this one would not bind, which then
    raises the very TypeError a dataclass would."""
    count = len(names)
    known = frozenset(names)
    assign = object.__setattr__ if frozen else setattr
    made = 0

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal made
        made += 1
        if made < COMPILE_AFTER and len(args) <= count and known.issuperset(kwargs):
            for position, name in enumerate(names):
                if position < len(args):
                    if name in kwargs:
                        break  # given twice
                    value = args[position]
                elif name in kwargs:
                    value = kwargs[name]
                else:
                    value = defaults.get(name, _MISSING)
                    if value is _MISSING:
                        break  # missing
                    if isinstance(value, _Field):
                        value = value.default_factory()  # type: ignore[misc]
                assign(self, name, value)
            else:
                return
        init = _init(cls, names, defaults, frozen)
        if made >= COMPILE_AFTER:
            cls.__init__ = init  # type: ignore[misc]
        init(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


def _make(cls: type, frozen: bool, slots: bool) -> type:
    names: list[str] = []
    defaults: dict[str, Any] = {}
    for base in reversed(cls.__mro__[1:]):  # a record's subclass: the base's fields come first
        base_defaults = getattr(base, "__record_defaults__", {})
        for name in getattr(base, "__record_fields__", ()):
            names.append(name)
            if name in base_defaults:
                defaults[name] = base_defaults[name]
    own = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 - inspect is the import this module avoids
    for name, annotation in own.items():
        if _is_class_var(annotation):
            continue
        if name not in names:
            names.append(name)
        value = cls.__dict__.get(name, _MISSING)
        if isinstance(value, _Field):
            if value.default_factory is not None:
                defaults[name] = value
                delattr(cls, name)
                continue
            value = value.default
            setattr(cls, name, value)
        if value is not _MISSING:
            defaults[name] = value
        elif any(n in defaults for n in names[:-1]):
            raise TypeError(f"non-default argument {name!r} follows default argument")
    methods: dict[str, Any] = {
        "__repr__": _repr,
        "__eq__": _eq,
        "__hash__": _hash if frozen else None,
        "__match_args__": tuple(names),
    }
    if frozen:
        methods.update(__setattr__=_frozen_setattr, __delattr__=_frozen_delattr)
    if slots:
        # as dataclasses does: a new class, without the defaults (a slot and a class attribute cannot share a name)
        skip = {*names, "__dict__", "__weakref__"}
        body = {key: value for key, value in cls.__dict__.items() if key not in skip}
        inherited = {n for base in cls.__mro__[1:] for n in getattr(base, "__slots__", ())}
        body["__slots__"] = tuple(n for n in names if n not in inherited)
        body["__qualname__"] = cls.__qualname__
        cls = type(cls)(cls.__name__, cls.__bases__, body)
    methods["__init__"] = _shared_init(cls, names, defaults, frozen)
    for name, method in methods.items():
        if name not in cls.__dict__ or (name == "__hash__" and cls.__dict__[name] is None):
            setattr(cls, name, method)
    cls.__record_fields__ = tuple(names)  # type: ignore[attr-defined]
    cls.__record_defaults__ = defaults  # type: ignore[attr-defined]
    cls.__record_class__ = cls  # type: ignore[attr-defined]
    return cls


@overload
def record(cls: type[_T], /) -> type[_T]: ...
@overload
def record(*, frozen: bool = False, slots: bool = False) -> Callable[[type[_T]], type[_T]]: ...
@dataclass_transform(field_specifiers=(field,))
def record(cls: Any = None, /, *, frozen: bool = False, slots: bool = False) -> Any:
    """`@dataclass` for the hot path: `@record`, `@record(frozen=True)`, `@record(slots=True)`."""

    def wrap(cls: type[_T]) -> type[_T]:
        return _make(cls, frozen, slots)

    return wrap if cls is None else wrap(cls)

"""A pickle's opcodes walked without unpickling it (`pickletools.genops` through a small stack machine that
knows only data: strings, numbers, containers, the memo). A class or function the pickle names becomes its
dotted name, an object built from one an `Instance` record; nothing is imported or called. The work is
bounded (opcodes, nesting, memo, text bytes); a pickle cut short or over a bound gives what was read before
the cut. dispatchlab.core.crashdump reads SGLang's crash dumps with it."""

from __future__ import annotations

import io
import pickletools
from dataclasses import dataclass, field
from typing import Any

MAX_OPCODES = 5_000_000
MAX_NESTING = 500  # open MARKs at once; Python's own pickler gives up near 1000 levels
MAX_MEMO = 2_000_000
MAX_TEXT_BYTES = 128 * 1024 * 1024


class NotACrashDump(ValueError):
    """The pickle is not something this reader can make sense of. str(error) is one line for people."""


@dataclass(frozen=True)
class Global:
    """A class or function the pickle names (GLOBAL / STACK_GLOBAL): only its dotted name, never imported."""

    name: str


@dataclass(frozen=True)
class Opaque:
    """Something only the writer's own code could resolve: a persistent id, an out-of-band buffer."""

    what: str


@dataclass(eq=False)
class Instance:
    """An object the pickle would build (NEWOBJ, REDUCE, INST, OBJ) and the state BUILD would give it."""

    class_name: str
    args: Any = ()
    state: Any = None
    items: list[Any] = field(default_factory=list)  # APPENDS onto it (a list subclass)
    entries: dict[Any, Any] = field(default_factory=dict)  # SETITEMS onto it (a dict subclass)

    def fields(self) -> dict[Any, Any]:
        """The instance's attributes: a dataclass's state dict, or the dict half of `(dict, slots)`."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:
            merged: dict[Any, Any] = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            return merged
        return state if isinstance(state, dict) else {}

    def to_dict(self) -> dict[str, Any]:
        return {"__class__": self.class_name, "args": self.args, "state": self.state}


@dataclass(frozen=True)
class PickleRead:
    """What the walk found: the top object (or what was built of it before the walk stopped)."""

    value: Any
    protocol: int | None
    complete: bool
    stopped: str | None  # why the walk stopped before STOP; None when it read the whole pickle


# ---------------------------------------------------------------- the walk


def _name_of(callable_: Any) -> str:
    if isinstance(callable_, Global):
        return callable_.name
    if isinstance(callable_, Instance):
        return f"<result of {callable_.class_name}>"
    return f"<{type(callable_).__name__}>"


def small_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value.bit_length() <= 63


def _key(value: Any) -> Any:
    """A dict key that is safe to hash and print: scalars as they are, anything else by its kind (hashing a
    deeply nested tuple would recurse in C; str() of a huge int raises)."""
    if value is None or isinstance(value, (str, bytes, float, bool)) or small_int(value):
        return value
    if isinstance(value, Global):
        return value.name
    return f"<{type(value).__name__} key>"


def _reduce(callable_: Any, args: Any) -> Instance:
    # protocols 0-1 rebuild plain objects through copyreg._reconstructor(cls, base, state): name the class
    if (
        isinstance(callable_, Global)
        and callable_.name == "copyreg._reconstructor"
        and isinstance(args, tuple)
        and args
        and isinstance(args[0], Global)
    ):
        return Instance(args[0].name, args[1:])
    return Instance(_name_of(callable_), args)


class _Walk:
    """The stack machine. Each method is one opcode family; the pickle's own bytes never pick a callable."""

    def __init__(self, max_opcodes: int, max_nesting: int, max_memo: int, max_text_bytes: int) -> None:
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.max_opcodes = max_opcodes
        self.max_nesting = max_nesting
        self.max_memo = max_memo
        self.text_left = max_text_bytes
        self.protocol: int | None = None

    def pop_mark(self) -> list[Any]:
        items = self.stack
        if not self.marks:
            raise NotACrashDump("malformed pickle: a MARK is missing")
        self.stack = self.marks.pop()
        return items

    def remember(self, index: int) -> None:
        if len(self.memo) >= self.max_memo and index not in self.memo:
            raise _Limit(f"its memo grows past {self.max_memo:,} entries")
        self.memo[index] = self.stack[-1]

    def run(self, data: bytes) -> PickleRead:
        count = 0
        try:
            for opcode, arg, _pos in pickletools.genops(io.BytesIO(data)):
                count += 1
                if count > self.max_opcodes:
                    raise _Limit(f"it holds more than {self.max_opcodes:,} opcodes")
                if self.step(opcode.name, arg):
                    return PickleRead(self.stack.pop(), self.protocol, True, None)
        except _Limit as limit:
            return self.salvage(f"stopped reading: {limit}")
        except (ValueError, EOFError) as error:  # genops: cut short, an unknown opcode, a bad length
            if isinstance(error, NotACrashDump):
                raise
            return self.salvage(f"the pickle is cut short or damaged ({str(error)[:120]})")
        except (IndexError, KeyError, TypeError, AttributeError) as error:
            raise NotACrashDump(f"malformed pickle ({type(error).__name__} at opcode {count:,})") from None
        return self.salvage("the pickle ends without STOP")

    def step(self, name: str, arg: Any) -> bool:
        stack = self.stack
        if isinstance(arg, (str, bytes, bytearray)) and name not in ("GLOBAL", "INST"):
            self.text_left -= len(arg)
            if self.text_left < 0:
                raise _Limit("its strings add up to more than the text limit")
        if name in _PUSH_ARG:
            stack.append(arg)
        elif name in ("BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"):
            stack.append(bytes(arg))
        elif name == "MEMOIZE":
            self.remember(len(self.memo))
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            self.remember(int(arg))
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(self.memo[int(arg)])
        elif name == "MARK":
            if len(self.marks) >= self.max_nesting:
                raise NotACrashDump(f"pickle nests deeper than {self.max_nesting} levels")
            self.marks.append(stack)
            self.stack = []
        elif name in ("APPENDS", "SETITEMS", "ADDITEMS"):
            items = self.pop_mark()
            self._add(self.stack[-1], items, pairs=name == "SETITEMS")
        elif name in ("APPEND", "SETITEM"):
            count = 1 if name == "APPEND" else 2
            items = stack[-count:]
            del stack[-count:]
            self._add(stack[-1], items, pairs=name == "SETITEM")
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name in ("EMPTY_SET", "EMPTY_TUPLE"):
            stack.append([] if name == "EMPTY_SET" else ())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            size = int(name[-1])
            items = stack[-size:]
            del stack[-size:]
            stack.append(tuple(items))
        elif name in ("TUPLE", "LIST", "FROZENSET"):
            items = self.pop_mark()
            self.stack.append(tuple(items) if name == "TUPLE" else items)
        elif name == "DICT":
            items = self.pop_mark()
            self.stack.append({_key(k): v for k, v in zip(items[::2], items[1::2], strict=False)})
        elif name == "NONE":
            stack.append(None)
        elif name in ("NEWTRUE", "NEWFALSE"):
            stack.append(name == "NEWTRUE")
        elif name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            stack.append(Global(f"{module}.{attr}"))
        elif name == "STACK_GLOBAL":
            attr, module = stack.pop(), stack.pop()
            if not (isinstance(module, str) and isinstance(attr, str)):
                raise NotACrashDump("malformed pickle: STACK_GLOBAL of something else than names")
            stack.append(Global(f"{module}.{attr}"))
        elif name in ("REDUCE", "NEWOBJ"):
            args = stack.pop()
            stack[-1] = _reduce(stack[-1], args)
        elif name == "NEWOBJ_EX":
            kwargs, args = stack.pop(), stack.pop()
            stack[-1] = Instance(_name_of(stack[-1]), (args, kwargs))
        elif name == "BUILD":
            state = stack.pop()
            target = stack[-1]
            if isinstance(target, Instance):
                target.state = state if target.state is None else (target.state, state)
        elif name == "INST":
            module, _, attr = str(arg).partition(" ")
            items = self.pop_mark()
            self.stack.append(Instance(f"{module}.{attr}", tuple(items)))
        elif name == "OBJ":
            items = self.pop_mark()
            self.stack.append(Instance(_name_of(items[0]), tuple(items[1:])))
        elif name in ("EXT1", "EXT2", "EXT4"):
            stack.append(Global(f"<extension {arg}>"))
        elif name in ("PERSID", "BINPERSID"):
            if name == "BINPERSID":
                stack.pop()
            stack.append(Opaque("persistent id"))
        elif name == "NEXT_BUFFER":
            stack.append(Opaque("out-of-band buffer"))
        elif name == "POP":
            if stack:
                stack.pop()
            else:
                self.pop_mark()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            stack.append(stack[-1])
        elif name == "PROTO":
            self.protocol = int(arg)
        elif name == "STOP":
            if len(stack) != 1 or self.marks:
                raise NotACrashDump("malformed pickle: STOP with an unbalanced stack")
            return True
        # FRAME, READONLY_BUFFER: nothing to do for data
        return False

    def _add(self, target: Any, items: list[Any], *, pairs: bool) -> None:
        if pairs:
            entries = {_key(k): v for k, v in zip(items[::2], items[1::2], strict=False)}
            if isinstance(target, dict):
                target.update(entries)
            elif isinstance(target, Instance):
                target.entries.update(entries)
            else:
                raise NotACrashDump(f"malformed pickle: items set on a {type(target).__name__}")
        elif isinstance(target, list):
            target.extend(items)
        elif isinstance(target, Instance):
            target.items.extend(items)
        else:
            raise NotACrashDump(f"malformed pickle: items appended to a {type(target).__name__}")

    def salvage(self, why: str) -> PickleRead:
        """Close what was open when the walk stopped, so what came before the cut can still be read: the
        items after a MARK join the list or dict below it (or make a tuple), a state dict left on top of an
        object becomes its state."""
        while self.marks:
            items = self.stack
            self.stack = self.marks.pop()
            target = self.stack[-1] if self.stack else None
            if isinstance(target, (list, dict)):
                self._add(target, items, pairs=isinstance(target, dict))
            else:
                self.stack.append(tuple(items))
            self._fold_state()
        self._fold_state()
        value = self.stack[0] if self.stack else None
        return PickleRead(value, self.protocol, False, why)

    def _fold_state(self) -> None:
        stack = self.stack
        below = stack[-2] if len(stack) >= 2 else None
        if isinstance(below, Instance) and below.state is None and isinstance(stack[-1], dict):
            below.state = stack.pop()


class _Limit(Exception):
    """A bound was reached: stop reading, keep what came before."""


_PUSH_ARG = frozenset(
    {
        "BININT",
        "BININT1",
        "BININT2",
        "INT",
        "LONG",
        "LONG1",
        "LONG4",
        "BINFLOAT",
        "FLOAT",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "UNICODE",
        "BINUNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE8",
    }
)


def read_pickle(
    data: bytes,
    *,
    max_opcodes: int = MAX_OPCODES,
    max_nesting: int = MAX_NESTING,
    max_memo: int = MAX_MEMO,
    max_text_bytes: int = MAX_TEXT_BYTES,
) -> PickleRead:
    """Walk a pickle's opcodes without unpickling it. NotACrashDump when the opcodes contradict each other;
    a cut or a bound ends the walk with what was built so far (`complete` False, `stopped` says why)."""
    return _Walk(max_opcodes, max_nesting, max_memo, max_text_bytes).run(data)

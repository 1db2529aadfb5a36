"""Regexes compiled once per machine, not once per run.

Python's regex parser and compiler are written in Python: the few hundred patterns a parse confirms its hits
with took a tenth of a 100 MB log's parse to compile, every run. What the compiler makes of a pattern (its
code words and group names) is kept on disk for this interpreter build, and the pattern object is made from it
the way `re.compile` itself ends, with `_sre.compile`. Any doubt (another interpreter, a cache that does not
load, a pattern not in it yet) is a plain compile; tests/core/test_compiledre.py compares both.
"""

from __future__ import annotations

import atexit
import marshal
import re
import sys
from typing import Any

try:  # CPython's own engine and compiler; another interpreter compiles the usual way
    import _sre
    from re import _compiler, _parser  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - not CPython
    _sre = None

_MAX_ENTRIES = 4096  # patterns made from user input (signature files) must not grow the file for ever
# the file: the first _DIGEST hex characters of the SHA-256 of the rest, then the marshalled entries
_FORMAT = 2
_DIGEST = 32
_Key = tuple[str | bytes, int]

_stored: dict[_Key, bytes] | None = None  # (pattern, flags) -> marshalled compiler output
_added: dict[_Key, bytes] = {}
ENABLED = _sre is not None and sys.implementation.name == "cpython"  # tests turn it off to compare


def compile(pattern: str | bytes, flags: int = 0) -> re.Pattern[Any]:
    if not ENABLED or flags & re.DEBUG:
        return re.compile(pattern, flags)
    flags = int(flags)
    key = (pattern, flags)
    data = _entries().get(key) or _added.get(key)
    if data is not None:
        try:
            return _from_entry(pattern, marshal.loads(data))
        except Exception:
            pass
    try:
        entry = _compile_entry(pattern, flags)
        compiled = _from_entry(pattern, entry)
        data = marshal.dumps(entry)
    except Exception:
        return re.compile(pattern, flags)
    if type(pattern) in (str, bytes) and len(_entries()) + len(_added) < _MAX_ENTRIES:
        if not _added:
            atexit.register(_save)
        _added[key] = data
    return compiled


def _compile_entry(pattern: str | bytes, flags: int) -> tuple[Any, ...]:
    """What re._compiler.compile hands to _sre.compile, but the pattern."""
    parsed = _parser.parse(pattern, flags)
    code = _compiler._code(parsed, flags)
    state = parsed.state
    indexgroup: list[str | None] = [None] * state.groups
    for name, index in state.groupdict.items():
        indexgroup[index] = name
    # the code words as plain ints (the compiler's opcodes are an int subclass marshal does not write)
    return (
        int(flags | state.flags),
        [int(word) for word in code],
        state.groups - 1,
        dict(state.groupdict),
        tuple(indexgroup),
    )


def _from_entry(pattern: str | bytes, entry: tuple[Any, ...]) -> re.Pattern[Any]:
    final_flags, code, groups, groupindex, indexgroup = entry
    return _sre.compile(pattern, final_flags, code, groups, groupindex, indexgroup)  # type: ignore[no-any-return]


def _cache_file() -> Any:
    from dispatchlab.core.cache import cache_path

    return cache_path("re", (_FORMAT, sys.version, _sre.MAGIC, sys.maxunicode), ".marshal")


def _entries() -> dict[_Key, bytes]:
    """The cached entries; none from a file whose digest does not match what it holds (a damaged entry that
    still loads would make a pattern that matches something else, run after run)."""
    global _stored
    if _stored is None:
        from dispatchlab.core.cache import read_cached
        from dispatchlab.core.digest import sha256_hex

        _stored = {}
        data = read_cached(_cache_file())
        if (
            data is not None
            and data[:_DIGEST].decode("ascii", "replace") == sha256_hex(data[_DIGEST:])[:_DIGEST]
        ):
            try:
                loaded = marshal.loads(data[_DIGEST:])
            except Exception:  # a file this module did not write
                loaded = None
            if isinstance(loaded, dict):
                _stored = loaded
    return _stored


def _save() -> None:
    from dispatchlab.core.cache import write_cached
    from dispatchlab.core.digest import sha256_hex

    merged = {**_entries(), **_added}
    if len(merged) > _MAX_ENTRIES:
        merged = dict(list(_added.items())[:_MAX_ENTRIES])
    try:
        payload = marshal.dumps(merged)
    except ValueError:
        return
    write_cached(_cache_file(), sha256_hex(payload)[:_DIGEST].encode("ascii") + payload)

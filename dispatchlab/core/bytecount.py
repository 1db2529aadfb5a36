"""Counting newlines and statistics lines at memory speed.

`bytes.count` of one byte is a loop CPython cannot vectorise (it checks a maximum count at every match): the
newline and statistics-line counts were a third of a big log's scan. StringZilla (an optional accelerator, in
the `fast` and `web` extras) counts with SIMD instructions and gives the same numbers
(tests/core/test_bytecount.py); without it, `bytes.count`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

Counter = Callable[..., int]  # (needle, start=0, end=len) -> non-overlapping occurrences, as bytes.count

_SMALL = 64 * 1024  # below this, bytes.count is as quick, and a short log's start-up imports nothing more
_stringzilla: Any = None
ENABLED: bool | None = None  # None: not looked for yet; tests set False to compare


def counter(data: bytes) -> Counter:
    """`data.count`, SIMD-fast where StringZilla is installed."""
    if len(data) < _SMALL or not _enabled():
        return data.count
    return _stringzilla.Str(data).count  # type: ignore[no-any-return]


def _enabled() -> bool:
    global ENABLED, _stringzilla
    if ENABLED is None:
        try:  # optional accelerator: `pip install dispatchlab[fast]`
            import stringzilla
        except ImportError:
            stringzilla = None
        _stringzilla = stringzilla
        ENABLED = stringzilla is not None and not os.environ.get("DISPATCHLAB_NO_STRINGZILLA")
    return ENABLED

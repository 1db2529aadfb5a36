"""The one line every view names for the crash (docs/contract.md, "The crash's line").

It is the line that prints the exception the crash names, `Type: message`: where Python ends the fatal
traceback, the line an engineer reads first, with the frames just above it. A crash without a traceback
(a fatal error line, a known fatal line) points at that line. The report header's "Jump to crash", the log
viewer's button and its highlighted row, the timeline's crash marker, the diagnosis's crash evidence and
the command line's summary all take it from here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dispatchlab.core.lazyre import lazy_compile

# How far below the traceback head an older document's exception line may be (a deep native stack).
EXCEPTION_SEARCH_LINES = 600
_PREFIX = lazy_compile(r"^\s*(?:\[[^\]]{0,80}\]\s*|\([^)]{0,60}pid=\d+\)\s*)+")
_VLLM_LEVEL = lazy_compile(r"^(?:ERROR|WARNING|INFO|DEBUG|CRITICAL) \d\d-\d\d [\d:.]+ \[[^\]]*\]\s?")

ReadLines = Callable[[int, int], Iterable[tuple[str, int]]]


def crash_line(document: Mapping[str, Any], read_lines: ReadLines | None = None) -> int | None:
    """The crash's line of a parsed document (None without a crash).

    Documents since `crash.exception_line` existed carry it. For an older one, `read_lines(first, count)`
    (the log viewer's index) lets the exception line be found below the traceback head; without it the
    head is the answer."""
    crash = document.get("crash")
    if not isinstance(crash, Mapping) or not isinstance(crash.get("line"), int):
        return None
    if isinstance(crash.get("exception_line"), int):
        return int(crash["exception_line"])
    head = int(crash["line"])
    exception = str(crash.get("exception") or "").strip()
    if not exception or read_lines is None:
        return head
    short = re.escape(exception.rsplit(".", 1)[-1])
    for offset, (text, _length) in enumerate(read_lines(head, EXCEPTION_SEARCH_LINES)):
        body = _VLLM_LEVEL.sub("", _PREFIX.sub("", text)).strip()
        if body.startswith(("File ", "Traceback")):
            continue
        if re.search(rf"(?:^|[\s.]){short}(?::|$)", body):
            return head + offset
    return head

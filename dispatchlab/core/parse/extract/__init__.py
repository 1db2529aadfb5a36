"""Extractors: each owns its line rules and turns their hits into Observations, nothing more.

An extractor has `RULES` (name -> regex over a line's message, prefix stripped), `READS` (rules of other
extractors it also wants to see) and `handle(line, hits, following)`. Rules must never match the routine
high-volume lines (batch statistics, access log); tests/core/test_scanner.py checks that.
"""

from __future__ import annotations

import re
from typing import ClassVar, Protocol

from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.observations import Observations

Hits = dict[str, re.Match[str]]


class Extractor(Protocol):
    RULES: ClassVar[dict[str, str]]
    READS: ClassVar[frozenset[str]]

    def __init__(self, obs: Observations) -> None: ...

    def handle(self, line: Line, hits: Hits, following: bytes) -> bool:
        """Record what the line says; True when the line is fully explained (no other extractor runs)."""
        ...


def group(match: re.Match[str], *names: str) -> str | None:
    """The first of several alternative groups that matched."""
    return next((value for name in names if (value := match.group(name)) is not None), None)

"""From raw log bytes to a ParsedLog, in three named stages.

1. scan (`scan.py`, `chunkscan.py`, `parallelscan.py`, `scanner.py`): one pass over the bytes; a multi-pattern prefilter
   finds the few interesting lines; their rule hits go to
2. the extractors (`extract/`): arguments, environment, milestones, backends, failures, metrics; each
   owns its rules and only appends to one `Observations` record;
3. interpret (`interpret/`): pure functions from Observations to the typed `ParsedLog` (server, GPU,
   backends main and draft, crash, phases, outcome).

Matching (`dispatchlab.core.matching`) then takes the ParsedLog; its patterns join the scan through
`ExtraPatterns`. Importing this package is cheap: the stages load on the first parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dispatchlab.core.parse.extra import NO_EXTRA_PATTERNS, ExtraPatterns
from dispatchlab.core.parse.vocabulary import ProgressCallback

if TYPE_CHECKING:
    from dispatchlab.core.lineindex import LineIndexWriter
    from dispatchlab.core.parse.model import ParsedLog
    from dispatchlab.core.reading import Source

__all__ = ["ExtraPatterns", "ProgressCallback", "parse_sources"]


def parse_sources(
    sources: Sequence[Source],
    *,
    progress: ProgressCallback | None = None,
    extra: ExtraPatterns = NO_EXTRA_PATTERNS,
    index: LineIndexWriter | None = None,
) -> ParsedLog:
    """Parse one or several logs (several sources make one document, in the given order); with `index`,
    the same pass writes the text copy and line index the log viewer pages through."""
    from dispatchlab.core.parse.interpret import interpret
    from dispatchlab.core.parse.rules import compiled_rules
    from dispatchlab.core.parse.sources import scan_sources

    return interpret(scan_sources(sources, compiled_rules(extra), progress, index))

"""How callers add their own patterns to the scan (the knowledge base does), without the parser knowing why."""

from __future__ import annotations

from dispatchlab.core.parse.vocabulary import MAX_HITS_PER_PATTERN
from dispatchlab.core.records import record


@record(frozen=True)
class ExtraPatterns:
    """Regexes reported line by line: hits land in `ParsedLog.pattern_hits` by index, at most `max_hits`
    each. Argument dumps never count as a hit (every flag name is in them)."""

    patterns: tuple[str, ...] = ()
    max_hits: int = MAX_HITS_PER_PATTERN


NO_EXTRA_PATTERNS = ExtraPatterns()

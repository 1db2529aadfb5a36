"""Finding the few interesting lines of a big log fast.

Every rule is a Python regex over a line's message. With Hyperscan installed, all rules are compiled into
one database (prefilter mode, anchors dropped, so its hits are a superset) and scanned over each 16 MiB chunk;
Python then confirms only the rules that hit, on only the lines they hit. Rules that a big log's scan reads
only in some stretches (`sampled`: see chunkscan.sampled_stretch) have a database of their own. A rule whose own form is slow for
Hyperscan (no literal to look for: twelve words in a row) may give a gate instead: a cheaper expression that
matches every line the rule matches, scanned in its place (tests/core/test_scanner_gates.py checks it). Without Hyperscan, the fallback skips
the high-volume routine lines with one anchored match and tries every rule on the rest. Both give the same
answer: the routine lines never match a rule (tests/core/test_scanner.py checks that).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from dispatchlab.core import compiledre
from dispatchlab.core.cache import cache_path, read_cached, write_cached
from dispatchlab.core.lazyre import lazy_compile

try:  # optional accelerator: `pip install dispatchlab[fast]`
    import hyperscan as _hs
except ImportError:  # pragma: no cover - exercised by DISPATCHLAB_NO_HYPERSCAN in tests
    _hs = None  # type: ignore[assignment]

# Routine lines (batch statistics, access log, health checks): about 97% of a serving log.
ROUTINE = lazy_compile(
    rb"(?:\S+\s+\|\s)?(?:\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\] )?"
    rb"(?:Decode batch|Prefill batch|INFO:\s+[\d.:a-f\[\]]+ - \"(?:GET|POST) \S+ HTTP/1\.1\" 200|"
    rb"(?:\([\w ]+=?\d* ?pid=\d+\) )?INFO \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[loggers\.py:\d+\] Engine \d+: Avg)"
)

_NAMED_GROUP = lazy_compile(r"\(\?P<\w+>")
_INLINE_FLAGS = lazy_compile(r"^\(\?([aiLmsux]+)\)")
_DOLLAR = lazy_compile(r"(?<!\\)\$")


# bump when _to_hyperscan changes: cached databases built by the old translation are then ignored
_TRANSLATION = 4


def _to_hyperscan(pattern: str) -> tuple[bytes, int]:
    flags = 0
    m = _INLINE_FLAGS.match(pattern)
    if m:
        if "i" in m.group(1):
            flags |= _hs.HS_FLAG_CASELESS if _hs else 0
        pattern = pattern[m.end() :]
    pattern = _NAMED_GROUP.sub("(", pattern)
    pattern = pattern.replace("(?:", "(")
    if pattern.startswith("^"):
        pattern = pattern[1:]
    # \Z and $ at the end mean end of line here (the scan is multi-line)
    pattern = re.sub(r"\\Z$", "$", pattern)
    # run on to the end of the line: the same lines match, and each reports one end there instead of one per
    # byte of a trailing `\S{22,}` or `.*` (millions of Python callbacks on a crash loop's frames)
    if not _DOLLAR.search(pattern):  # Hyperscan takes no `$` before more pattern; those end there already
        pattern = f"({pattern})" + r"[^\n]*$"
    return pattern.encode("utf-8"), flags


def hyperscan_enabled() -> bool:
    return _hs is not None and not os.environ.get("DISPATCHLAB_NO_HYPERSCAN")


class Scanner:
    """Maps a line-aligned chunk to {line_start_offset: set(rule ids)} for the lines any rule may match."""

    def __init__(
        self, patterns: Sequence[str], gates: Sequence[str | None] = (), sampled: Sequence[int] = ()
    ) -> None:
        self.patterns = list(patterns)
        # per pattern: what Hyperscan scans in its place (None: the pattern itself)
        self.gates = [*gates, *[None] * (len(self.patterns) - len(gates))]
        # patterns a big log's scan may leave out of some chunks (`lines(chunk, sampled=False)`): their own
        # Hyperscan database, scanned only where asked
        self.sampled = sorted(set(sampled))
        self._compiled: list[re.Pattern[str] | None] = [None] * len(self.patterns)
        self.db: Any = None
        self.sampled_db: Any = None
        self._sampled_set = frozenset(self.sampled)
        self._unsampled = tuple(i for i in range(len(self.patterns)) if i not in self._sampled_set)
        self.python_only: list[int] = []
        self.accelerated = hyperscan_enabled()
        if self.accelerated:
            self.db = self._database(list(self._unsampled))
            self.sampled_db = self._database(self.sampled)

    def regex(self, index: int) -> re.Pattern[str]:
        """The Python regex of one pattern, compiled on first use (most never hit a given log)."""
        compiled = self._compiled[index]
        if compiled is None:
            compiled = self._compiled[index] = compiledre.compile(self.patterns[index])
        return compiled

    def _database(self, indices: list[int]) -> Any:
        """The Hyperscan database of these patterns (cached on disk); a pattern it cannot take is left to
        Python (`python_only`)."""
        assert _hs is not None
        if not indices:
            return None
        # keyed by the patterns as given: a warm start translates none of them
        key = (getattr(_hs, "__version__", ""), _TRANSLATION, self.patterns, self.gates, indices)
        cached = cache_path("hs", key, ".db")
        stored = read_cached(cached)
        if stored is not None:
            try:
                db = _hs.loadb(stored, _hs.HS_MODE_BLOCK)
                db.scratch = _hs.Scratch(db)  # a loaded database has no scratch space of its own
                return db
            except Exception:  # a stale or foreign cache file: rebuild it
                pass
        base = _hs.HS_FLAG_MULTILINE | _hs.HS_FLAG_PREFILTER | _hs.HS_FLAG_ALLOWEMPTY
        entries = []
        for index in indices:
            expression, extra = _to_hyperscan(self.gates[index] or self.patterns[index])
            entries.append((expression, index, base | extra))
        try:
            db = self._build(entries)
            write_cached(cached, _hs.dumpb(db))
            return db
        except Exception:  # a pattern Hyperscan cannot take: find it below and keep it in Python
            pass
        accepted = []
        for entry in entries:
            try:
                self._build([entry])
                accepted.append(entry)
            except Exception:
                self.python_only.append(entry[1])
        return self._build(accepted) if accepted else None

    @staticmethod
    def _build(entries: list[tuple[bytes, int, int]]) -> Any:
        assert _hs is not None
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        db.compile(
            expressions=[e[0] for e in entries],
            ids=[e[1] for e in entries],
            flags=[e[2] for e in entries],
            elements=len(entries),
        )
        return db

    def candidates(self, chunk: bytes, sampled: bool = True) -> dict[int, set[int] | None]:
        """Line starts -> rule ids that may match there (None: try every rule); without the sampled patterns
        when `sampled` is False."""
        if not self.accelerated:
            return self._fallback(chunk, sampled)
        hits: dict[int, set[int] | None] = {}
        ends: list[tuple[int, int]] = []

        def on_match(rule: int, start: int, end: int, flags: int, context: object) -> None:
            ends.append((end, rule))

        databases = self._databases(sampled)
        for db in databases:
            db.scan(chunk, match_event_handler=on_match)
        if len(databases) > 1:
            ends.sort()
        rfind = chunk.rfind
        last_line_end = -1
        last_start = 0
        for end, rule in ends:
            if end <= last_line_end and end > last_start:
                start = last_start
            else:
                start = rfind(b"\n", 0, end) + 1
                if end > start and chunk[end - 1 : end] == b"\n":
                    start = rfind(b"\n", 0, end - 1) + 1
                last_start = start
                nl = chunk.find(b"\n", start)
                last_line_end = nl if nl >= 0 else len(chunk)
            bucket = hits.get(start)
            if bucket is None:
                hits[start] = {rule}
            else:
                bucket.add(rule)
        python_only = [i for i in self.python_only if sampled or i not in self._sampled_set]
        if python_only:
            for start in self._fallback(chunk, sampled):
                current = hits.get(start)
                if current is None:
                    hits[start] = set(python_only)
                else:
                    current.update(python_only)
        return hits

    def _databases(self, sampled: bool) -> list[Any]:
        dbs = [self.db] if self.db is not None else []
        if sampled and self.sampled_db is not None:
            dbs.append(self.sampled_db)
        return dbs

    def lines(self, chunk: bytes, sampled: bool = True) -> tuple[list[int], list[tuple[int, ...] | None]]:
        """`candidates` in file order, as (line starts, rule ids per line: sorted, None for every rule); the
        scan's hot path (one small int per Hyperscan match, no set per line)."""
        if not self.accelerated or self.python_only:
            found = self.candidates(chunk, sampled)
            ordered = sorted(found)
            return ordered, [None if found[s] is None else tuple(sorted(found[s] or ())) for s in ordered]
        packed: list[int] = []
        push = packed.append

        def on_match(rule: int, start: int, end: int, flags: int, context: object) -> None:
            push(end << 16 | rule)

        databases = self._databases(sampled)
        for db in databases:
            db.scan(chunk, match_event_handler=on_match)
        if len(databases) > 1:
            packed.sort()  # two sorted runs: one merge
        starts: list[int] = []
        rule_sets: list[tuple[int, ...] | None] = []
        rfind, find = chunk.rfind, chunk.find
        line_start, line_end = -1, -1
        current: list[int] = []
        for value in packed:  # in the order of their ends: a line's matches come together
            end, rule = value >> 16, value & 0xFFFF
            if not (line_start < end <= line_end):
                start = rfind(b"\n", 0, end) + 1
                if start != line_start:
                    if current:
                        rule_sets.append((current[0],) if len(current) == 1 else tuple(sorted(set(current))))
                    nl = find(b"\n", start)
                    line_start, line_end = start, nl if nl >= 0 else len(chunk)
                    starts.append(start)
                    current = []
            current.append(rule)
        if current:
            rule_sets.append((current[0],) if len(current) == 1 else tuple(sorted(set(current))))
        return starts, rule_sets

    def _fallback(self, chunk: bytes, sampled: bool = True) -> dict[int, set[int] | None]:
        hits: dict[int, set[int] | None] = {}
        rules = None if sampled or not self.sampled else self._unsampled
        routine = ROUTINE.match
        position = 0
        size = len(chunk)
        find = chunk.find
        while position < size:
            end = find(b"\n", position)
            if end < 0:
                end = size
            if end > position and not routine(chunk, position):
                hits[position] = None if rules is None else set(rules)
            position = end + 1
        return hits

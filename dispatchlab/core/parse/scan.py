"""The scan stage: one pass over the bytes, multi-pattern prefiltered, rule hits handed to the extractors.

Big plain files are scanned by forked workers over line-aligned segments (chunkscan); every other source
chunk by chunk here. Either way the hits arrive in file order and go to the extractors, which append to one
Observations record.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path

from dispatchlab.core.lineindex import LineIndexWriter
from dispatchlab.core.parse.chunkscan import ChunkScan, parallel_workers, scan_chunk, scan_file_in_parallel
from dispatchlab.core.parse.extra import ExtraPatterns
from dispatchlab.core.parse.extract import Extractor, Hits
from dispatchlab.core.parse.extract.arguments import Arguments
from dispatchlab.core.parse.extract.backends import Backends
from dispatchlab.core.parse.extract.environment import Environment
from dispatchlab.core.parse.extract.failures import Failures
from dispatchlab.core.parse.extract.generated import Generated
from dispatchlab.core.parse.extract.metrics import Metrics
from dispatchlab.core.parse.extract.milestones import Milestones
from dispatchlab.core.parse.lineformat import Line, split_line
from dispatchlab.core.parse.model import PatternHit
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.parse.scanner import Scanner
from dispatchlab.core.parse.vocabulary import (
    MAX_MESSAGE,
    METRIC_POINTS_TARGET,
    ProgressCallback,
)
from dispatchlab.core.reading import Source, decode_line, iter_chunks

# the order extractors see a line in: arguments first (a dump line is nothing else), failures last
EXTRACTORS: tuple[type[Extractor], ...] = (Arguments, Environment, Milestones, Backends, Generated, Failures)
RULES: dict[str, str] = {name: rule for cls in EXTRACTORS for name, rule in cls.RULES.items()}
PARALLEL_MIN_BYTES = 8 * 1024 * 1024
TAIL_BYTES = 6000
_DUMP_MARKS = ("server_args=ServerArgs(", "non-default args:", "with config:")


class CompiledRules:
    """The rules of every extractor plus the extra patterns, in one multi-pattern scanner."""

    def __init__(self, extra: ExtraPatterns) -> None:
        self.names = list(RULES)
        self.extra = extra
        self.scanner = Scanner([*RULES.values(), *extra.patterns])
        self.rule_count = len(self.names)


@lru_cache(maxsize=8)
def compiled_rules(extra: ExtraPatterns) -> CompiledRules:
    # compiling the multi-pattern database takes a moment: reuse it across logs (workers parse many)
    return CompiledRules(extra)


class Scan:
    """One parse's pass: chunk scans in, Observations out."""

    def __init__(self, rules: CompiledRules, stride: int, index: LineIndexWriter | None = None) -> None:
        self.rules = rules
        self.index = index
        self.stride = stride
        self.next_sample = 0
        self.last_process: str | None = None  # the rank of the last prefixed line: bare lines belong to it
        self.obs = Observations()
        self.metrics = Metrics(self.obs)
        made = {cls: cls(self.obs) for cls in EXTRACTORS}
        failures = made[Failures]
        assert isinstance(failures, Failures)
        self.failures = failures  # it closes the tracebacks still open at the end
        self.extractors = [(e, frozenset(e.RULES) | e.READS) for e in made.values()]

    def chunks(self, source: Source) -> Iterator[ChunkScan]:
        for chunk in iter_chunks(source):
            scan = scan_chunk(
                self.rules.scanner, chunk, self.stride, self.next_sample, checkpoints=bool(self.index)
            )
            self.next_sample = scan.next_sample
            if self.index is not None:
                self.index.add_text(chunk)
            self.obs.tail = (self.obs.tail + chunk[-TAIL_BYTES:])[-TAIL_BYTES:]
            yield scan

    def feed(self, scan: ChunkScan) -> None:
        obs = self.obs
        base = obs.line_count
        samples = scan.samples
        si = 0
        for hit in scan.hits:
            while si < len(samples) and samples[si][0] < hit.index:
                self.metrics.sample(samples[si][1], base + samples[si][0] + 1)
                si += 1
            if hit.previous:
                # "[ts] Tokenizer init failed:" then a bare traceback: it belongs to that process
                self._note_process(split_line(base + hit.index, decode_line(hit.previous), obs.year))
            self._line(hit.raw, base + hit.index + 1, hit.rules, hit.following)
        for index, raw in samples[si:]:
            self.metrics.sample(raw, base + index + 1)
        obs.line_count += scan.lines
        obs.metric_total += scan.metric_lines
        while len(obs.metric_points) > 2 * METRIC_POINTS_TARGET:
            # the log is bigger than its stored size said (compressed, stdin): halve the resolution
            obs.metric_points = obs.metric_points[::2]
            self.stride *= 2

    def _line(self, raw: bytes, number: int, rule_ids: tuple[int, ...] | None, following: bytes) -> None:
        obs = self.obs
        line = split_line(number, decode_line(raw), obs.year)
        if not line.prefixed:
            line.rank = self.last_process  # a bare line belongs to the process printing around it
        if line.time:
            if line.style == "sglang" and obs.year is None:
                obs.year = line.time[:4]
            obs.last_time = line.time
        self._note_process(line)
        if line.style == "trtllm":
            obs.server_votes["tensorrt_llm"] += 3
        elif line.style in ("sglang", "vllm"):
            obs.server_votes[line.style] += 1
        hits = self._hits(line, rule_ids)
        if hits:
            for extractor, wants in self.extractors:
                if not wants.isdisjoint(hits) and extractor.handle(line, hits, following):
                    break

    def _note_process(self, line: Line) -> None:
        if line.prefixed:
            self.last_process = line.rank

    def _hits(self, line: Line, rule_ids: tuple[int, ...] | None) -> Hits:
        regex = self.rules.scanner.regex
        names = self.rules.names
        base = self.rules.rule_count
        hits: Hits = {}
        for rule in range(len(self.rules.scanner.patterns)) if rule_ids is None else rule_ids:
            m = regex(rule).search(line.msg)
            if m is None:
                continue
            if rule >= base:
                self._extra_hit(rule - base, line, m)
            else:
                hits[names[rule]] = m
        return hits

    def _extra_hit(self, index: int, line: Line, m: re.Match[str]) -> None:
        if any(mark in line.msg for mark in _DUMP_MARKS):
            return
        hits = self.obs.pattern_hits.setdefault(index, [])
        if len(hits) < self.rules.extra.max_hits:
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            hits.append(PatternHit(line.number, line.rank, line.msg[:MAX_MESSAGE], groups))

    def finish(self) -> Observations:
        self.failures.finish()
        return self.obs


def _scans_of(run: Scan, source: Source) -> Iterable[ChunkScan]:
    """A big plain file is scanned by forked workers, segment by segment; anything else here, chunk by chunk."""
    path, size = source.path, source.stored_bytes or 0
    if path is not None and size >= PARALLEL_MIN_BYTES:
        workers = parallel_workers()
        if workers > 1:
            index = run.index
            parts, done = (index.parts_dir(), index.add_file) if index is not None else (None, None)
            return scan_file_in_parallel(
                run.rules.scanner, path, size, run.stride, workers, text_parts=parts, text_done=done
            )
    return run.chunks(source)


def _file_tail(path: Path, size: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(max(0, size - TAIL_BYTES))
        return handle.read(TAIL_BYTES)


def scan_sources(
    sources: Sequence[Source],
    rules: CompiledRules,
    progress: ProgressCallback | None = None,
    index: LineIndexWriter | None = None,
) -> Observations:
    """One pass over the sources; with `index`, the text copy and line index are written on the way."""
    total: int | None = sum(s.stored_bytes or 0 for s in sources) or None
    if total and any(s.stored_bytes is None for s in sources):
        total = None
    run = Scan(rules, max(1, (total or 256 * METRIC_POINTS_TARGET) // METRIC_POINTS_TARGET), index)
    done = 0
    for source in sources:
        first = run.obs.line_count + 1
        for scan in _scans_of(run, source):
            if index is not None:
                index.add_checkpoints(scan.checkpoints, scan.lines, scan.size)
            run.feed(scan)
            if progress is not None:
                done = min(done + scan.size, total) if total else done + scan.size
                progress(done, total)
        if source.path is not None and (source.stored_bytes or 0) >= PARALLEL_MIN_BYTES:
            run.obs.tail = _file_tail(source.path, source.stored_bytes or 0)  # scanned in parallel, not here
        lines = run.obs.line_count - first + 1
        run.obs.sources.append({"name": source.name, "first_line": first, "line_count": lines})
    return run.finish()

"""The per-chunk work of a parse that needs no parser state: which lines may match which rules, the
sampled batch-statistics lines, the line count. It runs in the parsing process, or for big plain files
in worker processes over line-aligned segments (one per core), so gigabyte logs parse at grep speed."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dispatchlab.core.parse.scanner import Scanner
from dispatchlab.core.reading import CHUNK_BYTES, MAX_PARSED_LINE_BYTES, normalise_chunk

STAT_NEEDLES = (b"Decode batch", b"Avg prompt throughput", b"Prefill batch")
COUNTED_NEEDLES = STAT_NEEDLES[:2]  # decode-side statistics lines: the series' total
CONTINUED = (
    b"ServerArgs(",
    b"server_args={",
    b"launch_server",
    b"sglang serve",
    b"vllm serve",
    b"api_server",
)
FOLLOWING_LINES = 400
FOLLOWING_BYTES = 512 * 1024
SEGMENT_BYTES = 64 * 1024 * 1024


@dataclass
class Hit:
    index: int  # 0-based line index within the chunk
    raw: bytes  # the line (at most MAX_PARSED_LINE_BYTES)
    rules: tuple[int, ...] | None  # rule ids that may match; None: try every rule
    following: bytes  # the lines after it, for a dump or command that continues (else empty)
    previous: bytes = b""  # the line before a bare "Traceback": whose process printed it


@dataclass
class ChunkScan:
    size: int
    lines: int
    hits: list[Hit]
    samples: list[tuple[int, bytes]]  # (line index, line) of sampled batch-statistics lines
    metric_lines: int
    next_sample: int  # how far into the next chunk the sampling stride reaches


def _line_at(chunk: bytes, start: int) -> bytes:
    end = chunk.find(b"\n", start)
    end = len(chunk) if end < 0 else end
    return chunk[start : min(end, start + MAX_PARSED_LINE_BYTES)]


def _following(chunk: bytes, start: int) -> bytes:
    begin = chunk.find(b"\n", start) + 1
    if begin <= 0:
        return b""
    end = begin
    for _ in range(FOLLOWING_LINES):
        nxt = chunk.find(b"\n", end)
        if nxt < 0 or nxt - begin > FOLLOWING_BYTES:
            break
        end = nxt + 1
    return chunk[begin:end]


def _samples(chunk: bytes, stride: int, next_sample: int) -> tuple[list[int], int, int]:
    """At most one statistics line per `stride` bytes: (line starts, next_sample, statistics line count)."""
    out: list[int] = []
    position = max(0, next_sample)
    size = len(chunk)
    find = chunk.find
    upcoming = [find(n, position) for n in STAT_NEEDLES]
    present = [
        n
        for n, p in zip(COUNTED_NEEDLES, upcoming, strict=False)
        if p >= 0 or find(n, 0, position + len(n)) >= 0
    ]
    while True:
        live = [p for p in upcoming if p >= 0]
        if not live:
            break
        hit = min(live)
        start = chunk.rfind(b"\n", 0, hit) + 1
        out.append(start)
        position = max(hit + 1, start + stride)
        if position >= size:
            break
        upcoming = [
            find(n, position) if 0 <= p < position else p for n, p in zip(STAT_NEEDLES, upcoming, strict=True)
        ]
    # one counting pass: the server's own statistics line (SGLang decode, else vLLM), not both
    metric_lines = chunk.count(present[0]) if present else 0
    return out, (position - size if out else 0), metric_lines


def scan_chunk(scanner: Scanner, chunk: bytes, stride: int, next_sample: int) -> ChunkScan:
    candidates = scanner.candidates(chunk)
    sample_starts, next_sample, metric_lines = _samples(chunk, stride, next_sample)
    count = chunk.count
    hits: list[Hit] = []
    samples: list[tuple[int, bytes]] = []
    # walk candidate and sample offsets in order, counting newlines once between them
    events = sorted([(o, 0) for o in candidates] + [(o, 1) for o in sample_starts])
    index = 0
    cursor = 0
    for offset, kind in events:
        index += count(b"\n", cursor, offset)
        cursor = offset
        raw = _line_at(chunk, offset)
        if kind == 1:
            samples.append((index, raw))
            continue
        rules = candidates[offset]
        following = (
            _following(chunk, offset)
            if any(mark in raw for mark in CONTINUED) or raw.endswith(b"\\")
            else b""
        )
        previous = b""
        if raw.lstrip().startswith(b"Traceback") and offset > 0:
            previous = _line_at(chunk, chunk.rfind(b"\n", 0, offset - 1) + 1)
        hits.append(Hit(index, raw, tuple(sorted(rules)) if rules is not None else None, following, previous))
    lines = index + count(b"\n", cursor)
    return ChunkScan(len(chunk), lines, hits, samples, metric_lines, next_sample)


# ---------------------------------------------------------------- segments of a big plain file, in parallel
_WORKER_SCANNER: Scanner | None = None


def _segment_bounds(path: Path, size: int) -> list[tuple[int, int]]:
    bounds = [0]
    with path.open("rb") as handle:
        for nominal in range(SEGMENT_BYTES, size, SEGMENT_BYTES):
            handle.seek(nominal)
            tail = handle.read(1 << 20)
            newline = tail.find(b"\n")
            if newline < 0:
                continue
            cut = nominal + newline + 1
            if cut > bounds[-1] and cut < size:
                bounds.append(cut)
    bounds.append(size)
    return list(itertools.pairwise(bounds))


def _scan_segment(task: tuple[str, int, int, int]) -> list[ChunkScan]:
    path, start, end, stride = task
    assert _WORKER_SCANNER is not None
    scans: list[ChunkScan] = []
    next_sample = 0
    with open(path, "rb") as handle:
        handle.seek(start)
        remaining = end - start
        carry = b""
        while remaining > 0:
            block = handle.read(min(CHUNK_BYTES, remaining))
            if not block:
                break
            remaining -= len(block)
            cut = len(block) if remaining <= 0 else block.rfind(b"\n") + 1
            if cut == 0:
                carry += block
                continue
            # one copy at most: the carried partial line joined to the block up to its last newline
            chunk = (
                b"".join((carry, memoryview(block)[:cut]))
                if carry
                else block
                if cut == len(block)
                else block[:cut]
            )
            carry = block[cut:]
            if not chunk.endswith(b"\n"):
                chunk += b"\n"
            scan = scan_chunk(_WORKER_SCANNER, normalise_chunk(chunk), stride, next_sample)
            next_sample = scan.next_sample
            scans.append(scan)
        if carry:
            scans.append(scan_chunk(_WORKER_SCANNER, normalise_chunk(carry + b"\n"), stride, next_sample))
    return scans


def parallel_workers() -> int:
    import multiprocessing  # not at import time: the one-line log of a CLI call never needs it

    configured = os.environ.get("DISPATCHLAB_PARSE_WORKERS")
    if configured:
        return max(1, int(configured))
    if multiprocessing.current_process().daemon or "fork" not in multiprocessing.get_all_start_methods():
        return 1  # inside a daemonic pool process (a Celery prefork child): no grandchildren
    return min(os.cpu_count() or 1, 8)


def scan_file_in_parallel(
    scanner: Scanner, path: Path, size: int, stride: int, workers: int
) -> Iterator[ChunkScan]:
    """ChunkScans of a plain file, in file order, computed by `workers` forked processes."""
    import multiprocessing

    global _WORKER_SCANNER
    _WORKER_SCANNER = scanner  # inherited by the forked workers: no recompiling
    tasks = [(str(path), start, end, stride) for start, end in _segment_bounds(path, size)]
    context = multiprocessing.get_context("fork")
    with context.Pool(processes=workers) as pool:
        for scans in pool.imap(_scan_segment, tasks, chunksize=1):
            yield from scans

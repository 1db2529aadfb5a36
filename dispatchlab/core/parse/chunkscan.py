"""The per-chunk work of a parse that needs no parser state: which lines may match which rules, the
sampled batch-statistics lines, the line count. It runs in the parsing process, or for big plain files
in worker processes over line-aligned segments (one per core), so gigabyte logs parse at grep speed."""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from dispatchlab.core.lineindex import chunk_checkpoints
from dispatchlab.core.parse.scanner import Scanner
from dispatchlab.core.reading import MAX_LINE_BYTES, MAX_PARSED_LINE_BYTES, normalise_chunk, rest_of_long_line

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
    checkpoints: list[tuple[int, int]] = field(
        default_factory=list
    )  # (line index, offset) for the line index


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
        end = find(b"\n", hit)  # one sample per line, however many statistics a long line holds
        position = max(hit + 1, start + stride, size if end < 0 else end + 1)
        if position >= size:
            break
        upcoming = [
            find(n, position) if 0 <= p < position else p for n, p in zip(STAT_NEEDLES, upcoming, strict=True)
        ]
    # one counting pass: the server's own statistics line (SGLang decode, else vLLM), not both
    metric_lines = chunk.count(present[0]) if present else 0
    return out, (position - size if out else 0), metric_lines


def scan_chunk(
    scanner: Scanner, chunk: bytes, stride: int, next_sample: int, *, checkpoints: bool = False
) -> ChunkScan:
    candidates = scanner.candidates(chunk)
    sample_starts, next_sample, metric_lines = _samples(chunk, stride, next_sample)
    count = chunk.count
    hits: list[Hit] = []
    samples: list[tuple[int, bytes]] = []
    marks: list[tuple[int, int]] = []
    # walk candidate, sample and checkpoint offsets in order, counting newlines once between them
    events = [(o, 0) for o in candidates] + [(o, 1) for o in sample_starts]
    if checkpoints:
        events += [(o, 2) for o in chunk_checkpoints(chunk)]
    events.sort()
    index = 0
    cursor = 0
    for offset, kind in events:
        index += count(b"\n", cursor, offset)
        cursor = offset
        if kind == 2:
            marks.append((index, offset))
            continue
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
    return ChunkScan(len(chunk), lines, hits, samples, metric_lines, next_sample, marks)


# ---------------------------------------------------------------- segments of a big plain file, in parallel
MIN_SEGMENT_BYTES = 8 * 1024 * 1024
WORKER_CHUNK_BYTES = 4 * 1024 * 1024  # small chunks keep each worker's memory flat


def _segment_bounds(path: Path, size: int, workers: int) -> list[tuple[int, int]]:
    """Line-aligned (start, end) pieces, a few per worker so that none waits on a slow one."""
    step = max(MIN_SEGMENT_BYTES, min(SEGMENT_BYTES, size // (workers * 4) + 1))
    bounds = [0]
    with path.open("rb") as handle:
        for nominal in range(step, size, step):
            handle.seek(nominal)
            newline = handle.read(1 << 20).find(b"\n")
            if newline < 0:
                continue
            cut = nominal + newline + 1
            if bounds[-1] < cut < size:
                bounds.append(cut)
    bounds.append(size)
    return list(itertools.pairwise(bounds))


def _chunks_between(handle: BinaryIO, start: int, end: int) -> Iterator[bytes]:
    """Normalised, newline-terminated chunks of bytes [start, end) of an open file."""
    handle.seek(start)
    remaining = end - start
    carry = b""
    overlong = False
    while remaining > 0:
        block = handle.read(min(WORKER_CHUNK_BYTES, remaining))
        if not block:
            break
        remaining -= len(block)
        if overlong:  # the rest of a line past MAX_LINE_BYTES is dropped, as iter_chunks drops it
            block, overlong = rest_of_long_line(block)
            if overlong:
                continue
        cut = len(block) if remaining <= 0 else block.rfind(b"\n") + 1
        if cut == 0:
            carry += block
            if len(carry) >= MAX_LINE_BYTES:
                carry, overlong = carry[:MAX_LINE_BYTES], True
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
        yield normalise_chunk(chunk if chunk.endswith(b"\n") else chunk + b"\n")
    if carry:
        yield normalise_chunk(carry + b"\n")


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    text: Path | None  # where to write its normalised text, for the line index


def scan_segment(scanner: Scanner, path: Path, segment: Segment, stride: int) -> list[ChunkScan]:
    scans: list[ChunkScan] = []
    next_sample = 0
    with path.open("rb") as handle, contextlib.ExitStack() as stack:
        text = stack.enter_context(segment.text.open("wb")) if segment.text else None
        for chunk in _chunks_between(handle, segment.start, segment.end):
            scan = scan_chunk(scanner, chunk, stride, next_sample, checkpoints=text is not None)
            next_sample = scan.next_sample
            scans.append(scan)
            if text is not None:
                text.write(chunk)
    return scans


def parallel_workers() -> int:
    configured = os.environ.get("DISPATCHLAB_PARSE_WORKERS")
    if configured:
        return max(1, int(configured))
    if not hasattr(os, "fork"):
        return 1
    return min(os.cpu_count() or 1, 8)


def _keep_freed_memory() -> None:
    """glibc hands big freed buffers back to the kernel and faults them in again for the next chunk; a
    scan worker reuses them instead (its memory stays a few chunks' worth)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024 * 1024)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 256 * 1024 * 1024)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass  # not glibc: the default allocator is fine, only slower


def _worker(scanner: Scanner, path: Path, segments: list[Segment], stride: int, out: BinaryIO) -> None:
    _keep_freed_memory()
    for segment in segments:
        pickle.dump(scan_segment(scanner, path, segment, stride), out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()


def _die_with_parent(parent: int) -> None:
    """A parse killed with SIGKILL takes its scan workers along: left running they would write parts of
    the text copy into a folder the resumed parse is clearing, and hold the CPU it needs."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)


def _fork_worker(scanner: Scanner, path: Path, segments: list[Segment], stride: int) -> tuple[int, BinaryIO]:
    read_end, write_end = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: scan, send, and leave without running the parent's cleanup
        os.close(read_end)
        _die_with_parent(parent)
        code = 0
        try:
            with os.fdopen(write_end, "wb") as out:
                _worker(scanner, path, segments, stride, out)
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(write_end)
    return pid, os.fdopen(read_end, "rb")


def scan_file_in_parallel(
    scanner: Scanner,
    path: Path,
    size: int,
    stride: int,
    workers: int,
    *,
    text_parts: Path | None = None,
    text_done: Callable[[Path], None] | None = None,
) -> Iterator[ChunkScan]:
    """ChunkScans of a plain file, in file order, computed by `workers` forked processes.

    Plain os.fork, not multiprocessing: a Celery prefork child is a daemon, which may not have children
    of multiprocessing's own, and the warm worker should parse as fast as the command line. Worker w scans
    segments w, w + workers, ...; results come back through a pipe each, read in file order."""
    bounds = _segment_bounds(path, size, workers)
    segments = [
        Segment(a, b, text_parts / f"part-{i}" if text_parts else None) for i, (a, b) in enumerate(bounds)
    ]
    workers = min(workers, len(segments))
    children = [_fork_worker(scanner, path, segments[w::workers], stride) for w in range(workers)]
    try:
        for index in range(len(segments)):
            try:
                scans: list[ChunkScan] = pickle.load(children[index % workers][1])
            except EOFError:
                raise RuntimeError(f"a scan worker stopped before finishing {path.name}") from None
            yield from scans
            part = segments[index].text
            if part is not None and text_done is not None:
                text_done(part)  # written whole before its scans were sent
    finally:
        for pid, reader in children:
            reader.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

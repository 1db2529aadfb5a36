"""The per-chunk work of a parse that needs no parser state: which lines may match which rules, the
sampled batch-statistics lines, the line count. It runs in the parsing process, or for big plain files
in worker processes over line-aligned segments (one per core), so gigabyte logs parse at grep speed."""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import queue
import re
import signal
import sys
import threading
import traceback
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from dispatchlab.core.lineindex import chunk_checkpoints
from dispatchlab.core.parse.scanner import Scanner
from dispatchlab.core.reading import MAX_LINE_BYTES, MAX_PARSED_LINE_BYTES, normalise_chunk, rest_of_long_line

STAT_NEEDLES = (b"Decode batch", b"Avg prompt throughput", b"Prefill batch")
COUNTED_NEEDLES = STAT_NEEDLES[:2]  # decode-side statistics lines: the series' total
# what makes a line one whose dump or command may continue on the next lines
_CONTINUED = re.compile(rb"ServerArgs\(|server_args=\{|launch_server|sglang serve|vllm serve|api_server")
_DIGITS = b"0123456789"
FOLLOWING_LINES = 400
FOLLOWING_BYTES = 512 * 1024
SEGMENT_BYTES = 16 * 1024 * 1024  # what one worker runs ahead: its results wait in memory


@dataclass
class Hit:
    index: int  # 0-based line index within the chunk
    raw: bytes  # the line (at most MAX_PARSED_LINE_BYTES)
    rules: tuple[int, ...] | None  # rule ids that may match; None: try every rule
    following: bytes  # the lines after it, for a dump or command that continues (else empty)
    previous: bytes = b""  # the line before a bare "Traceback": whose process printed it
    key: int = 0  # the line's shape: its text without digits, its rules, its distance from the hit before
    # (equal keys over a run's lines: the same run again)


@dataclass
class ChunkScan:
    """A chunk's hits as columns (one object per hit costs more to pickle than to scan a line)."""

    size: int
    lines: int
    hit_lines: array[int]  # 0-based line index within the chunk, per hit
    hit_keys: array[int]  # per hit: see Hit.key; equal runs of keys are the same lines again
    hit_ends: array[int]  # where each hit's line ends in `hit_text`
    hit_text: bytes
    hit_rules: array[int]  # per hit: an index into `rule_sets`
    rule_sets: list[tuple[int, ...] | None]
    context: dict[int, tuple[bytes, bytes]]  # hit number -> (following, previous), for the few that have any
    first_content: int  # the first hit's key without its distance from the hit before (the parse adds it)
    samples: list[tuple[int, bytes]]  # (line index, line) of sampled batch-statistics lines
    metric_lines: int
    next_sample: int  # how far into the next chunk the sampling stride reaches
    checkpoints: list[tuple[int, int]] = field(
        default_factory=list
    )  # (line index, offset) for the line index

    def __len__(self) -> int:
        return len(self.hit_lines)

    def hit(self, number: int) -> Hit:
        start = self.hit_ends[number - 1] if number else 0
        following, previous = self.context.get(number, (b"", b""))
        return Hit(
            self.hit_lines[number],
            self.hit_text[start : self.hit_ends[number]],
            self.rule_sets[self.hit_rules[number]],
            following,
            previous,
            self.hit_keys[number],
        )


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


def _continues(raw: bytes) -> bool:
    """A command cut by a trailing backslash, or a dump whose brackets do not close on its line: the
    extractors read on into the following lines (a crash loop's complete dumps need none sent)."""
    if raw.endswith(b"\\") or (raw[-1:].isspace() and raw.rstrip().endswith(b"\\")):
        return True
    if _CONTINUED.search(raw) is None:
        return False
    count = raw.count
    return count(b"(") + count(b"[") + count(b"{") > count(b")") + count(b"]") + count(b"}")


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
    scanner: Scanner,
    chunk: bytes,
    stride: int,
    next_sample: int,
    *,
    checkpoints: bool = False,
) -> ChunkScan:
    starts, line_rules = scanner.lines(chunk)
    sample_starts, next_sample, metric_lines = _samples(chunk, stride, next_sample)
    count, find = chunk.count, chunk.find
    hit_lines: array[int] = array("q")
    hit_keys: array[int] = array("q")
    hit_ends: array[int] = array("q")
    hit_rules: array[int] = array("l")
    raws: list[bytes] = []
    rule_sets: dict[tuple[int, ...] | None, int] = {}
    context: dict[int, tuple[bytes, bytes]] = {}
    samples: list[tuple[int, bytes]] = []
    marks: list[tuple[int, int]] = []
    last_hit = -1
    first_content = 0
    text_length = 0
    # samples and checkpoints are few: walk the hits, taking the others as their offsets come
    others = [(o, 1) for o in sample_starts]
    if checkpoints:
        others += [(o, 2) for o in chunk_checkpoints(chunk)]
    others.sort()
    others.append((len(chunk) + 1, 0))
    other_at, other_kind = others[0]
    next_other = 1
    index = 0
    cursor = 0
    for offset, rules in zip(starts, line_rules, strict=True):
        while other_at <= offset:
            index += count(b"\n", cursor, other_at)
            cursor = other_at
            if other_kind == 2:
                marks.append((index, other_at))
            else:  # a statistics line (a rule may match it too: then it is a hit as well)
                samples.append((index, _line_at(chunk, other_at)))
            other_at, other_kind = others[next_other]
            next_other += 1
        index += count(b"\n", cursor, offset)
        cursor = offset
        end = find(b"\n", offset)
        raw = chunk[offset : min(len(chunk) if end < 0 else end, offset + MAX_PARSED_LINE_BYTES)]
        rule_set = rule_sets.get(rules)
        if rule_set is None:
            rule_set = rule_sets[rules] = len(rule_sets)
        shape: tuple[object, ...] = (raw.translate(None, _DIGITS), rules)
        following = _following(chunk, offset) if _continues(raw) else b""
        previous = b""
        if b"Traceback" in raw and offset > 0 and raw.lstrip().startswith(b"Traceback"):
            previous = _line_at(chunk, chunk.rfind(b"\n", 0, offset - 1) + 1)
        if following or previous:
            context[len(hit_lines)] = (following, previous)
            shape += (following.translate(None, _DIGITS), previous.translate(None, _DIGITS))
        if last_hit < 0:
            first_content = hash(shape)  # the parse knows how far the hit before it was
            hit_keys.append(0)
        else:
            hit_keys.append(hash((hash(shape), index - last_hit)))
        last_hit = index
        hit_lines.append(index)
        text_length += len(raw)
        hit_ends.append(text_length)
        hit_rules.append(rule_set)
        raws.append(raw)
    while other_kind:
        index += count(b"\n", cursor, other_at)
        cursor = other_at
        if other_kind == 2:
            marks.append((index, other_at))
        else:
            samples.append((index, _line_at(chunk, other_at)))
        other_at, other_kind = others[next_other]
        next_other += 1
    lines = index + count(b"\n", cursor)
    return ChunkScan(
        len(chunk),
        lines,
        hit_lines,
        hit_keys,
        hit_ends,
        b"".join(raws),
        hit_rules,
        list(rule_sets),
        context,
        first_content,
        samples,
        metric_lines,
        next_sample,
        marks,
    )


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


def scan_segment(scanner: Scanner, path: Path, segment: Segment, stride: int) -> Iterator[ChunkScan]:
    next_sample = 0
    with path.open("rb") as handle, contextlib.ExitStack() as stack:
        text = stack.enter_context(segment.text.open("wb")) if segment.text else None
        for chunk in _chunks_between(handle, segment.start, segment.end):
            scan = scan_chunk(scanner, chunk, stride, next_sample, checkpoints=text is not None)
            next_sample = scan.next_sample
            if text is not None:
                text.write(chunk)
            yield scan


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


_SEGMENT_END = b""
_QUEUED_SCANS = 6  # per worker: how far it may run ahead of the parse reading its results


def _send(out: BinaryIO, payload: bytes) -> None:
    out.write(len(payload).to_bytes(8, "little"))
    out.write(payload)


def _worker(scanner: Scanner, path: Path, segments: list[Segment], stride: int, out: BinaryIO) -> None:
    """Each chunk's scan is sent as soon as it is made (a segment's worth held at once took hundreds of MB
    on a crash loop); an empty message closes a segment, once its text part is written whole."""
    _keep_freed_memory()
    for segment in segments:
        for scan in scan_segment(scanner, path, segment, stride):
            _send(out, pickle.dumps(scan, protocol=pickle.HIGHEST_PROTOCOL))
        _send(out, _SEGMENT_END)
        out.flush()


def _read_exactly(reader: BinaryIO, size: int) -> bytes | None:
    data = reader.read(size)
    return data if len(data) == size else None


def _pump(reader: BinaryIO, into: queue.Queue[bytes | None], stop: threading.Event) -> None:
    """Moves one worker's messages from its pipe to a bounded queue: the worker ahead keeps scanning while
    the parse reads the one behind, and blocks when it is too far ahead (memory stays flat)."""
    message: bytes | None = b""
    while message is not None and not stop.is_set():
        header = _read_exactly(reader, 8)
        message = None if header is None else _read_exactly(reader, int.from_bytes(header, "little"))
        while not stop.is_set():
            try:
                into.put(message, timeout=0.1)
                break
            except queue.Full:
                continue


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
    stop = threading.Event()
    queues: list[queue.Queue[bytes | None]] = [queue.Queue(_QUEUED_SCANS) for _ in children]
    pumps = [
        threading.Thread(target=_pump, args=(reader, into, stop), daemon=True)
        for (_pid, reader), into in zip(children, queues, strict=True)
    ]
    for pump in pumps:
        pump.start()
    try:
        for index in range(len(segments)):
            messages = queues[index % workers]
            while True:
                message = messages.get()
                if message is None:
                    raise RuntimeError(f"a scan worker stopped before finishing {path.name}")
                if message == _SEGMENT_END:
                    break
                yield pickle.loads(message)
            part = segments[index].text
            if part is not None and text_done is not None:
                text_done(part)  # written whole before its segment's end was sent
    finally:
        stop.set()
        for pid, _reader in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for pump in pumps:
            pump.join()
        for _pid, reader in children:
            reader.close()

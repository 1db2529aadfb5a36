"""Big logs scanned in parallel: a plain file in line-aligned segments, one forked worker per core, and a
stream (a .gz) in pieces handed to forked workers; each worker runs chunkscan.scan_chunk and sends its
results back as they come, so the parse reads them in order with flat memory."""

from __future__ import annotations

import collections
import contextlib
import contextvars
import itertools
import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from dispatchlab.core.parse import chunkscan
from dispatchlab.core.parse.chunkscan import WORKER_CHUNK_BYTES, ChunkScan, reads_sampled, scan_chunk
from dispatchlab.core.parse.scanner import Scanner
from dispatchlab.core.reading import MAX_LINE_BYTES, normalise_chunk, rest_of_long_line
from dispatchlab.core.records import record

# ---------------------------------------------------------------- segments of a big plain file, in parallel


def _next_newline(handle: BinaryIO, offset: int, reach: int = 1 << 20) -> int:
    """The offset of the first newline at or after `offset` within `reach` bytes, or -1: read a little at a
    time (a megabyte read per cut was a tenth of a crash loop's parse)."""
    handle.seek(offset)
    piece = 64 * 1024
    for start in range(offset, offset + reach, piece):
        block = handle.read(piece)
        found = block.find(b"\n")
        if found >= 0:
            return start + found
        if len(block) < piece:
            break
    return -1


def _segment_bounds(path: Path, size: int) -> list[tuple[int, int]]:
    """Line-aligned (start, end) pieces, two per stretch of the log (chunkscan.SAMPLED_STRETCH_BYTES): the
    same whatever the number of workers, many per worker so that none waits on a slow one. The last is a whole
    step or more (a sliver of a few lines would be the last stretch read with the sampled rules)."""
    step = chunkscan.SAMPLED_STRETCH_BYTES // 2
    bounds = [0]
    with path.open("rb") as handle:
        for nominal in range(step, size - step + 1, step):
            newline = _next_newline(handle, nominal)
            if newline < 0:
                continue
            cut = newline + 1
            if bounds[-1] < cut < size:
                bounds.append(cut)
    bounds.append(size)
    return list(itertools.pairwise(bounds))


_SEGMENT_SLACK = 256 * 1024


def _chunks_between(handle: BinaryIO, start: int, end: int) -> Iterator[bytes]:
    """Normalised, newline-terminated chunks of bytes [start, end) of an open file."""
    handle.seek(start)
    remaining = end - start
    carry = b""
    overlong = False
    while remaining > 0:
        # a segment a little over a chunk (cut at the newline after its nominal end) is read whole: it ends a
        # line, so it is not copied to cut it, and no sliver of a few lines is scanned as a chunk of its own
        block = handle.read(
            remaining if remaining <= WORKER_CHUNK_BYTES + _SEGMENT_SLACK else WORKER_CHUNK_BYTES
        )
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
        block = b""
        yield normalise_chunk(chunk if chunk.endswith(b"\n") else chunk + b"\n")
        # nothing of this chunk is held while the next is read: its buffer is reused, where a second one was
        # fresh pages to fault in (two thirds of the read)
        chunk = b""
    if carry:
        yield normalise_chunk(carry + b"\n")


@record(frozen=True)
class Segment:
    start: int
    end: int
    text: Path | None  # where to write its normalised text, for the line index
    with_sampled: bool = True  # read with the sampled rules (chunkscan.reads_sampled)


def _segments(path: Path, size: int, text_parts: Path | None) -> list[Segment]:
    bounds = _segment_bounds(path, size)
    # the last two segments are the log's last 8 MB whichever stretches they fall in
    return [
        Segment(
            a,
            b,
            text_parts / f"part-{i}" if text_parts else None,
            reads_sampled(i // 2) or i >= len(bounds) - 2,
        )
        for i, (a, b) in enumerate(bounds)
    ]


def scan_segment(scanner: Scanner, path: Path, segment: Segment, stride: int) -> Iterator[ChunkScan]:
    next_sample = 0
    with path.open("rb") as handle, contextlib.ExitStack() as stack:
        text = stack.enter_context(segment.text.open("wb")) if segment.text else None
        for chunk in _chunks_between(handle, segment.start, segment.end):
            scan = scan_chunk(
                scanner,
                chunk,
                stride,
                next_sample,
                checkpoints=text is not None,
                with_sampled=segment.with_sampled,
            )
            next_sample = scan.next_sample
            if text is not None:
                text.write(chunk)
            del chunk  # freed before the next is read (_chunks_between)
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
_QUEUED_SCANS = 3  # per worker: how far it may run ahead of the parse reading its results


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


def _widen(pipe: int) -> None:
    """256 KB of pipe where Linux allows it, not 64 KB: a 4 MB piece crosses in 16 turns of writer and reader,
    not 64. No more: a user's pipes share one allowance (pipe-user-pages-soft, 64 MB), and a host running
    many parses must not starve its other programs' pipes (a megabyte was no faster)."""
    with contextlib.suppress(OSError, AttributeError, ImportError):
        import fcntl

        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, 1 << 18)


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
    _widen(write_end)
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
            import traceback  # only on a worker's failure: its import costs every parse 2 ms

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
    segments = _segments(path, size, text_parts)
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


def scan_file_serially(
    scanner: Scanner,
    path: Path,
    size: int,
    stride: int,
    *,
    text_parts: Path | None = None,
    text_done: Callable[[Path], None] | None = None,
) -> Iterator[ChunkScan]:
    """`scan_file_in_parallel` in this process (one core): the same segments, so the same document."""
    for segment in _segments(path, size, text_parts):
        yield from scan_segment(scanner, path, segment, stride)
        if segment.text is not None and text_done is not None:
            text_done(segment.text)


# ---------------------------------------------------------------- pieces of a stream (a .gz), in parallel
_PIECES_AHEAD = 2  # per worker: pieces handed over and not yet read back
_DECOMPRESSED_AHEAD = 1  # pieces decompressed ahead of the one handed to a worker

_T = TypeVar("_T")


def read_ahead(items: Iterator[_T], depth: int = _DECOMPRESSED_AHEAD) -> Iterator[_T]:
    """`items`, made by a thread up to `depth` ahead: a stream's decompression (zlib lets go of the GIL while
    it inflates) goes on while the parse reads the workers' results, where it took turns with them. An error
    in making an item is raised here in its place; the thread runs in this context (the expansion budget)."""
    ready: queue.Queue[tuple[bool, object]] = queue.Queue(depth)
    stop = threading.Event()
    end = object()

    def hand_over(outcome: tuple[bool, object]) -> bool:
        while not stop.is_set():
            try:
                ready.put(outcome, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def make() -> None:
        try:
            for item in items:
                if not hand_over((True, item)):
                    return
            hand_over((True, end))
        except BaseException as error:  # raised again in the reader's thread
            hand_over((False, error))

    thread = threading.Thread(target=contextvars.copy_context().run, args=(make,), daemon=True)
    thread.start()
    try:
        while True:
            made, item = ready.get()
            if not made:
                raise item  # type: ignore[misc]
            if item is end:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            ready.get_nowait()  # room for a thread waiting to hand one over: it sees `stop` at once
        thread.join()
        close = getattr(items, "close", None)
        if close is not None:
            close()  # the stream's file, now that no thread reads it


def _piece_worker(scanner: Scanner, checkpoints: bool, pieces: BinaryIO, out: BinaryIO) -> None:
    _keep_freed_memory()
    while (header := _read_exactly(pieces, 17)) is not None:
        size, stride = int.from_bytes(header[:8], "little"), int.from_bytes(header[8:16], "little")
        piece = _read_exactly(pieces, size) if size else None
        if piece is None:
            return
        scan = scan_chunk(scanner, piece, stride, 0, checkpoints=checkpoints, with_sampled=header[16] == 1)
        del piece  # before its scan is pickled: a piece of long lines sends them all back (the peak)
        _send(out, pickle.dumps(scan, protocol=pickle.HIGHEST_PROTOCOL))
        out.flush()


def _fork_piece_worker(scanner: Scanner, checkpoints: bool) -> tuple[int, BinaryIO, BinaryIO]:
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    _widen(from_parent)
    _widen(from_child)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(from_parent)
        os.close(to_parent)
        _die_with_parent(parent)
        code = 0
        try:
            with os.fdopen(to_child, "rb") as pieces, os.fdopen(from_child, "wb") as out:
                _piece_worker(scanner, checkpoints, pieces, out)
        except BaseException:
            import traceback  # only on a worker's failure: its import costs every parse 2 ms

            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(to_child)
    os.close(from_child)
    return pid, os.fdopen(from_parent, "wb"), os.fdopen(to_parent, "rb")


_Piece = tuple[int, bool, memoryview]  # (stride, with the sampled rules, text)


def _feed_pieces(into: BinaryIO, pieces: queue.Queue[_Piece | None], stop: threading.Event) -> None:
    """Writes the pieces handed to one worker into its pipe, each after its size, the stride to sample it
    at and whether to read it with the sampled rules (a thread: the parse reads results meanwhile)."""
    with contextlib.suppress(OSError):
        while not stop.is_set():
            try:
                handed = pieces.get(timeout=0.1)
            except queue.Empty:
                continue
            if handed is None:
                return  # the parse is over
            stride, with_sampled, piece = handed
            into.write(
                len(piece).to_bytes(8, "little") + stride.to_bytes(8, "little") + bytes([with_sampled])
            )
            into.write(piece)
            into.flush()


def scan_pieces_in_parallel(
    scanner: Scanner,
    pieces: Iterator[tuple[memoryview, bool]],
    stride: Callable[[], int],
    workers: int,
    *,
    checkpoints: bool = False,
) -> Iterator[tuple[memoryview, ChunkScan]]:
    """(piece, its scan) in order, the pieces (line-aligned, of a decompressed stream) scanned by `workers`
    forked processes: the parse decompresses and reads the results, the workers scan. Each piece starts its
    statistics sampling afresh, as each segment of a plain file does, at the parse's stride of the moment
    (a compressed log's size says little of its lines: the parse widens the stride as points pile up)."""
    children = [_fork_piece_worker(scanner, checkpoints) for _ in range(workers)]
    stop = threading.Event()
    outgoing: list[queue.Queue[_Piece | None]] = [queue.Queue(1) for _ in children]
    results: list[queue.Queue[bytes | None]] = [queue.Queue(_PIECES_AHEAD + 1) for _ in children]
    threads = [
        threading.Thread(target=_feed_pieces, args=(child[1], send, stop), daemon=True)
        for child, send in zip(children, outgoing, strict=True)
    ] + [
        threading.Thread(target=_pump, args=(child[2], into, stop), daemon=True)
        for child, into in zip(children, results, strict=True)
    ]
    for thread in threads:
        thread.start()
    in_flight: collections.deque[tuple[int, memoryview]] = collections.deque()

    def finished() -> tuple[memoryview, ChunkScan]:
        worker, piece = in_flight.popleft()
        message = results[worker].get()
        if not message:
            raise RuntimeError("a scan worker stopped before finishing its piece")
        return piece, pickle.loads(message)

    try:
        for number, (piece, with_sampled) in enumerate(pieces):
            worker = number % workers
            outgoing[worker].put((stride(), with_sampled, piece))
            in_flight.append((worker, piece))
            while len(in_flight) > workers * _PIECES_AHEAD:
                yield finished()
        while in_flight:
            yield finished()
    finally:
        stop.set()
        for send in outgoing:
            # a feeding thread waiting for a piece stops now, not at its next look at `stop` (a tenth of a
            # second at the end of every compressed parse); one with a piece in hand fails on the closed pipe
            with contextlib.suppress(queue.Full):
                send.put_nowait(None)
        for pid, _writer, _reader in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for thread in threads:
            thread.join()
        for _pid, writer, reader in children:
            with contextlib.suppress(OSError):
                writer.close()
            reader.close()

"""The parse's pass over its sources: where each one's chunks are scanned (here, or by forked workers over a
big plain file's segments or a big stream's pieces), in file order, into one Scan."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dispatchlab.core.parse import chunkscan
from dispatchlab.core.parse.chunkscan import WORKER_CHUNK_BYTES, ChunkScan, reads_sampled, scan_chunk
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.parse.rules import CompiledRules
from dispatchlab.core.parse.scan import Scan
from dispatchlab.core.parse.vocabulary import METRIC_POINTS_TARGET, ProgressCallback
from dispatchlab.core.reading import Source, iter_chunks

if TYPE_CHECKING:
    from dispatchlab.core.lineindex import LineIndexWriter

PARALLEL_MIN_BYTES = 8 * 1024 * 1024
PARALLEL_MIN_COMPRESSED_BYTES = 1024 * 1024  # about ten times that once decompressed
_EXPANSION = 8  # what a log's gzip usually shrinks it by
TAIL_BYTES = 6000


def _chunks_here(run: Scan, source: Source) -> Iterator[ChunkScan]:
    # read as the workers read: memory stays flat
    for chunk, with_sampled in _with_sampled(iter_chunks(source, WORKER_CHUNK_BYTES), source):
        scan = scan_chunk(
            run.rules.scanner,
            chunk,
            run.stride,
            run.next_sample,
            checkpoints=bool(run.index),
            with_sampled=with_sampled,
        )
        run.next_sample = scan.next_sample
        if run.index is not None:
            run.index.add_text(chunk)
        if not source.facts_only:
            run.obs.tail = (run.obs.tail + chunk[-TAIL_BYTES:])[-TAIL_BYTES:]
        yield scan


def _stream_in_parallel(run: Scan, source: Source, workers: int) -> Iterator[ChunkScan]:
    """A compressed log: decompressed here, its pieces scanned by forked workers."""
    from dispatchlab.core.parse.parallelscan import read_ahead, scan_pieces_in_parallel

    # read in pieces the workers' size: a few of them in memory at once, decompressed by a thread
    pieces = (
        (memoryview(piece), with_sampled)
        for piece, with_sampled in read_ahead(_with_sampled(iter_chunks(source, WORKER_CHUNK_BYTES), source))
    )
    scans = scan_pieces_in_parallel(
        run.rules.scanner, pieces, lambda: run.stride, workers, checkpoints=bool(run.index)
    )
    for piece, scan in scans:
        if run.index is not None:
            run.index.add_text(piece.tobytes())
        run.obs.tail = (run.obs.tail + piece[-TAIL_BYTES:].tobytes())[-TAIL_BYTES:]
        yield scan


def _with_sampled(chunks: Iterable[bytes], source: Source) -> Iterator[tuple[bytes, bool]]:
    """Each chunk and whether it is read with the sampled rules: by the stretch it starts in (a stream's
    chunks are the same however many processes read it), and for a file of known size every chunk that
    reaches into its last stretch."""
    stretch_bytes = chunkscan.SAMPLED_STRETCH_BYTES
    size = None if source.compressed or source.path is None else source.stored_bytes
    offset = 0
    for chunk in chunks:
        end = offset + len(chunk)
        yield (
            chunk,
            reads_sampled(offset // stretch_bytes) or (size is not None and end > size - stretch_bytes),
        )
        offset = end


def _scans_of(run: Scan, source: Source) -> Iterable[ChunkScan]:
    """A big plain file is scanned by forked workers, segment by segment; a big compressed one by forked
    workers, piece by piece as it is decompressed here; anything else here, chunk by chunk (forking, pickling
    and their threads are imported only for a big log)."""
    path, size = source.path, source.stored_bytes or 0
    if path is not None and size >= PARALLEL_MIN_BYTES:
        from dispatchlab.core.parse.parallelscan import (
            parallel_workers,
            scan_file_in_parallel,
            scan_file_serially,
        )

        index = run.index
        parts, done = (index.parts_dir(), index.add_file) if index is not None else (None, None)
        workers = parallel_workers()
        if workers > 1:
            return scan_file_in_parallel(
                run.rules.scanner, path, size, run.stride, workers, text_parts=parts, text_done=done
            )
        # one core: the same segments read here (the same stretches read with the sampled rules)
        return scan_file_serially(run.rules.scanner, path, size, run.stride, text_parts=parts, text_done=done)
    if source.compressed and size >= PARALLEL_MIN_COMPRESSED_BYTES:
        from dispatchlab.core.parse.parallelscan import parallel_workers

        workers = parallel_workers()
        if workers > 1:
            return _stream_in_parallel(run, source, workers)
    return _chunks_here(run, source)


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
    # the statistics lines are sampled over the text: a compressed log's is some times its stored size
    expected = sum((s.stored_bytes or 0) * (_EXPANSION if s.compressed else 1) for s in sources)
    run = Scan(
        rules, max(1, (expected if total else 256 * METRIC_POINTS_TARGET) // METRIC_POINTS_TARGET), index
    )
    done = 0
    for source in sources:
        first = run.obs.line_count + 1
        run.begin_source(first)
        unsampled = run.obs.unsampled_bytes
        for scan in _scans_of(run, source):
            if index is not None:
                index.add_checkpoints(scan.checkpoints, scan.lines, scan.size)
            run.feed(scan)
            if progress is not None:
                done = min(done + scan.size, total) if total else done + scan.size
                progress(done, total)
        if source.path is not None and (source.stored_bytes or 0) >= PARALLEL_MIN_BYTES:
            run.obs.tail = _file_tail(source.path, source.stored_bytes or 0)  # scanned in parallel, not here
        if run.obs.unsampled_bytes > unsampled and (source.compressed or source.path is None):
            run.obs.sampled_stream = True  # its last stretch was not known while it was read
        lines = run.obs.line_count - first + 1
        run.obs.sources.append({"name": source.name, "first_line": first, "line_count": lines})
    return run.finish()

"""A plain-text copy of a report's logs with a sparse line index, for paging through gigabyte logs.

The scan writes both as it reads (one read of each upload): the normalised text, and checkpoints
`(line number, byte offset)` at line starts about every CHECKPOINT_BYTES, so any line is at most that far
from a seek. Reading a window or searching costs what the window or the searched slice costs.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

from dispatchlab.core.reading import decode_line, iter_chunks, open_sources
from dispatchlab.core.records import record

MAGIC = b"DLIDX\x02\x00\x00"
CHECKPOINT_BYTES = 64 * 1024
_PAIR = struct.Struct("<QQ")
DISPLAY_CHARS = 12_000
SEARCH_LIMIT = 200
SEARCH_SLICE_BYTES = 256 * 1024 * 1024
SEARCH_BLOCK_BYTES = 8 * 1024 * 1024
HIT_CHARS = 400


def chunk_checkpoints(chunk: bytes, every: int = CHECKPOINT_BYTES) -> list[int]:
    """Offsets of line starts in a chunk, about `every` bytes apart, the first at 0."""
    starts = [0]
    for nominal in range(every, len(chunk), every):
        start = chunk.find(b"\n", nominal - 1) + 1
        if 0 < start < len(chunk) and start > starts[-1]:
            starts.append(start)
    return starts


class LineIndexWriter:
    """Appends text and checkpoints in file order; `close` returns the number of lines."""

    def __init__(self, text_path: str | Path, index_path: str | Path) -> None:
        self.text_dir = Path(text_path).parent
        self._parts: Path | None = None
        self.text: BinaryIO = open(text_path, "wb")  # noqa: SIM115 - closed by close()
        self.index: BinaryIO = open(index_path, "wb")  # noqa: SIM115
        self.index.write(MAGIC)
        self.lines = 0
        self.offset = 0

    def add_checkpoints(self, checkpoints: Iterable[tuple[int, int]], lines: int, size: int) -> None:
        """A chunk's checkpoints ((line index, offset) within it), its line count and byte size."""
        self.index.write(b"".join(_PAIR.pack(self.lines + 1 + i, self.offset + o) for i, o in checkpoints))
        self.lines += lines
        self.offset += size

    def add_text(self, data: bytes) -> None:
        self.text.write(data)

    def parts_dir(self) -> Path:
        """Where scan workers write their shares of the text: next to it (same disk), removed on close."""
        if self._parts is None:
            import tempfile  # only a big log scanned in parallel has parts

            self._parts = Path(tempfile.mkdtemp(prefix=".parts-", dir=self.text_dir))
        return self._parts

    def add_file(self, path: Path) -> None:
        """Append a file's bytes (a scan worker's share of the text) and delete it."""
        self.text.flush()
        with path.open("rb") as part:
            remaining = os.fstat(part.fileno()).st_size
            while remaining > 0:
                copied = os.sendfile(self.text.fileno(), part.fileno(), None, remaining)
                if copied == 0:
                    break
                remaining -= copied
        path.unlink()

    def close(self) -> int:
        self.text.close()
        self.index.close()
        if self._parts is not None:
            import shutil

            shutil.rmtree(self._parts, ignore_errors=True)
        return self.lines


def write_line_index(
    paths: Sequence[str | Path],
    text_path: str | Path,
    index_path: str | Path,
    *,
    checkpoint_bytes: int = CHECKPOINT_BYTES,
) -> int:
    """The text copy and index of logs without parsing them. Returns the number of lines."""
    writer = LineIndexWriter(text_path, index_path)
    try:
        for source in open_sources(paths):
            for chunk in iter_chunks(source):
                checkpoints, counted, position = [], 0, 0
                for start in chunk_checkpoints(chunk, checkpoint_bytes):
                    counted += chunk.count(b"\n", position, start)  # newlines before each start, counted once
                    position = start
                    checkpoints.append((counted, start))
                writer.add_checkpoints(checkpoints, chunk.count(b"\n"), len(chunk))
                writer.add_text(chunk)
    finally:
        lines = writer.close()
    return lines


@record
class SearchResult:
    needle: str
    hits: list[tuple[int, str]]
    start: int
    scanned_to: int  # the last line looked at
    next_start: int | None  # where "search on" continues, when the slice or the hit limit ran out
    truncated_hits: bool = False


class LineIndex:
    """Random access to the lines of a text copy made by LineIndexWriter."""

    def __init__(self, text_path: str | Path, index_path: str | Path) -> None:
        self.text_path = Path(text_path)
        raw = Path(index_path).read_bytes()
        if not raw.startswith(MAGIC):
            raise ValueError(f"{index_path}: not a line index of this version")
        pairs = list(_PAIR.iter_unpack(raw[len(MAGIC) :]))
        self.checkpoint_lines = [line for line, _ in pairs]
        self.checkpoint_offsets = [offset for _, offset in pairs]

    def seek_point(self, line: int) -> tuple[int, int]:
        """(line number, byte offset) of the last checkpoint at or before `line`."""
        slot = bisect.bisect_right(self.checkpoint_lines, line) - 1
        if slot < 0:
            return 1, 0
        return self.checkpoint_lines[slot], self.checkpoint_offsets[slot]

    def read_lines(self, first: int, count: int, *, max_chars: int = DISPLAY_CHARS) -> list[tuple[str, int]]:
        """Lines first..first+count-1 as (text, full length in bytes), each cut to max_chars; never reads
        more than max_chars of a line into memory, so a window of 4 MB lines costs what short ones do."""
        if first < 1 or count <= 0 or not self.checkpoint_lines:
            return []
        number, offset = self.seek_point(first)
        skip = first - number
        limit = max_chars * 4 + 4  # UTF-8: up to 4 bytes a character
        out: list[tuple[str, int]] = []
        with self.text_path.open("rb") as handle:
            handle.seek(offset)
            while len(out) < count:
                raw = handle.readline(limit)
                if not raw:
                    break
                length, complete = len(raw), raw.endswith(b"\n")
                while not complete:
                    rest = handle.readline(1024 * 1024)
                    if not rest:
                        break
                    length += len(rest)
                    complete = rest.endswith(b"\n")
                if skip:
                    skip -= 1
                    continue
                out.append((decode_line(raw.rstrip(b"\n"))[:max_chars], length - (1 if complete else 0)))
        return out

    def search(
        self,
        needle: str,
        *,
        start: int = 1,
        limit: int = SEARCH_LIMIT,
        slice_bytes: int = SEARCH_SLICE_BYTES,
        block_bytes: int = SEARCH_BLOCK_BYTES,
    ) -> SearchResult:
        """Lines containing needle (ASCII case-insensitive) from line `start` on. Scans whole blocks with
        bytes.find, and stops after `slice_bytes` so one request on a gigabyte log stays bounded."""
        wanted = needle.encode("utf-8").lower()
        start = max(1, start)
        if not wanted or not self.checkpoint_lines:
            return SearchResult(needle, [], start, start - 1, None)
        number, offset = self.seek_point(start)  # number: line number of the first line in `block`
        hits: list[tuple[int, str]] = []
        scanned = 0
        with self.text_path.open("rb") as handle:
            handle.seek(offset)
            for block in _blocks(handle, block_bytes):
                lowered = block.lower()
                pos = lowered.find(wanted)
                counted_to, line_of_pos = 0, number
                while pos != -1:
                    line_of_pos += block.count(b"\n", counted_to, pos)
                    counted_to = pos
                    line_start = block.rfind(b"\n", 0, pos) + 1
                    line_end = block.find(b"\n", pos)
                    line_end = len(block) if line_end == -1 else line_end
                    if line_of_pos >= start:
                        text = decode_line(block[line_start : min(line_end, line_start + HIT_CHARS * 4)])
                        hits.append((line_of_pos, text[:HIT_CHARS]))
                        if len(hits) >= limit:
                            return SearchResult(needle, hits, start, line_of_pos, line_of_pos + 1, True)
                    pos = lowered.find(wanted, line_end)
                number += block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
                scanned += len(block)
                if scanned >= slice_bytes:
                    return SearchResult(needle, hits, start, number - 1, number)
        return SearchResult(needle, hits, start, number - 1, None)


def _blocks(handle: BinaryIO, block_bytes: int) -> Iterable[bytes]:
    """Line-aligned blocks of an open file from where it stands."""
    carry = b""
    while True:
        data = handle.read(block_bytes)
        block = carry + data
        if not block:
            return
        if not data:
            yield block
            return
        cut = block.rfind(b"\n") + 1
        if cut == 0:  # one line longer than a block: keep reading
            carry = block
            continue
        carry = block[cut:]
        yield block[:cut]

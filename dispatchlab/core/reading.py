"""Reading logs: plain text, .gz, .zip of several logs, stdin; streamed in line-aligned chunks.

Every input problem becomes a LogReadError with a one-line reason; nothing here raises anything else
for a bad file. Decoding is left to the caller (bytes in, bytes out) so the hot loop stays in C.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from dispatchlab.core import dumpformat
from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.records import record

CHUNK_BYTES = 16 * 1024 * 1024
# A line keeps its first MAX_LINE_BYTES, the rest is dropped (memory stays bounded, a log of no newline at
# all is one line); the parser itself only looks at the first MAX_PARSED_LINE_BYTES of any line, so a 10 MB
# single line costs no more than a short one.
MAX_LINE_BYTES = 8 * 1024 * 1024
MAX_PARSED_LINE_BYTES = 1024 * 1024
SNIFF_BYTES = 64 * 1024
# Decompression bombs: refuse archives that expand far beyond what logs compress to.
MAX_EXPANSION_RATIO = 1000
EXPANSION_CHECK_FLOOR = 256 * 1024 * 1024
# And absolute caps, whatever the ratio: on the decompressed bytes of one stream, on those of all the
# compressed logs read for one report, on the members of one zip. A caller sets its own for the work it
# runs inside `with expansion_limit(...)` (the web passes its DISPATCHLAB_MAX_* settings).
MAX_EXPANDED_BYTES = 16 * 1024**3
MAX_ZIP_MEMBERS = 10_000


@record
class ExpansionBudget:
    """The caps in force, and the decompressed bytes read so far under them."""

    per_file: int = MAX_EXPANDED_BYTES
    per_report: int | None = None  # None: no cap across files (the command line)
    zip_members: int = MAX_ZIP_MEMBERS
    expanded: int = 0

    def spend(self, size: int, name: str) -> None:
        """Count `size` more decompressed bytes; LogReadError once they pass the report's cap."""
        if self.per_report is None:
            return
        self.expanded += size
        if self.expanded > self.per_report:
            raise LogReadError(
                f"{name}: the compressed logs of this report expand to more than {self.per_report:,} bytes "
                "in all, the limit on expanded text of one report (DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES); "
                "refused while expanding"
            )


_budget: contextvars.ContextVar[ExpansionBudget | None] = contextvars.ContextVar(
    "expansion_budget", default=None
)


def _current_budget() -> ExpansionBudget:
    return _budget.get() or ExpansionBudget()


@contextlib.contextmanager
def expansion_limit(
    limit_bytes: int, *, report_bytes: int | None = None, zip_members: int = MAX_ZIP_MEMBERS
) -> Iterator[ExpansionBudget]:
    """Streams opened inside refuse (LogReadError) to expand past `limit_bytes` each, or past
    `report_bytes` all together, as they expand; a zip of more than `zip_members` members is refused
    before its directory is read. One block is one report's budget."""
    budget = ExpansionBudget(limit_bytes, report_bytes, zip_members)
    token = _budget.set(budget)
    try:
        yield budget
    finally:
        _budget.reset(token)


ANSI_RE = lazy_compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


class LogReadError(Exception):
    """The input is not a readable log. str(error) is one line meant for people."""


@record(frozen=True)
class Source:
    """One log inside the input (a file, a zip member, stdin)."""

    name: str
    opener: Callable[[], BinaryIO]
    stored_bytes: int | None  # size on disk, for progress; None when unknown
    path: Path | None = None  # set for a plain uncompressed file, which can be read in segments
    compressed: bool = False  # its bytes count against the report's expansion budget
    facts_only: bool = False  # lines made from a tool's file (a crash dump): facts, never the log's tail


def _magic(head: bytes) -> str:
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    return "plain"


class _BombGuard(io.RawIOBase):
    """Counts decompressed bytes and refuses to expand past the ratio limit."""

    def __init__(self, inner: BinaryIO, name: str, stored_bytes: int | None) -> None:
        self._inner = inner
        self._name = name
        self._limit = (
            None if not stored_bytes else max(EXPANSION_CHECK_FLOOR, stored_bytes * MAX_EXPANSION_RATIO)
        )
        self._absolute = _current_budget().per_file
        self._seen = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        try:
            data = self._inner.read(len(buffer))
        except _corrupt_data_errors() as error:
            raise LogReadError(f"{self._name}: corrupt compressed data ({error})") from None
        n = len(data)
        buffer[:n] = data
        self._seen += n
        if self._limit is not None and self._seen > self._limit:
            raise LogReadError(
                f"{self._name}: expands more than {MAX_EXPANSION_RATIO}x its compressed size; "
                "refusing a likely decompression bomb"
            )
        if self._seen > self._absolute:
            raise LogReadError(
                f"{self._name}: decompresses to more than {self._absolute:,} bytes, the limit on expanded "
                "text of one file (DISPATCHLAB_MAX_EXPANDED_BYTES); refused while expanding"
            )
        return n

    def close(self) -> None:
        self._inner.close()
        super().close()


def _corrupt_data_errors() -> tuple[type[Exception], ...]:
    """What a corrupt .gz or zip member raises while it is read (looked up only once one did: a plain log
    never imports the decompressors)."""
    import struct
    import zipfile
    import zlib

    return (OSError, EOFError, zlib.error, zipfile.BadZipFile, struct.error, *_isal_errors())


def gzip_module() -> Any:
    """The gzip reader: ISA-L's (`isal`, in the `fast` and `web` extras) where installed, which decompresses a
    log three times as fast (a .gz parse's decompression was its slowest step), else the standard library's.
    Both check the CRC and length and read several members (tests/core/test_reading.py reads both)."""
    if not os.environ.get("DISPATCHLAB_NO_ISAL"):
        try:
            from isal import igzip

            return igzip
        except ImportError:
            pass
    import gzip

    return gzip


def gzip_reader(fileobj: Any) -> BinaryIO:
    """A gzip reader over an open file object. ISA-L's reads with `readinto`, which some file objects (an
    upload's, a storage backend's) lack: those are read by the standard library's."""
    if hasattr(fileobj, "readinto"):
        return gzip_module().GzipFile(fileobj=fileobj)  # type: ignore[no-any-return]
    import gzip

    return gzip.GzipFile(fileobj=fileobj)  # type: ignore[return-value]


def _isal_errors() -> tuple[type[Exception], ...]:
    try:
        from isal import isal_zlib
    except ImportError:
        return ()
    error: type[Exception] = getattr(isal_zlib, "error")  # noqa: B009 - typed as an instance in isal's stubs
    return (error,)


def _guarded(inner: BinaryIO, name: str, stored_bytes: int | None) -> BinaryIO:
    return io.BufferedReader(_BombGuard(inner, name, stored_bytes), buffer_size=1024 * 1024)


def _check_text(head: bytes, name: str) -> None:
    if not head:
        raise LogReadError(f"{name}: empty file, nothing to parse")
    if b"\x00" in head:
        raise LogReadError(f"{name}: binary data, not a text log")
    sample = head[:SNIFF_BYTES]
    controls = sum(1 for b in sample if b < 9 or 13 < b < 27 or 27 < b < 32)
    if controls > len(sample) // 20:
        raise LogReadError(f"{name}: binary data, not a text log")


# ---- SGLang crash dumps (`--crash-dump-folder`): a pickle, never unpickled, read as the lines it amounts to


def _read_crash_dump(stream: BinaryIO, name: str) -> bytes:
    from dispatchlab.core import crashdump

    with stream:
        data = stream.read(crashdump.MAX_DUMP_BYTES + 1)
    if len(data) > crashdump.MAX_DUMP_BYTES:
        raise crashdump.NotACrashDump(
            f"larger than {crashdump.MAX_DUMP_BYTES:,} bytes, the limit on one dump"
        )
    return data


def _crash_dump_source(name: str, open_dump: Callable[[], BinaryIO]) -> Source:
    """The dump's facts as text lines (crashdump.crash_dump_lines); LogReadError when it is no dump."""
    from dispatchlab.core import crashdump

    try:
        text = crashdump.crash_dump_text(_read_crash_dump(open_dump(), name), name)
    except crashdump.NotACrashDump as error:
        raise LogReadError(f"{name}: not an SGLang crash dump: {error}") from None
    return Source(name, lambda: io.BytesIO(text), len(text), facts_only=True)


def check_upload_head(stream: BinaryIO, name: str) -> None:
    """Refuse, from its first bytes, an uploaded file that cannot be a log: empty, binary, or a `.gz`
    that does not decompress to text (LogReadError, one line for people). A zip is left to
    `open_sources`, which reads its directory under the limits on members and expansion. `stream`
    is read from its start and left there."""
    stream.seek(0)
    head = stream.read(SNIFF_BYTES)
    stream.seek(0)
    if _magic(head) == "zip" or dumpformat.looks_like_pickle(head, name):
        return  # read under its own limits by open_sources (a zip's directory; a dump, never unpickled)
    if _magic(head) == "gzip":
        try:
            with gzip_reader(stream) as unpacked:
                head = unpacked.read(SNIFF_BYTES)
        except _corrupt_data_errors() as error:
            raise LogReadError(f"{name}: not a readable .gz file ({error})") from None
        finally:
            stream.seek(0)
    _check_text(head, name)


def _safe_member_name(name: str) -> bool:
    path = PurePosixPath(name.replace("\\", "/"))
    return not (path.is_absolute() or ".." in path.parts or re.match(r"^[A-Za-z]:", name))


def _zip_member_count(path: Path) -> int | None:
    """The member count the archive's end record declares, read before zipfile builds an object for
    every member of the directory (a 2 GiB directory would be millions of them). None: no such record,
    and zipfile will say what is wrong."""
    import struct

    end_record = struct.Struct("<4s4H2LH")  # the end of central directory record
    zip64_locator = struct.Struct("<4sLQL")
    zip64_end = struct.Struct("<4sQ2H2L4Q")
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        tail_start = max(0, size - (end_record.size + 65535))  # the record, then a comment
        handle.seek(tail_start)
        tail = handle.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < end_record.size:
            return None
        count = int(end_record.unpack_from(tail, at)[4])
        locator_at = at - zip64_locator.size
        if count != 0xFFFF or locator_at < 0 or tail[locator_at : locator_at + 4] != b"PK\x06\x07":
            return count
        handle.seek(zip64_locator.unpack_from(tail, locator_at)[2])
        record = handle.read(zip64_end.size)
        if len(record) < zip64_end.size or not record.startswith(b"PK\x06\x06"):
            return count
        return int(zip64_end.unpack(record)[7])


def _check_member_count(count: int | None, budget: ExpansionBudget, display: str) -> None:
    if count is not None and count > budget.zip_members:
        raise LogReadError(
            f"{display}: zip holds {count:,} members, more than {budget.zip_members:,}, the limit on "
            "members of one zip (DISPATCHLAB_MAX_ZIP_MEMBERS)"
        )


def _zip_sources(path: Path, display: str) -> list[Source]:
    import struct
    import zipfile

    budget = _current_budget()
    try:
        _check_member_count(_zip_member_count(path), budget, display)
        # One ZipFile for every member: opening a member is then a seek, not another read of the whole
        # directory (which made parse time grow with the square of the member count). It stays open
        # while the sources live and is closed with them.
        archive = zipfile.ZipFile(path)
        infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, EOFError, struct.error) as error:
        raise LogReadError(f"{display}: not a readable zip archive ({error})") from None
    _check_member_count(len(infos), budget, display)
    total_stored = max(1, path.stat().st_size)
    total_expanded = sum(info.file_size for info in infos)
    if total_expanded > max(EXPANSION_CHECK_FLOOR, total_stored * MAX_EXPANSION_RATIO):
        raise LogReadError(
            f"{display}: zip expands to {total_expanded} bytes; refusing a likely decompression bomb"
        )
    if budget.per_report is not None and total_expanded > budget.per_report:
        raise LogReadError(
            f"{display}: zip says it expands to {total_expanded:,} bytes, more than {budget.per_report:,} "
            "bytes, the limit on expanded text of one report (DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES)"
        )
    sources: list[Source] = []
    for info in infos:
        if not _safe_member_name(info.filename):
            raise LogReadError(f"{display}: unsafe entry name {info.filename!r} in zip")
        if info.is_dir() or info.file_size == 0:
            continue
        if info.flag_bits & 0x1:
            raise LogReadError(f"{display}: entry {info.filename!r} is encrypted")

        def opener(info: zipfile.ZipInfo = info) -> BinaryIO:
            try:
                member = archive.open(info)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError, struct.error) as error:
                raise LogReadError(f"{display}:{info.filename}: corrupt zip member ({error})") from None
            stream: BinaryIO = _guarded(member, f"{display}:{info.filename}", max(1, info.compress_size))  # type: ignore[arg-type]
            if info.filename.endswith(".gz"):
                stream = _guarded(gzip_reader(stream), f"{display}:{info.filename}", info.file_size)
            return stream

        sources.append(Source(f"{display}:{info.filename}", opener, info.compress_size, compressed=True))
    readable = []
    refused_dump: LogReadError | None = None
    for source in sources:
        with source.opener() as stream:
            head = stream.read(SNIFF_BYTES)
        try:
            if dumpformat.looks_like_pickle(head, source.name):
                readable.append(_crash_dump_source(source.name, source.opener))
                continue
            _check_text(head, source.name)
        except LogReadError as error:
            refused_dump = refused_dump or (error if "crash dump" in str(error) else None)
            continue  # a screenshot or core dump next to the logs: skip it, keep the logs
        readable.append(source)
    if not readable:
        archive.close()
        raise refused_dump or LogReadError(f"{display}: zip holds no text logs")
    return readable


def _file_sources(raw: str | Path) -> list[Source]:
    path = Path(raw)
    display = str(raw)
    if not path.exists():
        raise LogReadError(f"{display}: no such file")
    if path.is_dir():
        raise LogReadError(f"{display}: is a directory, not a log file")
    try:
        with path.open("rb") as handle:
            head = handle.read(SNIFF_BYTES)
    except OSError as error:
        raise LogReadError(f"{display}: cannot read ({error.strerror or error})") from None
    size = path.stat().st_size
    if dumpformat.looks_like_pickle(head, display):
        return [_crash_dump_source(display, lambda: path.open("rb"))]
    kind = _magic(head)
    if kind == "zip":
        return _zip_sources(path, display)
    if kind == "gzip":
        gzip = gzip_module()

        def gz_opener() -> BinaryIO:
            return _guarded(gzip.open(path, "rb"), display, size)

        with gz_opener() as stream:
            _check_text(stream.read(SNIFF_BYTES), display)
        return [Source(display, gz_opener, size, compressed=True)]
    _check_text(head, display)
    return [Source(display, lambda: path.open("rb"), size, path)]


def _stdin_source() -> list[Source]:
    buffered = io.BufferedReader(sys.stdin.buffer.raw, buffer_size=1024 * 1024)  # type: ignore[union-attr]
    head = buffered.peek(SNIFF_BYTES)[:SNIFF_BYTES]
    stream: BinaryIO = buffered
    compressed = _magic(head) == "gzip"
    if compressed:
        stream = _guarded(gzip_reader(buffered), "<stdin>", None)
        head = stream.peek(SNIFF_BYTES)[:SNIFF_BYTES]  # type: ignore[attr-defined]
    elif _magic(head) == "zip":
        raise LogReadError("<stdin>: zip archives must be given as a file path, not on stdin")
    _check_text(head, "<stdin>")
    used = False

    def opener() -> BinaryIO:
        nonlocal used
        if used:
            raise LogReadError("<stdin>: can only be read once")
        used = True
        return stream

    return [Source("<stdin>", opener, None, compressed=compressed)]


def open_sources(paths: Sequence[str | Path]) -> list[Source]:
    """Validate the inputs and list the logs they hold, in order. `-` is stdin."""
    if not paths:
        raise LogReadError("no input given")
    sources: list[Source] = []
    for raw in paths:
        sources.extend(_stdin_source() if str(raw) == "-" else _file_sources(raw))
    return sources


def iter_chunks(source: Source, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Line-aligned chunks of a source (reads of `chunk_bytes`): CRLF normalised, ANSI colour codes
    removed. Every chunk ends with a newline."""
    budget = _current_budget() if source.compressed else None
    with source.opener() as stream:
        carry = b""
        overlong = False
        while True:
            try:
                block = stream.read(chunk_bytes)
            except OSError as error:
                raise LogReadError(f"{source.name}: read failed ({error})") from None
            if not block:
                break
            if budget is not None:
                budget.spend(len(block), source.name)
            if overlong:
                block, overlong = rest_of_long_line(block)
                if overlong:
                    continue
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                carry += block
                if len(carry) >= MAX_LINE_BYTES:
                    carry, overlong = carry[:MAX_LINE_BYTES], True
                continue
            # one copy per chunk: the carried partial line, then the block up to its last newline
            chunk = (
                b"".join((carry, memoryview(block)[:cut]))
                if carry
                else block[:cut]
                if cut < len(block)
                else block
            )
            carry = block[cut:]
            yield normalise_chunk(chunk)
        if carry:
            yield normalise_chunk(carry + b"\n")


def rest_of_long_line(block: bytes) -> tuple[bytes, bool]:
    """A line past MAX_LINE_BYTES keeps its first MAX_LINE_BYTES: the block from the newline that ends it (the
    bytes before it dropped), and whether the line still goes on past this block."""
    newline = block.find(b"\n")
    return (b"", True) if newline < 0 else (block[newline:], False)


def normalise_chunk(chunk: bytes) -> bytes:
    if b"\x1b" in chunk:
        chunk = ANSI_RE.sub(b"", chunk)
    if b"\r" in chunk:
        chunk = chunk.replace(b"\r\n", b"\n")
        if b"\r" in chunk:
            chunk = _last_redraws(chunk)
    return chunk


def _last_redraws(chunk: bytes) -> bytes:
    """tqdm redraws a bar with bare CRs: each line keeps what follows its last CR, and no CR. Line by line
    from one CR to the next (a regex over the chunk backtracked each line through binary junk)."""
    out: list[bytes] = []
    find, rfind = chunk.find, chunk.rfind
    position = 0
    while (cr := find(b"\r", position)) >= 0:
        start = rfind(b"\n", 0, cr) + 1
        end = find(b"\n", cr)
        end = len(chunk) if end < 0 else end
        line = chunk[start:end]
        last = line.rfind(b"\r", 0, len(line) - 1)  # the last CR a character of the line follows
        out.append(chunk[position:start])
        out.append((line[last + 1 :] if last >= 0 else line).replace(b"\r", b""))
        position = end
    out.append(chunk[position:])
    return b"".join(out)


def decode_line(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def iter_lines(paths: Sequence[str | Path]) -> Iterator[str]:
    """Every line of the inputs, in the numbering the parser uses (line 1 is the first line of the
    first log; a zip's logs follow each other). Decoded, without the newline."""
    for source in open_sources(paths):
        for chunk in iter_chunks(source):
            for raw in chunk[:-1].split(b"\n"):
                yield decode_line(raw)

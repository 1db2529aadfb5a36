"""The per-chunk work of a parse that needs no parser state: which lines may match which rules, the
sampled batch-statistics lines, the line count. It runs in the parsing process, or for big plain files
in worker processes over line-aligned segments (one per core), so gigabyte logs parse at grep speed."""

from __future__ import annotations

import itertools
from array import array

from dispatchlab.core.bytecount import counter
from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.lineindex import chunk_checkpoints
from dispatchlab.core.parse.scanner import Scanner
from dispatchlab.core.reading import MAX_PARSED_LINE_BYTES
from dispatchlab.core.records import field, record

WORKER_CHUNK_BYTES = 4 * 1024 * 1024  # the chunks a scan reads: small ones keep memory flat
STAT_NEEDLES = (b"Decode batch", b"Avg prompt throughput", b"Prefill batch")
COUNTED_NEEDLES = STAT_NEEDLES[:2]  # decode-side statistics lines: the series' total
# what makes a line one whose dump or command may continue on the next lines (substring tests: a regex
# alternation crawled through a megabyte line)
CONTINUED = (
    b"ServerArgs(",
    b"server_args={",
    b"launch_server",
    b"sglang serve",
    b"vllm serve",
    b"api_server",
)
_DIGITS = b"0123456789"
_NEWLINE = ord("\n")
ONE_DIGIT = bytes.maketrans(b"123456789", b"000000000")  # every digit where it is, whatever its value
_NOT_DIGITS = bytes(b for b in range(256) if b not in _DIGITS)
_DIGIT_RUN = lazy_compile(rb"[0-9]+")
FOLLOWING_LINES = 400
FOLLOWING_BYTES = 512 * 1024
_VIEWED_BYTES = 16 * 1024  # a hit line this long goes into the scan's text from the chunk, not from a copy
# a crash loop's repeated blocks are taken from the block before them, not read line by line (tests turn it
# off to compare); a chunk is searched for them from this size, blocks up to this many lines
INFER_REPEATS = True
_MIN_INFER_BYTES = 256 * 1024
_MAX_BLOCK_LINES = 20_000
_MAX_PROBE_COPIES = 64
# error words and traceback frames in the middle of a chunk that make it worth searching for repeats
_MIN_ERROR_MARKS, _GATE_BYTES = 8, 128 * 1024
_PROBE_WINDOW_BYTES = 1024 * 1024
# The rules Hyperscan can only run byte by byte (no literal to look for: a token repeated, a word looping; the
# extractors' SAMPLED) cost two thirds of a server log's scan. A log is read in stretches of this size: its
# first and last stretch and one in SAMPLED_EVERY between are read with them, the others without, and the
# document says how much was (`checks_sampled`). A log of one stretch is read whole.
SAMPLED_STRETCH_BYTES = 8 * 1024 * 1024
SAMPLED_EVERY = 8


def reads_sampled(stretch: int) -> bool:
    """Whether stretch number `stretch` of a log is read with the sampled rules (a file of known size: its last
    8 MB too, which its reader adds). Decided by the stretch alone, not by which process reads it: a log parses
    the same on any number of cores."""
    return stretch % SAMPLED_EVERY == 0


@record
class Hit:
    index: int  # 0-based line index within the chunk
    raw: bytes  # the line (at most MAX_PARSED_LINE_BYTES)
    rules: tuple[int, ...] | None  # rule ids that may match; None: try every rule
    following: bytes  # the lines after it, for a dump or command that continues (else empty)
    previous: bytes = b""  # the line before a bare "Traceback": whose process printed it
    key: int = 0  # the line's shape: its text without digits, its rules, its distance from the hit before
    # (equal keys over a run's lines: the same run again)


@record
class Repeats:
    """Hits the scan worker did not read line by line: blocks of lines that repeat the block before them
    (digits aside), so their hits are that block's hits, moved down by a block each time.

    Every block holds the same lines but for their digits' values: the same bytes at the same offsets. So the
    blocks' text is sent as one block's and the digits of all of them (a crash loop's chunk shrinks ten times,
    and no compressing or unpacking: zlib cost a crash loop's parse a fifth of its time)."""

    first_hit: int  # the first such hit's number in the chunk's columns
    count: int
    first_line: int  # the chunk line before the first repeated block (`before`)
    before: bytes  # that line
    template: bytes  # the first repeated block's lines, each ending in a newline
    digits: bytes  # every repeated block's digits, in order
    previous: bytes  # per hit of one block: 1 where the hit's line before it is its `previous`
    block_lines: int = 0
    # per line of a block: its text split at its runs of digits, the runs' lengths, and how many digits a block
    # has before the line (made on first use)
    pieces: list[list[bytes]] = field(default_factory=list)
    runs: list[list[int]] = field(default_factory=list)
    digit_starts: list[int] = field(default_factory=list)

    def line(self, number: int) -> bytes:
        """Line `number` of the chunk, rebuilt from the blocks' shape and their digits."""
        after = number - self.first_line - 1  # lines after the one before the first block
        if after < 0:
            return self.before
        if not self.pieces:
            lines = self.template.split(b"\n")[: self.block_lines]
            self.pieces = [_DIGIT_RUN.split(line) for line in lines]
            self.runs = [[len(run) for run in _DIGIT_RUN.findall(line)] for line in lines]
            self.digit_starts = list(itertools.accumulate((sum(r) for r in self.runs), initial=0))
        block, line = divmod(after, self.block_lines)
        pieces = self.pieces[line]
        if len(pieces) == 1:
            return pieces[0]
        at = block * self.digit_starts[-1] + self.digit_starts[line]
        digits, out = self.digits, [pieces[0]]
        for length, piece in zip(self.runs[line], pieces[1:], strict=True):
            out += (digits[at : at + length], piece)
            at += length
        return b"".join(out)


@record
class ChunkScan:
    """A chunk's hits as columns (one object per hit costs more to pickle than to scan a line)."""

    size: int
    lines: int
    hit_lines: array[int]  # 0-based line index within the chunk, per hit
    hit_keys: array[int]  # per hit: see Hit.key; equal runs of keys are the same lines again
    hit_ends: array[int]  # where each hit's line ends in `hit_text` (repeated hits: an empty piece)
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
    repeats: Repeats | None = None
    with_sampled: bool = True  # read with the sampled rules (SAMPLED_STRETCH_BYTES)

    def __len__(self) -> int:
        return len(self.hit_lines)

    def lone_line(self, number: int) -> bytes | None:
        """The line of a hit read line by line with no lines around it sent; None for any other hit."""
        repeats = self.repeats
        if number in self.context or (
            repeats is not None and repeats.first_hit <= number < repeats.first_hit + repeats.count
        ):
            return None
        return self.hit_text[self.hit_ends[number - 1] if number else 0 : self.hit_ends[number]]

    def hit(self, number: int) -> Hit:
        line = self.hit_lines[number]
        rules = self.rule_sets[self.hit_rules[number]]
        repeats = self.repeats
        if repeats is not None and repeats.first_hit <= number < repeats.first_hit + repeats.count:
            block_hit = (number - repeats.first_hit) % len(repeats.previous)
            previous = repeats.line(line - 1) if repeats.previous[block_hit] else b""
            raw = repeats.line(line)[:MAX_PARSED_LINE_BYTES]
            return Hit(line, raw, rules, b"", previous, self.hit_keys[number])
        start = self.hit_ends[number - 1] if number else 0
        following, previous = self.context.get(number, (b"", b""))
        return Hit(
            line,
            self.hit_text[start : self.hit_ends[number]],
            rules,
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
    if b"erv" not in raw or not any(mark in raw for mark in CONTINUED):  # each mark has "erv"
        return False
    count = raw.count
    return count(b"(") + count(b"[") + count(b"{") > count(b")") + count(b"]") + count(b"}")


def _samples(chunk: bytes, stride: int, next_sample: int) -> tuple[list[int], int, int]:
    """At most one statistics line per `stride` bytes: (line starts, next_sample, statistics line count).

    Each next statistics line is searched for up to the nearest one found so far, the needle found last
    first: a needle the log never prints was a search through the whole chunk (two of three for a server
    log, a third of this function)."""
    out: list[int] = []
    position = max(0, next_sample)
    size = len(chunk)
    find = chunk.find
    needles = list(STAT_NEEDLES)
    while position < size:
        hit, nearest = -1, needles[0]
        for needle in needles:
            # an occurrence that starts before the nearest one found so far
            found = find(needle, position, size if hit < 0 else hit + len(needle) - 1)
            if found >= 0:
                hit, nearest = found, needle
        if hit < 0:
            break
        if nearest is not needles[0]:
            needles.remove(nearest)
            needles.insert(0, nearest)
        start = chunk.rfind(b"\n", 0, hit) + 1
        out.append(start)
        end = find(b"\n", hit)  # one sample per line, however many statistics a long line holds
        position = max(hit + 1, start + stride, size if end < 0 else end + 1)
    # one counting pass: the server's own statistics line (SGLang decode, else vLLM), not both
    count = counter(chunk)
    metric_lines = count(COUNTED_NEEDLES[0]) or count(COUNTED_NEEDLES[1])
    return out, (position - size if out else 0), metric_lines


class _Columns:
    """The hit columns of a chunk, filled part by part (read line by line, or repeated)."""

    def __init__(self) -> None:
        self.lines: array[int] = array("q")
        self.contents: array[int] = array("q")  # a hit's key before its distance from the hit before
        self.ends: array[int] = array("q")
        self.rules: array[int] = array("l")
        self.raws: list[bytes | memoryview] = []
        self.rule_sets: dict[tuple[int, ...] | None, int] = {}
        self.context: dict[int, tuple[bytes, bytes]] = {}
        self.text_length = 0

    def read(
        self,
        scanner: Scanner,
        chunk: bytes,
        start: int,
        end: int,
        line_base: int,
        others: _Others | None = None,
        with_sampled: bool = True,
    ) -> None:
        """The hits of chunk[start:end] (whole lines, the first being line `line_base`), line by line; with
        `others` (the whole chunk), its statistics lines and checkpoints are placed in the same walk."""
        starts, line_rules = scanner.lines(
            chunk[start:end] if start or end < len(chunk) else chunk, with_sampled
        )
        count, find, size = counter(chunk), chunk.find, len(chunk)
        index, cursor = line_base, start
        # the columns as locals: this loop runs once per hit (120,000 times in a traceback flood's 100 MB)
        lines, contents, ends, rule_column, raws = self.lines, self.contents, self.ends, self.rules, self.raws
        rule_sets, text_length = self.rule_sets, self.text_length
        view = memoryview(chunk)
        next_other = size + 1 if others is None else others.next_at
        for relative, rules in zip(starts, line_rules, strict=True):
            offset = start + relative
            if next_other <= offset and others is not None:
                index, cursor = others.place(chunk, index, cursor, offset)
                next_other = others.next_at
            index += count(b"\n", cursor, offset)
            cursor = offset
            line_end = find(b"\n", offset)
            raw = chunk[offset : min(size if line_end < 0 else line_end, offset + MAX_PARSED_LINE_BYTES)]
            rule_set = rule_sets.get(rules)
            if rule_set is None:
                rule_set = rule_sets[rules] = len(rule_sets)
            shape: tuple[object, ...] = (raw.translate(None, _DIGITS), rules)
            last = raw[-1:]
            continues = (last == b"\\" or last.isspace() or b"erv" in raw) and _continues(raw)
            following = _following(chunk, offset) if continues else b""
            previous = b""
            if offset > 0 and raw.lstrip().startswith(b"Traceback"):  # (no search through a long line)
                previous = _line_at(chunk, chunk.rfind(b"\n", 0, offset - 1) + 1)
            if following or previous:
                self.context[len(lines)] = (following, previous)
                shape += (following.translate(None, _DIGITS), previous.translate(None, _DIGITS))
            lines.append(index)
            contents.append(hash(shape))
            text_length += len(raw)
            ends.append(text_length)
            rule_column.append(rule_set)
            # a long line's text joined from the chunk itself: its copy is dropped at once (a chunk of 1 MB
            # prompt lines held them twice, in both scan workers at the same time)
            raws.append(raw if len(raw) < _VIEWED_BYTES else view[offset : offset + len(raw)])
        self.text_length = text_length
        if others is not None:
            index, cursor = others.place(chunk, index, cursor, size + 1)
            others.lines = index + count(b"\n", cursor)

    def keys(self, repeated: tuple[int, int, int] | None) -> array[int]:
        """Each hit's key: its content and its distance from the hit before (the chunk's first: 0, the parse
        adds it). `repeated` (first hit, hits per block, blocks): the keys of the blocks after the second are
        the second's again."""
        lines, contents = self.lines, self.contents
        keys: array[int] = array("q", [0])

        def add(start: int, stop: int) -> None:
            for i in range(max(1, start), stop):
                keys.append(hash((contents[i], lines[i] - lines[i - 1])))

        if repeated is None:
            add(1, len(lines))
            return keys
        first, per_block, blocks = repeated
        add(1, first + 2 * per_block)
        keys.extend(keys[first + per_block : first + 2 * per_block] * (blocks - 2))
        add(first + per_block * blocks, len(lines))
        return keys


class _Others:
    """The sampled statistics lines and the line index's checkpoints of a chunk, given their line index as
    the walk over the hits passes them."""

    def __init__(self, chunk: bytes, sample_starts: list[int], checkpoints: list[int]) -> None:
        self.pending = sorted([(o, 1) for o in sample_starts] + [(o, 2) for o in checkpoints], reverse=True)
        self.next_at = self.pending[-1][0] if self.pending else len(chunk) + 1
        self.samples: list[tuple[int, bytes]] = []  # (line index, line)
        self.marks: list[tuple[int, int]] = []  # (line index, offset)
        self.lines = 0
        self._count = counter(chunk)

    def place(self, chunk: bytes, index: int, cursor: int, before: int) -> tuple[int, int]:
        """Places those at offsets up to `before`, counting on from line `index` at `cursor`."""
        pending = self.pending
        while pending and pending[-1][0] <= before:
            offset, kind = pending.pop()
            index += self._count(b"\n", cursor, offset)
            cursor = offset
            if kind == 2:
                self.marks.append((index, offset))
            else:
                self.samples.append((index, _line_at(chunk, offset)))
        self.next_at = pending[-1][0] if pending else len(chunk) + 1
        return index, cursor


def _period(text: bytes) -> tuple[int, int, int] | None:
    """(offset, block bytes, blocks) of the longest stretch found where each block of lines is the block before
    it again: a probe line's next copies give the candidate block lengths (a crash loop's run, or within it one
    rank's lines). Byte offsets in the text, not a list of its lines: splitting a chunk cost more than this."""
    total = len(text)
    best: tuple[int, int, int] | None = None
    for third in (0, total // 3, 2 * total // 3):
        start = text.find(b"\n", third - 1) + 1 if third else 0
        if third and start == 0:
            continue
        probe_at = -1
        for _ in range(64):  # the first line of 24 bytes or more from there
            end = text.find(b"\n", start)
            if end < 0:
                break
            if end - start >= 24:
                probe_at = start
                break
            start = end + 1
        if probe_at < 0:
            continue
        needle = b"\n" + text[probe_at : end + 1]
        seen = counted = probe_at
        lines = 0
        for _ in range(_MAX_PROBE_COPIES):
            seen = text.find(needle, seen) + 1  # the probe's next copy
            if seen == 0:
                break
            size = seen - probe_at
            lines += text.count(b"\n", counted, seen)
            counted = seen
            if probe_at + 2 * size > total or lines > _MAX_BLOCK_LINES:
                break
            # the blocks' last bytes first: a whole block copied out to compare was most of the search
            tail = min(size, 256)
            if text[seen - tail : seen] != text[seen + size - tail : seen + size] or (
                text[probe_at:seen] != text[seen : seen + size]
            ):
                continue
            blocks = 2
            while probe_at + (blocks + 1) * size <= total and (
                text[probe_at + (blocks - 1) * size : probe_at + blocks * size]
                == text[probe_at + blocks * size : probe_at + (blocks + 1) * size]
            ):
                blocks += 1
            begin = probe_at
            while (
                begin >= size
                and (begin == size or text[begin - size - 1] == _NEWLINE)  # whole lines before it
                and text[begin - size : begin] == text[begin : begin + size]
            ):
                begin -= size
                blocks += 1
            if best is None or blocks * size > best[1] * best[2]:
                best = (begin, size, blocks)
            if blocks * size * 2 > total:
                return best
    return best


def scan_chunk(
    scanner: Scanner,
    chunk: bytes,
    stride: int,
    next_sample: int,
    *,
    checkpoints: bool = False,
    with_sampled: bool = True,
) -> ChunkScan:
    sample_starts, next_sample, metric_lines = _samples(chunk, stride, next_sample)
    others = _Others(chunk, sample_starts, chunk_checkpoints(chunk) if checkpoints else [])
    columns = _Columns()
    repeats: Repeats | None = None
    repeated: tuple[int, int, int] | None = None
    found = (
        _repeated_blocks(scanner, chunk, columns, with_sampled)
        if INFER_REPEATS and len(chunk) >= _MIN_INFER_BYTES
        else None
    )
    if found is None:
        columns = _Columns()
        columns.read(scanner, chunk, 0, len(chunk), 0, others, with_sampled)
    else:
        repeats, repeated = found
        others.place(chunk, 0, 0, len(chunk) + 1)
        others.lines = counter(chunk)(b"\n")
    return ChunkScan(
        len(chunk),
        others.lines,
        columns.lines,
        columns.keys(repeated),
        columns.ends,
        b"".join(columns.raws),
        columns.rules,
        list(columns.rule_sets),
        columns.context,
        columns.contents[0] if columns.contents else 0,
        others.samples,
        metric_lines,
        next_sample,
        others.marks,
        repeats,
        with_sampled,
    )


def _repeated_blocks(
    scanner: Scanner, chunk: bytes, columns: _Columns, with_sampled: bool
) -> tuple[Repeats, tuple[int, int, int]] | None:
    """A crash loop's chunk: the lines before the repeats and the first block read line by line, the blocks
    that repeat it (every digit aside from its value: the same lines, each digit where the block has one)
    taken as its hits moved down, the last block and the rest read. None where the chunk has no such stretch.

    A rule reads a line's digits only as digits (a clock, a count), so the same line with other digits
    matches the same rules; the last block is read all the same (a file's last run is its diagnosis)."""
    middle = len(chunk) // 2
    sample = (middle, middle + _GATE_BYTES)
    if chunk.count(b"rror", *sample) + chunk.count(b'File "', *sample) < _MIN_ERROR_MARKS:
        return None  # a serving log, not a crash loop: not worth the search
    if len(chunk) > 2 * _PROBE_WINDOW_BYTES:
        # a block repeated in the chunk's middle megabyte first: a traceback flood has none, and made a copy of
        # every chunk to search for one (a loop of runs longer than a third of that is read line by line)
        start = chunk.find(b"\n", middle - _PROBE_WINDOW_BYTES // 2) + 1
        if _period(chunk[start : start + _PROBE_WINDOW_BYTES].translate(ONE_DIGIT)) is None:
            return None
    text = chunk.translate(ONE_DIGIT)  # its lines as long as the chunk's
    found = _period(text)
    if found is None:
        return None
    begin, length, blocks = found
    blocks -= 1  # the last block is read
    if blocks < 3:
        return None
    first, size = text.count(b"\n", 0, begin), text.count(b"\n", begin, begin + length)
    # where lines first, first + size, ... start in the chunk
    offsets = [0, *(begin + block * length for block in range(blocks + 1))]
    columns.read(scanner, chunk, 0, offsets[2], 0, None, with_sampled)
    block_hits = [i for i, line in enumerate(columns.lines) if line >= first]
    if not block_hits or any(columns.context.get(i, (b"",))[0] for i in block_hits):
        return None  # a dump or command read on into the lines after it: read those blocks too
    first_hit = len(columns.lines)
    count = len(block_hits) * (blocks - 1)
    relative = [columns.lines[i] + size for i in block_hits]
    for block in range(blocks - 1):
        columns.lines.extend(array("q", [line + block * size for line in relative]))
    columns.contents.extend(array("q", [columns.contents[i] for i in block_hits]) * (blocks - 1))
    columns.ends.extend(array("q", [columns.text_length]) * count)
    columns.rules.extend(array("l", [columns.rules[i] for i in block_hits]) * (blocks - 1))
    previous = bytes(1 if i in columns.context else 0 for i in block_hits)
    # the line before the repeated blocks (a bare traceback's `previous`), the first block, every block's digits
    before = chunk[chunk.rfind(b"\n", 0, offsets[2] - 1) + 1 : offsets[2] - 1]
    template = chunk[offsets[2] : offsets[3]]
    digits = chunk[offsets[2] : offsets[-1]].translate(None, _NOT_DIGITS)
    repeats = Repeats(first_hit, count, first + size - 1, before, template, digits, previous, size)
    columns.read(scanner, chunk, offsets[-1], len(chunk), first + blocks * size, None, with_sampled)
    return repeats, (first_hit - len(block_hits), len(block_hits), blocks)

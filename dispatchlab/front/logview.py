"""The log viewer: Pygments over a window of lines, and a bounded search, for logs of any size.

A page never touches more of the log than its window: lines are read by seeking to the nearest
offset of the core's sparse line index, so a 1 GiB log opens as fast as a 1 MB one. Search scans in
bounded slices and hands back where to continue. Only the Pygments formatter's output is marked
safe; every line goes through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import RegexLexer, bygroups
from pygments.lexers.special import TextLexer
from pygments.token import (
    Comment,
    Generic,
    Keyword,
    Name,
    Number,
    Operator,
    Punctuation,
    String,
    Text,
)

from dispatchlab.core.reading import LineIndex, decode_line

WINDOW = 200
# A line is shown up to this many characters (a ServerArgs dump fits; a 4 MB line does not).
DISPLAY_CHARS = 12_000
# Above this many characters in one window, lexing costs more than it helps: plain text instead.
HIGHLIGHT_BUDGET = 400_000
SEARCH_LIMIT = 200
SEARCH_SLICE_BYTES = 256 * 1024 * 1024
SEARCH_BLOCK_BYTES = 8 * 1024 * 1024
HIT_CHARS = 400


class ServerLogLexer(RegexLexer):
    """SGLang / vLLM server logs and the Python tracebacks inside them."""

    name = "Inference server log"
    aliases = ["serverlog"]
    flags = 0

    tokens = {
        "root": [
            (r"Traceback \(most recent call last\):", Generic.Heading),
            (
                r'(  File )("[^"\n]*")(, line )(\d+)(, in )(\S+)',
                bygroups(Text, String, Text, Number, Text, Name.Function),
            ),
            (r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?", Comment.Special),
            (r"\b\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?", Comment.Special),
            (r"\b(?:TP|DP|EP|PP)\d+\b|\brank[= ]?\d+\b|\bpid=\d+\b", Name.Label),
            (r"\b(?:ERROR|CRITICAL|FATAL|Error|error)\b", Generic.Error),
            (r"\b(?:WARNING|WARN|Warning)\b", Generic.Strong),
            (r"\b(?:INFO|DEBUG)\b", Keyword.Pseudo),
            (r"\b(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Warning)\b", Name.Exception),
            (r"\b(?:CUDA|NCCL|cuBLAS|cudnn|cuDNN)\b", Keyword),
            (r"\bsm_?\d{2,3}a?\b", Keyword.Type),
            (r"(\w+)(=)('[^'\n]*'|\"[^\"\n]*\"|[\w.+-]+)", bygroups(Name.Attribute, Operator, String)),
            (r"'[^'\n]{0,200}'", String),
            (r"\b\d+(?:\.\d+)?\b", Number),
            (r"[()\[\]{},:]", Punctuation),
            (r"[^\S\n]+", Text),
            (r"\w+", Text),
            (r"\n", Text),
            (r".", Text),
        ]
    }


@lru_cache(maxsize=1)
def _formatter() -> HtmlFormatter:  # type: ignore[type-arg]
    return HtmlFormatter(nowrap=True, classprefix="", cssclass="hl")


def pygments_css() -> str:
    """The stylesheet for the classes the viewer emits (see the pygments_css command)."""
    rules = str(HtmlFormatter(style="default").get_style_defs(".hl")).splitlines()
    # keep the token rules; the formatter also emits page-wide `pre` and line-number rules
    return "\n".join(rule for rule in rules if rule.startswith(".hl "))


def highlight_lines(lines: list[str]) -> list[SafeString]:
    """One HTML fragment per input line, from one Pygments pass over the whole window (so a
    traceback spanning lines lexes as one)."""
    if not lines:
        return []
    # Pygments turns a bare \r into a line break; keep one input line per output line.
    cleaned = [line.replace("\r", "\\r").replace("\f", "\\f").replace("\v", "\\v") for line in lines]
    text = "\n".join(cleaned) + "\n"
    lexer: Any
    if len(text) > HIGHLIGHT_BUDGET:
        lexer = TextLexer(stripnl=False, ensurenl=True)
    else:
        lexer = ServerLogLexer(stripnl=False, stripall=False, ensurenl=True)
    out = highlight(text, lexer, _formatter())
    pieces = out.split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    if len(pieces) != len(cleaned):
        # the formatter should give one line per line; if it ever does not, fall back to escaping
        return [escape(line) for line in cleaned]
    # the formatter escaped every character of the log text; its output is the only safe-marked text
    return [mark_safe(piece) for piece in pieces]


def read_lines(
    index: LineIndex, first: int, count: int, *, max_chars: int = DISPLAY_CHARS
) -> list[tuple[str, int]]:
    """Lines first..first+count-1 as (text, full length in bytes), each cut to max_chars.

    Like LineIndex.lines, but never reads more than max_chars of a line into memory, so a window
    of 4 MB lines costs what a window of short ones does."""
    if first < 1 or count <= 0 or not index.offsets:
        return []
    slot = min((first - 1) // index.every, len(index.offsets) - 1)
    skip = first - 1 - slot * index.every
    limit = max_chars * 4 + 4  # UTF-8: up to 4 bytes a character
    out: list[tuple[str, int]] = []
    with Path(index.text_path).open("rb") as handle:
        handle.seek(index.offsets[slot])
        while len(out) < count:
            raw = handle.readline(limit)
            if not raw:
                break
            length = len(raw)
            complete = raw.endswith(b"\n")
            while not complete:
                rest = handle.readline(1024 * 1024)
                if not rest:
                    break
                length += len(rest)
                complete = rest.endswith(b"\n")
            if skip:
                skip -= 1
                continue
            text = decode_line(raw.rstrip(b"\n"))
            out.append((text[:max_chars], length - (1 if complete else 0)))
    return out


@dataclass
class Row:
    number: int
    html: SafeString
    classes: str
    cut: int = 0  # characters not shown
    source: str | None = None  # set on the first line of each file of the report


@dataclass
class Window:
    first: int
    last: int
    line_count: int
    rows: list[Row]
    target: int | None
    prev_first: int | None
    next_first: int | None
    sources: list[dict[str, Any]] = field(default_factory=list)


def window_bounds(line_count: int, *, line: int | None = None, start: int | None = None) -> int:
    """The first line of the window: centred on `line`, or starting at `start`, kept inside the log."""
    last_start = max(1, line_count - WINDOW + 1)
    if line is not None:
        first = line - WINDOW // 2
    elif start is not None:
        first = start
    else:
        first = 1
    return max(1, min(first, last_start))


def log_window(
    index: LineIndex,
    line_count: int,
    *,
    line: int | None = None,
    start: int | None = None,
    evidence: set[int] | frozenset[int] = frozenset(),
    crash: int | None = None,
    needle: str = "",
    sources: list[dict[str, Any]] | None = None,
) -> Window:
    first = window_bounds(line_count, line=line, start=start)
    raw = read_lines(index, first, WINDOW)
    fragments = highlight_lines([text for text, _ in raw])
    needle_lower = needle.lower()
    starts = {}
    for source in sources or []:
        if isinstance(source, dict) and isinstance(source.get("first_line"), int):
            starts[source["first_line"]] = str(source.get("name") or "")
    rows = []
    for offset, ((text, length), fragment) in enumerate(zip(raw, fragments, strict=True)):
        number = first + offset
        classes = []
        if number == line:
            classes.append("target")
        if number in evidence:
            classes.append("evidence")
        if number == crash:
            classes.append("crash")
        if needle_lower and needle_lower in text.lower():
            classes.append("hit")
        cut = max(0, length - len(text.encode("utf-8")))
        rows.append(Row(number, fragment, " ".join(classes), cut, starts.get(number)))
    last = first + len(rows) - 1
    total = max(line_count, last)
    return Window(
        first=first,
        last=last,
        line_count=total,
        rows=rows,
        target=line,
        prev_first=max(1, first - WINDOW) if first > 1 else None,
        next_first=last + 1 if last < total else None,
        sources=list(sources or []),
    )


@dataclass
class SearchResult:
    needle: str
    hits: list[tuple[int, str]]
    start: int
    scanned_to: int  # the last line looked at
    next_start: int | None  # where "search on" continues, when the slice or the hit limit ran out
    truncated_hits: bool = False


def search_log(
    index: LineIndex,
    needle: str,
    *,
    start: int = 1,
    limit: int = SEARCH_LIMIT,
    slice_bytes: int = SEARCH_SLICE_BYTES,
    block_bytes: int = SEARCH_BLOCK_BYTES,
) -> SearchResult:
    """Lines containing needle (ASCII case-insensitive) from line `start` on.

    Scans whole blocks with bytes.find instead of line by line, and stops after `slice_bytes` so one
    request on a gigabyte log stays bounded; next_start says where to go on."""
    wanted = needle.encode("utf-8").lower()
    start = max(1, start)
    if not wanted or not index.offsets:
        return SearchResult(needle, [], start, start - 1, None)
    slot = min((start - 1) // index.every, len(index.offsets) - 1)
    number = slot * index.every + 1  # line number of the first line in `block`
    hits: list[tuple[int, str]] = []
    scanned = 0
    with Path(index.text_path).open("rb") as handle:
        handle.seek(index.offsets[slot])
        carry = b""
        while True:
            data = handle.read(block_bytes)
            at_end = not data
            block = carry + data
            if not block:
                break
            cut = len(block) if at_end else block.rfind(b"\n") + 1
            if cut == 0:  # one line longer than a block: keep reading
                carry = block
                continue
            carry = block[cut:]
            block = block[:cut]
            lowered = block.lower()
            pos = lowered.find(wanted)
            counted_to, line_of_pos = 0, number
            while pos != -1:
                line_of_pos += block.count(b"\n", counted_to, pos)
                counted_to = pos
                line_start = block.rfind(b"\n", 0, pos) + 1
                line_end = block.find(b"\n", pos)
                if line_end == -1:
                    line_end = len(block)
                if line_of_pos >= start:
                    text = decode_line(block[line_start : min(line_end, line_start + HIT_CHARS * 4)])
                    hits.append((line_of_pos, text[:HIT_CHARS]))
                    if len(hits) >= limit:
                        return SearchResult(needle, hits, start, line_of_pos, line_of_pos + 1, True)
                pos = lowered.find(wanted, line_end)
            lines_in_block = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
            number += lines_in_block
            scanned += len(block)
            if at_end:
                break
            if scanned >= slice_bytes:
                return SearchResult(needle, hits, start, number - 1, number)
    return SearchResult(needle, hits, start, number - 1, None)

"""The log viewer: Pygments over a window of lines, and a bounded search, for logs of any size.

A page never touches more of the log than its window: lines are read by seeking to the nearest
offset of the core's sparse line index, so a 1 GiB log opens as fast as a 1 MB one. Search scans in
bounded slices and hands back where to continue. Only the Pygments formatter's output is marked
safe; every line goes through it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers.special import TextLexer
from pygments.token import Comment, Generic, Keyword, Name, Number, Operator, String, Text

from dispatchlab.core.lineindex import LineIndex

WINDOW = 200
# A line is shown up to this many characters (a ServerArgs dump fits; a 4 MB line does not).
# Above this many characters in one window, lexing costs more than it helps: plain text instead.
HIGHLIGHT_BUDGET = 400_000


# Python's re costs about as much per character for any unanchored pattern, so the lexer works
# line by line: one anchored match for the line's prefix (time stamp, rank, level), then the other
# patterns only on lines that contain their cheap marker (`=`, a quote, a keyword).
_PREFIX = re.compile(
    r"(?P<open>\[)(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)(?P<rank>(?: [A-Z]{2}\d+)*)(?P<close>\])"
    r"|(?P<proc>\([\w ]{1,40}(?:rank=\d+)?(?: pid=\d+)?\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<vts>\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)"
)
_FRAME = re.compile(r'(  File )("[^"]*")(, line )(\d+)(, in )(\S+)')
_EXCEPTION = re.compile(r"\s*(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Interrupt|Exit)\b")
_WORD_MARKERS = (
    "ERROR",
    "Error",
    "error",
    "WARN",
    "Warn",
    "CRITICAL",
    "FATAL",
    "CUDA",
    "NCCL",
    "OOM",
    "sm_",
    "Traceback",
)
_WORDS = re.compile(
    r"(?P<err>\b(?:ERROR|CRITICAL|FATAL|Error|error)\b)|(?P<warn>\b(?:WARNING|WARN|Warning)\b)"
    r"|(?P<kw>\b(?:CUDA|NCCL|OOM)\b)|(?P<arch>\bsm_?\d{2,3}[af]?\b)|(?P<tb>Traceback \(most recent call last\):)"
)
_WORD_TOKENS = {
    "err": Generic.Error,
    "warn": Generic.Strong,
    "kw": Keyword,
    "arch": Keyword.Type,
    "tb": Generic.Heading,
}
_KV = re.compile(r"\b([A-Za-z_]\w*)=('[^'\n]{0,300}'|\"[^\"\n]{0,300}\"|[\w.+-]+)")
_QUOTED = re.compile(r"'[^'\n]{1,200}'")
Token = tuple[int, Any, str]


def _spans(rest: str, offset: int) -> list[Token]:
    """Tokens of the message part of a line: keywords, key=value pairs, quoted strings."""
    found: list[tuple[int, int, list[Token]]] = []
    if any(marker in rest for marker in _WORD_MARKERS):
        for m in _WORDS.finditer(rest):
            found.append(
                (m.start(), m.end(), [(offset + m.start(), _WORD_TOKENS[m.lastgroup or "err"], m.group())])
            )
    if "=" in rest:
        for m in _KV.finditer(rest):
            found.append(
                (
                    m.start(),
                    m.end(),
                    [
                        (offset + m.start(1), Name.Attribute, m.group(1)),
                        (offset + m.end(1), Operator, "="),
                        (offset + m.start(2), String, m.group(2)),
                    ],
                )
            )
    elif "'" in rest:
        for m in _QUOTED.finditer(rest):
            found.append((m.start(), m.end(), [(offset + m.start(), String, m.group())]))
    found.sort(key=lambda item: item[0])
    out: list[Token] = []
    at = 0
    for start, end, tokens in found:
        if start < at:  # overlaps an earlier span: keep the earlier one
            continue
        if start > at:
            out.append((offset + at, Text, rest[at:start]))
        out.extend(tokens)
        at = end
    if at < len(rest):
        out.append((offset + at, Text, rest[at:]))
    return out


def _line_tokens(line: str, offset: int) -> list[Token]:
    if line.startswith("  File "):
        m = _FRAME.match(line)
        if m:
            kinds = (Text, String, Text, Number, Text, Name.Function)
            tokens = [(offset + m.start(i), kind, m.group(i)) for i, kind in enumerate(kinds, 1)]
            if m.end() < len(line):
                tokens.append((offset + m.end(), Text, line[m.end() :]))
            return tokens
        return [(offset, Text, line)]
    tokens: list[Token] = []
    at = 0
    m = _PREFIX.match(line)
    if m and m.group("ts"):
        tokens += [(offset, Text, "["), (offset + 1, Comment.Special, m.group("ts"))]
        if m.group("rank"):
            tokens.append((offset + m.start("rank"), Name.Label, m.group("rank")))
        tokens.append((offset + m.start("close"), Text, "]"))
        at = m.end()
    elif m:
        if m.group("proc"):
            tokens.append((offset, Name.Label, m.group("proc")))
        level = m.group("level")
        kind = (
            Generic.Error
            if level in ("ERROR", "CRITICAL")
            else Generic.Strong
            if level == "WARNING"
            else Keyword.Pseudo
        )
        tokens += [(offset + m.start("level"), kind, level), (offset + m.end("level"), Text, " ")]
        tokens.append((offset + m.start("vts"), Comment.Special, m.group("vts")))
        at = m.end()
    e = _EXCEPTION.match(line, at)
    if e:
        tokens.append((offset + at, Name.Exception, e.group()))
        at = e.end()
    tokens += _spans(line[at:], offset + at)
    return tokens


class ServerLogLexer(Lexer):
    """SGLang / vLLM server logs and the Python tracebacks inside them."""

    name = "Inference server log"
    aliases = ["serverlog"]

    def get_tokens_unprocessed(self, text: str) -> Iterator[Token]:
        offset = 0
        for line in text.split("\n"):
            yield from _line_tokens(line, offset)
            offset += len(line)
            if offset < len(text):
                yield offset, Text, "\n"
                offset += 1


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
    raw = index.read_lines(first, WINDOW)
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


_ROW = '<tr id="L{}"{}><td class="ln"><a href="#L{}">{}</a></td><td class="code">{}{}</td></tr>'
_SOURCE_ROW = '<tr class="source-start"><td></td><td>── {} ──</td></tr>'


def render_rows(window: Window) -> SafeString:
    """The window's table rows. Built here rather than in a template loop: 200 rows through the
    template engine cost more than reading and highlighting them. Every value goes through
    format_html (escaped); the code cell is the formatter's output."""

    def rows() -> Iterator[SafeString]:
        for row in window.rows:
            if row.source is not None:
                yield format_html(_SOURCE_ROW, row.source)
            number = str(row.number)
            yield format_html(
                _ROW,
                number,
                format_html(' class="{}"', row.classes) if row.classes else "",
                number,
                number,
                row.html,
                format_html('<span class="cut"> … {} more bytes on this line</span>', f"{row.cut:,}")
                if row.cut
                else "",
            )

    return format_html_join("\n", "{}", ((row,) for row in rows()))

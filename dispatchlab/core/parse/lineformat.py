"""Line prefixes of the servers and the wrappers around them, stripped while keeping the rank.

SGLang:  `[2026-01-28 20:52:56 DP1 TP3 EP3] msg` (tags order-free, absent when their size is 1)
vLLM:    `(Worker_TP4_EP4 pid=2532) ERROR 12-29 15:21:11 [file.py:751] msg`, `(VllmWorker rank=N pid=P) ...`
Wrappers: docker compose `name  | `, kubectl/docker `2026-...Z `, torchrun `[rank0]:`, Ray `(SGLangEngine pid=N)`,
TRT-LLM `[TRT-LLM] [I]`, syslog.
"""

from __future__ import annotations

import re
from functools import lru_cache

from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.records import record

_VLLM_HEAD = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d{2}-\d{2} \d{2}:\d{2}:\d{2}"


class _Gated:
    """A pattern tried only on text where a quick search finds a piece every match of it holds: its
    backtracking took milliseconds to fail on a megabyte line without it."""

    def __init__(self, piece: re.Pattern[str], pattern: re.Pattern[str]) -> None:
        self.piece = piece
        self.pattern = pattern

    def match(self, text: str) -> re.Match[str] | None:
        if "|" not in text or self.piece.search(text) is None:
            return None
        return self.pattern.match(text)


_ANSI = lazy_compile(r"\x1b\[[\d;]*m")
_WRAPPERS: list[re.Pattern[str] | _Gated] = [
    # (each with what _wrapper tests first: a '|' in the line; a '-' fifth; a space fourth; an 'L' or a space
    # first; a '-' fifth; a '|')
    lazy_compile(r"^[\w.-]+(?:-\d+)?\s+\|\s?"),  # docker compose "svc-1  | "
    lazy_compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})\s"),  # docker logs -t
    lazy_compile(r"^[A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \S+ [^:\[\s]+(?:\[\d+\])?: "),  # syslog
    lazy_compile(r"^\s*Line \d+: "),
    # Python logging around a vLLM line: "2025-08-13 04:39:39,318 - __main__ - INFO - INFO 08-13 04:39:39 ..."
    lazy_compile(
        r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)? - [\w.<>-]+ - [A-Z]+ - (?=" + _VLLM_HEAD + ")"
    ),
    # a tqdm bar the vLLM line was printed after: "...  0%|          | 0/500 [00:00<?, ?it/s]INFO 07-09 ..."
    _Gated(
        lazy_compile(r"\](?=" + _VLLM_HEAD + ")"),
        lazy_compile(r"^[^|]*\|[^|]*\|[^\]]*\](?=" + _VLLM_HEAD + ")"),
    ),
]
_TORCHRUN = lazy_compile(r"^\[(?:default)?rank(\d+)\]:\s?")
_RAY = lazy_compile(r"^\((?P<actor>[A-Za-z]\w*) pid=(?P<pid>\d+)(?:,\s*ip=[\d.]+)?\)\s*")
_SGL = lazy_compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:[.,](?P<ms>\d{1,6}))?"
    r"(?P<ranks>(?:\s+(?:DP|PP|ATTN_CP|MOE_DP|TP|EP|CP)\d+)*)\]\s?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?:(?P<src>[\w./-]+\.py:\d+):\s+)?)?"
)
_VLLM = lazy_compile(
    # nested process prefixes ("(Worker pid=1) (Worker_TP1 pid=1) ERROR ..."): the innermost names the rank
    r"^(?:\([^()]*? pid=\d+(?:,\s*ip=[\d.]+)?\)\s+)*?"
    r"(?:\((?P<proc>[^()]*?)(?: rank=(?P<vrank>\d+))? pid=(?P<pid>\d+)(?:,\s*ip=[\d.]+)?\)\s+)?"
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) (?P<md>\d{2}-\d{2}) (?P<hms>\d{2}:\d{2}:\d{2})(?:\.\d+)? "
    r"\[?(?P<src>[^\]\s]+?)(?::(?P<lineno>\d+))?\] ?"
)
_VLLM_PROC_ONLY = lazy_compile(
    r"^(?:\([A-Za-z]\w*(?: rank=\d+)? pid=\d+(?:,\s*ip=[\d.]+)?\)\s+)*"
    r"\((?P<proc>[A-Za-z][\w]*?)(?: rank=(?P<vrank>\d+))? pid=(?P<pid>\d+)(?:,\s*ip=[\d.]+)?\)\s?"
)
_TRTLLM = lazy_compile(
    r"^(?:\[(?P<ts>\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2})\] )?\[TRT-LLM\](?: \[RANK (?P<rank>\d+)\])? \[(?P<lvl>[A-Z])\]\s?"
)
_PY_LOGGING = lazy_compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:,\d{3})? - (?P<level>[A-Z]+) - (?:[\w.]+:\d+ - )?"
)
_PLAIN_LEVEL_TS = lazy_compile(
    r"^(?P<level>INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})\S*\s+"
)
_GLOG = lazy_compile(
    r"^\[?(?P<lvl>[EWIF])(?P<mo>\d{2})(?P<dd>\d{2}) (?P<hms>\d{2}:\d{2}:\d{2})\.\d+ +(?:\d+ )?[\w./-]+:\d+\]\s?"
)
_NCCL = lazy_compile(r"^(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?=NCCL )")
VLLM_PROCESSES = lazy_compile(
    r"^(?:APIServer|EngineCore|Worker|VllmWorker|RayWorker|DPCoordinator|MultiprocExecutor)"
)
# Python 3.11 exception groups draw a gutter: "  + Exception Group Traceback", "  |   File ...", "  | ValueError: x"
_GUTTER = lazy_compile(r"^\s+(?:[|+](?:-+\+?[-\d ]*)?\s?)+")


def _strip_gutter(text: str) -> str:
    if "|" not in text and "+" not in text:  # a gutter has either
        return text
    m = _GUTTER.match(text)
    return text[m.end() :] if m and m.end() < len(text) else text


_RANK_TAG = lazy_compile(r"(DP|PP|ATTN_CP|MOE_DP|TP|EP|CP)(\d+)")

LEVELS = {"W": "WARNING", "E": "ERROR", "I": "INFO", "D": "DEBUG", "F": "CRITICAL", "WARN": "WARNING"}


@record(slots=True)
class Line:
    number: int
    raw: str
    msg: str
    time: str | None = None  # ISO-8601 (vLLM lines have no year: "MM-DDTHH:MM:SS" prefixed by "0000-")
    rank: str | None = None  # "TP3", "DP1 TP3 EP3", "Worker_TP4_EP4", "rank0"
    level: str | None = None
    style: str = "plain"  # "sglang" | "vllm" | "trtllm" | "plain"
    prefixed: bool = False


@lru_cache(maxsize=1024)  # a log's lines carry a few rank tags again and again
def _sglang_rank(tags: str) -> str | None:
    found = _RANK_TAG.findall(tags)
    if not found:
        return None
    order = {"DP": 0, "PP": 1, "ATTN_CP": 2, "MOE_DP": 3, "CP": 3, "TP": 4, "EP": 5}
    return " ".join(f"{k}{v}" for k, v in sorted(found, key=lambda kv: order.get(kv[0], 9)))


def vllm_rank(proc: str | None, vrank: str | None) -> str | None:
    if not proc:
        return None
    if vrank is not None:
        return f"{proc} rank={vrank}" if proc != "VllmWorker" else f"VllmWorker rank={vrank}"
    return proc


def _has_escape(text: str) -> bool:
    # one character first: a search for two took a millisecond on a megabyte line
    return "\x1b" in text and "\x1b[" in text


def _wrapper(text: str) -> re.Match[str] | None:
    """The first wrapper whose match at the text's start leaves some text. Each is tried only where a quick
    test finds what any match of it holds: a line is tried against all of them, and most have none."""
    pipe, dashed, first = "|" in text, text[4:5] == "-", text[:1]
    for holds, wrapper in zip(
        (pipe, dashed, text[3:4] == " ", first == "L" or first.isspace(), dashed, pipe),
        _WRAPPERS,
        strict=True,
    ):
        if holds:
            m = wrapper.match(text)
            if m and len(m.group(0)) < len(text):
                return m
    return None


def _unwrap(text: str) -> tuple[str, str | None]:
    """Strip wrappers (compose, docker -t, syslog, torchrun, Ray actors): the text and a torchrun rank."""
    if text[:1] == "[" and text[1:2].isdigit() and "|" not in text and "\x1b" not in text:
        return text, None  # SGLang's clock, most lines of its logs: no wrapper starts so or holds neither
    return _unwrap_all(text)


def _unwrap_all(text: str) -> tuple[str, str | None]:
    rank: str | None = None
    if _has_escape(text):
        text = _ANSI.sub("", text)  # Ray colours its actor prefixes
    for _ in range(3):
        wrapped = _wrapper(text)
        if wrapped is None:
            break
        text = text[wrapped.end() :]
    m = _TORCHRUN.match(text) if text[:1] == "[" else None
    if m:
        rank = f"rank{m.group(1)}"
        text = text[m.end() :]
    actor = _RAY.match(text) if text[:1] == "(" else None
    if actor and not text.startswith("(Worker") and "pid=" in actor.group(0):
        after = text[actor.end() :]
        if after.startswith("["):
            text = after
    return text, rank


# Each format below first tests a character its prefix starts with (or holds): a line is tried against each
def _sglang(number: int, raw: str, text: str, rank: str | None, year: str | None) -> Line | None:
    m = _SGL.match(text) if text[:1] == "[" else None
    if not m:
        return None
    ts = m.group("ts").replace(" ", "T") + ("." + m.group("ms") if m.group("ms") else "")
    rank = _sglang_rank(m.group("ranks")) or rank
    return Line(number, raw, text[m.end() :], ts, rank, m.group("level"), "sglang", True)


def _vllm(number: int, raw: str, text: str, rank: str | None, year: str | None) -> Line | None:
    first = text[:1]
    if first not in _VLLM_FIRST:
        return None
    m = _VLLM.match(text)
    if m:
        ts = f"{year or '0000'}-{m.group('md')}T{m.group('hms')}"
        rank = vllm_rank(m.group("proc"), m.group("vrank")) or rank
        return Line(
            number,
            raw,
            text[m.end() :],
            ts,
            rank,
            LEVELS.get(m.group("level"), m.group("level")),
            "vllm",
            True,
        )
    m = _VLLM_PROC_ONLY.match(text) if first == "(" else None
    if not m:
        return None
    rest = text[m.end() :]
    if not VLLM_PROCESSES.match(m.group("proc")):
        # another framework's Ray actor (SGLangEngine, ...): a bare continuation line of its output
        return Line(number, raw, _strip_gutter(rest), None, rank, None, "plain", rank is not None)
    return Line(
        number, raw, rest, None, vllm_rank(m.group("proc"), m.group("vrank")) or rank, None, "vllm", True
    )


def _trtllm(number: int, raw: str, text: str, rank: str | None, year: str | None) -> Line | None:
    m = _TRTLLM.match(text) if text[:1] == "[" else None
    if not m:
        return None
    ts = None
    if m.group("ts"):
        mdy, hms = m.group("ts").split("-", 1)
        mo, dd, yy = mdy.split("/")
        ts = f"{yy}-{mo}-{dd}T{hms}"
    rank = f"rank{m.group('rank')}" if m.group("rank") else rank
    return Line(number, raw, text[m.end() :], ts, rank, LEVELS.get(m.group("lvl")), "trtllm", True)


def _other(number: int, raw: str, text: str, rank: str | None, year: str | None) -> Line | None:
    first = text[:1]
    m = _GLOG.match(text) if first in _GLOG_FIRST else None
    if m:  # PyTorch C++ (glog) lines: [E814 11:45:02.123456 ProcessGroupNCCL.cpp:632]
        ts = f"{year or '0000'}-{m.group('mo')}-{m.group('dd')}T{m.group('hms')}"
        return Line(number, raw, text[m.end() :], ts, rank, LEVELS.get(m.group("lvl"), "INFO"), "plain", True)
    m = _NCCL.match(text) if ":" in text else None
    if m:  # NCCL_DEBUG lines: host:pid:tid [cuda device] NCCL ...
        return Line(number, raw, text[m.end() :], None, rank or f"dev{m.group('dev')}", None, "plain", True)
    m = (_PY_LOGGING.match(text) if text[4:5] == "-" else None) or (
        _PLAIN_LEVEL_TS.match(text) if first in _LEVEL_FIRST else None
    )
    if m:
        ts = m.group("ts").replace(" ", "T")
        return Line(number, raw, text[m.end() :], ts, rank, m.group("level"), "plain", True)
    return None


_FORMATS = (_sglang, _vllm, _trtllm, _other)
_LEVEL_FIRST = ("D", "I", "W", "E", "C")  # DEBUG INFO WARNING WARN ERROR CRITICAL
_VLLM_FIRST = ("(", *_LEVEL_FIRST)
_GLOG_FIRST = ("[", "E", "W", "I", "F")
_INDENTS = (" ", "\t")


def split_line(number: int, raw: str, year_hint: str | None = None) -> Line:
    """Strip the known prefixes of one line (already decoded, without newline)."""
    if raw[:1] in _INDENTS and "|" not in raw and "Line " not in raw and not _has_escape(raw):
        # an indented line (a traceback's frames and code): no prefix can start with a space
        return Line(number, raw, _strip_gutter(raw), None, None, None, "plain", False)
    text, rank = _unwrap(raw)
    for parse in _FORMATS:
        line = parse(number, raw, text, rank, year_hint)
        if line is not None:
            return line
    return Line(number, raw, _strip_gutter(text), None, rank, None, "plain", rank is not None)

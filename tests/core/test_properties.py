"""No input makes the parser raise: random bytes, random mixes of real line shapes, mangled dumps."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatchlab.core.matching import diagnose
from dispatchlab.core.parse import ExtraPatterns, parse_sources
from dispatchlab.core.reading import Source, iter_chunks
from dispatchlab.core.serverargs import parse_launch_command, parse_server_args
from dispatchlab.core.signatures import load_knowledge_base

from .helpers import LOGS

REAL_LINES = [
    line
    for path in sorted(LOGS.glob("*.log"))
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
]
FRAGMENTS = [
    "Traceback (most recent call last):",
    "During handling of the above exception, another exception occurred:",
    '  File "/x/sglang/srt/a.py", line 1, in f',
    "RuntimeError: boom",
    "Exception:",
    "server_args=ServerArgs(",
    "[2026-01-01 00:00:00 TP0] ",
    "(Worker_TP0 pid=1) ERROR 01-01 00:00:00 [a.py:1] ",
    "Capture cuda graph begin.",
    "Capture draft cuda graph end. Time elapsed: x s.",
    "Decode batch, #running-req: 1",
    "GPU 0,1: NVIDIA",
    "GPU 0 Compute Capability: 99.9",
    ")",
    "(",
    "'",
    '"',
    "\\",
    "\x1b[31m",
    "\r",
    "\x00",
    "Killed",
    "exit code: -9",
]
line_strategy = st.one_of(st.sampled_from(REAL_LINES), st.sampled_from(FRAGMENTS), st.text(max_size=200))
KB = load_knowledge_base()


def _source(data: bytes) -> Source:
    return Source("fuzz.log", lambda: io.BytesIO(data), len(data))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(line_strategy, max_size=60))
def test_any_mix_of_log_lines_parses_and_matches_without_raising(lines: list[str]):
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    parsed = parse_sources([_source(data)], extra=ExtraPatterns(tuple(KB.patterns)))
    doc = diagnose(parsed, KB).to_dict()
    assert doc["outcome"] in ("crashed", "ready", "serving", "incomplete")
    assert doc["failure_class"]


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=3000))
def test_arbitrary_bytes_parse_without_raising(data: bytes):
    parse_sources([_source(data)])
    assert sum(chunk.count(b"\n") for chunk in iter_chunks(_source(data))) >= data.count(b"\n") - data.count(
        b"\r\n"
    )


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_mangled_args_dumps_and_launch_commands_never_raise(text: str):
    parse_server_args("ServerArgs(" + text)
    parse_launch_command("python -m sglang.launch_server " + text)


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(["[2026-01-28 20:52:56 TP0] ", "[1784273406.684686] ", "[2", "[2025-09-12T15:42:57Z] "]),
    st.lists(
        st.sampled_from(
            [*"abcXYZ019 :-_.[]()\"'/=,", "rank0]:", "(Worker pid=3) ", "INFO 01-01 ", "Line 3: "]
        ),
        max_size=30,
    ).map("".join),
)
def test_a_line_that_starts_with_a_clock_is_split_as_if_every_wrapper_were_tried(start, rest):
    """split_line's shortcut for SGLang's clock (`[` and a digit, no `|`, no escape) gives what trying every
    wrapper gives: each wrapper's line starts otherwise or holds a `|`."""
    from dispatchlab.core.parse import lineformat

    text = start + rest
    assert lineformat._unwrap(text) == lineformat._unwrap_all(text) == (text, None)

"""A rule's Hyperscan gate stands in for the rule in the scan: it must put forward every line the rule
matches (else a line is silently not read), on real-shaped fixtures and on generated lines alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchlab.core.parse import scanner as scanner_module
from dispatchlab.core.parse.lineformat import split_line
from dispatchlab.core.parse.rules import GATES, RULES
from dispatchlab.core.reading import decode_line

from .helpers import ROOT
from .test_scanner import ROUTINE_LINES

FIXTURES = ROOT / "tests" / "fixtures"
GATED = sorted(GATES)

pytestmark = pytest.mark.skipif(not scanner_module.hyperscan_enabled(), reason="Hyperscan is not installed")


@pytest.fixture(scope="module")
def gated_scanner() -> scanner_module.Scanner:
    return scanner_module.Scanner([RULES[name] for name in GATED], [GATES[name] for name in GATED])


def _missed(scanner: scanner_module.Scanner, raws: list[bytes]) -> list[tuple[str, bytes]]:
    """(rule, line) for each line a gated rule matches that its gate did not put forward."""
    chunk = b"\n".join(raws) + b"\n"
    candidates = scanner.candidates(chunk)
    missed = []
    start = 0
    for number, raw in enumerate(raws, 1):
        message = split_line(number, decode_line(raw)).msg
        put_forward = candidates.get(start, set())
        for index, name in enumerate(GATED):
            if re.search(RULES[name], message) and put_forward is not None and index not in put_forward:
                missed.append((name, raw))
        start += len(raw) + 1
    return missed


def _fixture_lines() -> list[bytes]:
    lines: list[bytes] = []
    for path in sorted(FIXTURES.rglob("*.log")):
        lines += [raw for raw in path.read_bytes().split(b"\n") if b"\0" not in raw][:20000]
    return lines


def test_every_gated_rule_has_a_gate_that_is_not_the_rule_itself():
    assert {"exception_quoted", "http_answer", "gen_words"} <= set(GATES)
    for name in GATED:
        assert GATES[name] != RULES[name]


def test_each_gate_puts_forward_every_fixture_line_its_rule_matches(gated_scanner):
    lines = _fixture_lines()
    assert len(lines) > 5000
    matched = {
        name: sum(bool(re.search(RULES[name], line.decode("utf-8", "replace"))) for line in lines)
        for name in GATED
    }
    assert all(matched.values()), (
        f"a gated rule matches no fixture line, so this test checks nothing: {matched}"
    )
    assert _missed(gated_scanner, lines) == []


def test_a_routine_line_is_put_forward_by_no_gate(gated_scanner):
    chunk = "\n".join(ROUTINE_LINES).encode() + b"\n"
    assert gated_scanner.candidates(chunk) == {}


WORD = st.text(alphabet=st.sampled_from("abcxyzABQ_-.,!?'é中ü"), min_size=1, max_size=26).filter(
    lambda w: w[0].isalpha()
)
SEPARATOR = st.sampled_from([" ", " ", " ", "  ", "\t", " 7 ", ", "])


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """A log line of words, numbers and separators, sometimes behind a log prefix, sometimes with an
    exception or an access-log answer in it."""
    words = draw(st.lists(st.tuples(WORD, SEPARATOR), min_size=0, max_size=30))
    body = "".join(word + separator for word, separator in words)
    extra = draw(
        st.sampled_from(
            [
                "",
                " torch.OutOfMemoryError: CUDA out of memory",
                " (ValueError: bad",
                ' 127.0.0.1:4000 - "POST /generate HTTP/1.1" 503 Service Unavailable',
                '"GET /health HTTP/2" 404',
            ]
        )
    )
    prefix = draw(st.sampled_from(["", "[2026-01-01 00:00:00 TP0] ", "INFO 01-01 00:00:00 [x.py:1] ", "  "]))
    return (prefix + body + extra).encode()


@settings(max_examples=300, deadline=None)
@given(st.lists(lines(), min_size=1, max_size=8))
def test_gates_put_forward_every_generated_line_their_rules_match(raws):
    scanner = scanner_module.Scanner([RULES[name] for name in GATED], [GATES[name] for name in GATED])
    assert _missed(scanner, raws) == []


def test_a_word_loop_behind_a_log_prefix_is_still_judged(tmp_path: Path):
    """The end-to-end effect: a loop of one word, put forward by the gate, is judged garbage."""
    from dispatchlab.core.matching import diagnose_sources
    from dispatchlab.core.reading import open_sources

    log = tmp_path / "rollout.log"
    log.write_text(
        "[2026-01-01 00:00:00] sample 3: " + "the answer is " + "over " * 40 + "\n"
        "[2026-01-01 00:00:01] step 4 done\n"
    )
    document = diagnose_sources(open_sources([log])).to_dict()
    assert [error["kind"] for error in document["errors"]] == ["garbage_output"]
    assert "'over' is repeated 40 times" in document["errors"][0]["text"]

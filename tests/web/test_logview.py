from __future__ import annotations

from pathlib import Path

import pytest

from dispatchlab.core.lineindex import DISPLAY_CHARS, LineIndex, write_line_index
from dispatchlab.front.logview import (
    WINDOW,
    highlight_lines,
    log_window,
    window_bounds,
)


def _index(tmp_path: Path, lines: list[str], checkpoint_bytes: int = 512) -> LineIndex:
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    text, idx = tmp_path / "text.log", tmp_path / "lines.idx"
    assert write_line_index([log], text, idx, checkpoint_bytes=checkpoint_bytes) == len(lines)
    return LineIndex(text, idx)


@pytest.fixture
def big(tmp_path):
    lines = [
        f"[2025-11-20 09:14:{n % 60:02d} TP{n % 4}] INFO step {n} gen throughput (token/s): {n}.0"
        for n in range(1, 5001)
    ]
    lines[1449] = (
        "[2025-11-20 09:16:27 TP0] ERROR Scheduler hit an exception: Traceback (most recent call last):"
    )
    lines[2999] = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    return _index(tmp_path, lines), lines


def test_the_window_is_centred_on_the_requested_line(big):
    index, lines = big
    window = log_window(index, len(lines), line=1450, crash=1450, evidence={1451})
    assert window.first == 1450 - WINDOW // 2 and len(window.rows) == WINDOW
    row = next(r for r in window.rows if r.number == 1450)
    assert "target" in row.classes and "crash" in row.classes
    assert "Scheduler hit an exception" in str(row.html)
    assert "evidence" in next(r for r in window.rows if r.number == 1451).classes
    assert window.prev_first == 1150 and window.next_first == 1550


def test_the_window_stays_inside_the_log():
    assert window_bounds(5000, line=3) == 1
    assert window_bounds(5000, line=4999) == 5000 - WINDOW + 1
    assert window_bounds(50, line=40) == 1
    assert window_bounds(5000, start=1201) == 1201


def test_the_last_window_has_no_next_page(big):
    index, lines = big
    window = log_window(index, len(lines), start=4990)
    assert window.last == 5000 and window.next_first is None
    assert window.rows[-1].number == 5000 and "5000.0" in str(window.rows[-1].html)


def test_log_lines_are_escaped_by_the_formatter(big):
    index, lines = big
    window = log_window(index, len(lines), line=3000)
    html = str(next(r for r in window.rows if r.number == 3000).html)
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html


def test_highlighting_gives_one_fragment_per_line_even_with_odd_characters():
    lines = [
        "",
        "a\rb",
        "form\ffeed",
        "tab\tend",
        "ünïcödé ✓",
        'File "x.py", line 3, in f',
        "  ",
        "RuntimeError: boom",
    ]
    fragments = highlight_lines(lines)
    assert len(fragments) == len(lines)
    assert "ünïcödé" in fragments[4]
    assert 'class="ne"' in fragments[7]  # the exception name is highlighted


def test_long_lines_are_cut_without_reading_them_whole(tmp_path):
    index = _index(tmp_path, ["short", "x" * 100_000, "after"])
    rows = index.read_lines(1, 3, max_chars=1000)
    assert [len(text) for text, _ in rows] == [5, 1000, 5]
    assert rows[1][1] == 100_000
    window = log_window(index, 3)
    assert window.rows[1].cut == 100_000 - DISPLAY_CHARS
    assert "after" in str(window.rows[2].html)


def test_search_finds_lines_across_block_boundaries(big):
    index, lines = big
    result = index.search("TRACEBACK (most", block_bytes=4096)
    assert result.hits == [(1450, lines[1449])]
    result = index.search("step 4999 ", block_bytes=1000)
    assert [n for n, _ in result.hits] == [4999]
    assert result.next_start is None


def test_search_reports_each_line_once_and_starts_where_asked(big):
    index, _ = big
    result = index.search("TP1]", start=4000, limit=10)
    assert [n for n, _ in result.hits] == list(range(4001, 4041, 4))
    assert result.truncated_hits and result.next_start == 4038


def test_search_stops_after_a_slice_and_says_where_to_go_on(big):
    index, _ = big
    result = index.search("step 4321 ", slice_bytes=10_000, block_bytes=4096)
    assert result.hits == [] and result.next_start is not None
    found = []
    start = 1
    while start is not None:
        result = index.search("step 4321 ", start=start, slice_bytes=10_000, block_bytes=4096)
        found += result.hits
        start = result.next_start
    assert [n for n, _ in found] == [4321]


def test_the_source_file_of_each_part_is_marked(tmp_path):
    index = _index(tmp_path, [f"line {n}" for n in range(1, 21)])
    sources = [
        {"name": "a.log", "first_line": 1, "line_count": 10},
        {"name": "b.log", "first_line": 11, "line_count": 10},
    ]
    window = log_window(index, 20, sources=sources)
    assert window.rows[0].source == "a.log" and window.rows[10].source == "b.log"
    assert window.rows[5].source is None

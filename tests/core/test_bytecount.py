"""Newlines and statistics lines counted with StringZilla (dispatchlab.core.bytecount) give the numbers
bytes.count gives: the line numbers of every hit and the statistics total of a document do not depend on
whether the accelerator is installed."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchlab.core import bytecount
from dispatchlab.core.api import analyze_paths

from .helpers import ROOT

NEEDLES = (b"\n", b"Decode batch", b"Avg prompt throughput", b"rror", b"aa")


def _require_accelerator() -> None:
    if not bytecount._enabled():
        if os.environ.get("DISPATCHLAB_CI"):
            pytest.fail("StringZilla is not installed: CI must compare it with bytes.count")
        pytest.skip("StringZilla is not installed here")


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=3000) | st.text(alphabet="aD\nrro ", max_size=3000).map(str.encode),
    st.integers(-50, 3050),
    st.integers(-50, 3050) | st.none(),
)
def test_counts_equal_bytes_count_on_any_range(data: bytes, start: int, end: int | None) -> None:
    _require_accelerator()
    data = data * (bytecount._SMALL // max(1, len(data)) + 1) if data else data  # past the short-chunk cut
    start, end = start * 40, None if end is None else end * 40
    count = bytecount.counter(data)
    if data:
        assert not isinstance(count.__self__, bytes)  # type: ignore[attr-defined] # the accelerator counts
    for needle in NEEDLES:
        if end is None:
            assert count(needle, start) == data.count(needle, start)
        else:
            assert count(needle, start, end) == data.count(needle, start, end)


def test_counts_on_a_server_log_chunk() -> None:
    _require_accelerator()
    text = (ROOT / "tests" / "fixtures" / "logs" / "sglang_h100_serving.log").read_bytes() * 40
    count = bytecount.counter(text)
    rng = random.Random(5)
    for _ in range(500):
        start = rng.randrange(len(text))
        end = rng.randrange(start, len(text) + 1)
        assert count(b"\n", start, end) == text.count(b"\n", start, end)
    assert count(b"Decode batch") == text.count(b"Decode batch") > 0


def test_a_document_is_the_same_without_the_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    _require_accelerator()
    log = ROOT / "tests" / "fixtures" / "logs" / "sglang_dsv4_eagle_sm120.log"
    fast = analyze_paths([log])
    monkeypatch.setattr(bytecount, "ENABLED", False)
    slow = analyze_paths([log])
    fast.pop("parse_seconds", None)
    slow.pop("parse_seconds", None)
    assert fast == slow
    assert fast["metrics"]["total"] == log.read_bytes().count(b"Decode batch")

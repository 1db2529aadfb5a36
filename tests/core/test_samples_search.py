"""The statistics lines a chunk's scan samples: the bounded search finds the lines a search for every needle
from each position finds (the way it was done before, kept here as the reference)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchlab.core.parse.chunkscan import COUNTED_NEEDLES, STAT_NEEDLES, _samples


def _reference(chunk: bytes, stride: int, next_sample: int) -> tuple[list[int], int, int]:
    out: list[int] = []
    position = max(0, next_sample)
    size = len(chunk)
    upcoming = [chunk.find(n, position) for n in STAT_NEEDLES]
    present = [
        n
        for n, p in zip(COUNTED_NEEDLES, upcoming, strict=False)
        if p >= 0 or chunk.find(n, 0, position + len(n)) >= 0
    ]
    while True:
        live = [p for p in upcoming if p >= 0]
        if not live:
            break
        hit = min(live)
        start = chunk.rfind(b"\n", 0, hit) + 1
        out.append(start)
        end = chunk.find(b"\n", hit)
        position = max(hit + 1, start + stride, size if end < 0 else end + 1)
        if position >= size:
            break
        upcoming = [
            chunk.find(n, position) if 0 <= p < position else p
            for n, p in zip(STAT_NEEDLES, upcoming, strict=True)
        ]
    metric_lines = chunk.count(present[0]) if present else 0
    return out, (position - size if out else 0), metric_lines


_LINES = st.sampled_from(
    [b"[t TP0] Decode batch, #running-req: 1\n", b"INFO Avg prompt throughput: 1.0 tokens/s\n",
     b"[t TP0] Prefill batch, #new-seq: 1\n", b"x Decode batch Prefill batch Avg prompt throughput\n",
     b"plain line\n", b"Decode", b"\n", b"Avg prompt throughput Decode batch\n"]
)  # fmt: skip


@settings(max_examples=1500, deadline=None)
@given(st.lists(_LINES, max_size=60).map(b"".join), st.integers(1, 400), st.integers(-50, 400))
def test_sampled_statistics_lines_are_the_ones_a_search_for_every_needle_finds(chunk, stride, next_sample):
    assert _samples(chunk, stride, next_sample) == _reference(chunk, stride, next_sample)

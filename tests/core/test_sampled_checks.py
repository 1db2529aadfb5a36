"""A big log's literal-free garbage checks (a bare line of one token repeated, a word looping) run on its first
and last stretch and one stretch in eight between; the document says how much of the log they saw, and the
other answer checks still read every line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatchlab.core import analyze_paths
from dispatchlab.core.parse import chunkscan, sources
from dispatchlab.core.summary import render_summary

STRETCH = 64 * 1024
SERVING = "[2026-01-01 00:00:{s:02d} TP0] Decode batch, #running-req: 3, #token: {n}, gen throughput (token/s): 9.5\n"
WORD_LOOP = "[2026-01-01 00:00:00] sample 3: the answer is " + "over " * 40 + "\n"
RESPONSE_LOOP = (
    '{"object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "'
    + "!" * 64
    + '"}}]}\n'
)


@pytest.fixture(autouse=True)
def _small_stretches(monkeypatch):
    monkeypatch.setattr(chunkscan, "SAMPLED_STRETCH_BYTES", STRETCH)
    monkeypatch.setattr(sources, "PARALLEL_MIN_BYTES", STRETCH)


def _log(tmp_path: Path, at_stretch: float, line: str, stretches: float = 20) -> Path:
    """A serving log of `stretches` stretches with `line` written `at_stretch` stretches in."""
    out, size, placed, n = [], 0, False, 0
    while size < stretches * STRETCH:
        if not placed and size >= at_stretch * STRETCH:
            out.append(line)
            placed = True
        text = SERVING.format(s=n % 60, n=n)
        out.append(text)
        size += len(text)
        n += 1
    path = tmp_path / "big.log"
    path.write_text("".join(out))
    return path


def _compressed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_stretch: float) -> tuple[Path, dict]:
    """The log with a word loop `at_stretch` stretches in, and the document of its .gz (read in small pieces:
    a stream's stretches are counted by its pieces)."""
    import gzip

    monkeypatch.setattr(sources, "WORKER_CHUNK_BYTES", 16 * 1024)
    plain = _log(tmp_path, at_stretch, WORD_LOOP)
    packed = tmp_path / "big.log.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    return plain, analyze_paths([packed])


def _garbage_lines(doc: dict) -> list[int]:
    return [e["line"] for e in doc["errors"] if e["kind"] == "garbage_output"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_word_loop_in_a_sampled_stretch_is_found_and_one_between_them_is_not(
    tmp_path, monkeypatch, workers
):
    monkeypatch.setenv("DISPATCHLAB_PARSE_WORKERS", workers)
    # stretch 0 (the head), 8 and 16 (one in eight) and 19 (the tail) are read with the sampled rules; 4 is not
    for stretch, found in ((0.5, True), (8.5, True), (19.2, True), (4.5, False)):
        doc = analyze_paths([_log(tmp_path, stretch, WORD_LOOP)])
        assert bool(_garbage_lines(doc)) is found, stretch
        sampled = doc["checks_sampled"]
        assert set(sampled["checks"]) == {"gen_repeat", "gen_words"}
        assert sampled["total_bytes"] == (tmp_path / "big.log").stat().st_size
        # four stretches of twenty: the document says the checks saw that much of the log
        assert 0.18 < sampled["checked_bytes"] / sampled["total_bytes"] < 0.22


def test_an_answer_in_a_response_is_judged_in_every_stretch(tmp_path):
    doc = analyze_paths([_log(tmp_path, 4.5, RESPONSE_LOOP)])
    assert len(_garbage_lines(doc)) == 1


def test_the_terminal_summary_says_which_checks_were_sampled(tmp_path):
    doc = analyze_paths([_log(tmp_path, 4.5, WORD_LOOP)])
    summary = render_summary(doc)
    assert "sampled  a bare output line of one token repeated; a word repeated back to back" in summary


def test_a_log_of_one_stretch_is_read_whole_and_says_nothing_of_sampling(tmp_path):
    doc = analyze_paths([_log(tmp_path, 0.5, WORD_LOOP, stretches=1)])
    assert _garbage_lines(doc) and "checks_sampled" not in doc


def test_the_same_log_compressed_samples_its_head_and_one_stretch_in_eight(tmp_path, monkeypatch):
    plain, doc = _compressed(tmp_path, monkeypatch, 8.5)
    assert _garbage_lines(doc) and doc["checks_sampled"]["total_bytes"] == plain.stat().st_size


def test_a_word_loop_in_the_last_8_mb_is_found_when_the_last_stretch_is_half_a_stretch(tmp_path):
    """A log of 19.5 stretches ends in half of one: its last two segments (8 MB) are still read whole."""
    path = _log(tmp_path, 18.9, WORD_LOOP, stretches=19.5)
    doc = analyze_paths([path])
    assert _garbage_lines(doc)
    assert doc["checks_sampled"]["where"] == "its first and last 8 MB and one 8 MB stretch in eight between"


def test_a_compressed_log_says_its_end_was_not_among_the_stretches_read(tmp_path, monkeypatch):
    _plain, doc = _compressed(tmp_path, monkeypatch, 19.5)
    assert not _garbage_lines(doc)  # stretch 19 of a stream: not known to be its last while it is read
    assert "a compressed or piped log's end is not known" in doc["checks_sampled"]["where"]
    assert "a compressed or piped log's end is not known" in render_summary(doc)

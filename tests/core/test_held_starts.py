"""A crash loop's start lines are held instead of read once the loop repeats (heldstarts.py): the document is
the one reading every start line gives, whatever the runs do around them."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from dispatchlab.core import analyze_paths
from dispatchlab.core.parse import heldstarts
from dispatchlab.core.parse.extra import NO_EXTRA_PATTERNS
from dispatchlab.core.parse.rules import compiled_rules
from dispatchlab.core.parse.scan import Scan
from dispatchlab.core.parse.sources import scan_sources
from dispatchlab.core.reading import open_sources

from .helpers import LOGS, log_text

SGLANG_OOM = LOGS / "sglang_docker_capture_oom.log"
SGLANG_ARCH = LOGS / "sglang_dsv4_eagle_sm120.log"
VLLM_OOM = LOGS / "vllm_engine_core_oom.log"
SERVING = LOGS / "sglang_h100_serving.log"


_text = log_text


def _attempt(path: Path, n: int) -> str:
    """One restart of a crash: its own clock minutes and attempt number (digits differ run to run)."""
    return f"supervisor: attempt {n} of the crash loop\n" + _text(path).replace(":5", f":{n % 6}")


def _observations(log: Path) -> dict:
    """Everything the parse observed (counts the document does not show included: the server votes)."""
    return vars(scan_sources(open_sources([log]), compiled_rules(NO_EXTRA_PATTERNS)))


def _both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, *, gz: bool = False
) -> tuple[dict, dict, int]:
    """The document with start lines held, without, and how many were held; what the parse observed is the
    same both ways."""
    log = tmp_path / ("loop.log.gz" if gz else "loop.log")
    log.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    held = []
    hold = Scan._hold_start

    def counted(self: Scan, *args: object) -> None:
        held.append(1)
        hold(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Scan, "_hold_start", counted)
    with_held, observed = analyze_paths([log]), _observations(log)
    monkeypatch.setattr(heldstarts, "HOLD_STARTS", False)
    read_all = analyze_paths([log])
    assert observed == _observations(log)
    return with_held, read_all, len(held) // 2


# the arch log starts with a launch command cut by backslashes: read on into the next lines, it is read each time
@pytest.mark.parametrize(
    ("log", "holds"),
    [(SGLANG_OOM, True), (VLLM_OOM, True), (SGLANG_ARCH, False)],
    ids=["sglang", "vllm", "wrapped"],
)
def test_a_loop_of_the_same_crash_gives_the_document_of_reading_every_start_line(
    tmp_path, monkeypatch, log, holds
):
    held, read_all, count = _both_ways(tmp_path, monkeypatch, "".join(_attempt(log, n) for n in range(60)))
    assert held == read_all
    assert (count > 30) is holds


def test_a_loop_whose_last_runs_end_another_way_reads_their_start_lines(tmp_path, monkeypatch):
    """The held start of a run that turns out different is read before that run's lines, in place."""
    text = "".join(_attempt(VLLM_OOM, n) for n in range(40)) + "".join(
        _attempt(SGLANG_OOM, n) for n in range(3)
    )
    held, read_all, count = _both_ways(tmp_path, monkeypatch, text)
    assert held == read_all and count > 10
    assert held["runs"][-1]["fingerprint"] != held["runs"][0]["fingerprint"]


def test_a_loop_broken_by_one_odd_run_and_resumed_gives_the_same_document(tmp_path, monkeypatch):
    runs = [_attempt(SGLANG_OOM, n) for n in range(30)]
    runs.append(_attempt(VLLM_OOM, 99))
    runs += [_attempt(SGLANG_OOM, n) for n in range(30, 70)]
    held, read_all, count = _both_ways(tmp_path, monkeypatch, "".join(runs))
    assert held == read_all and count > 30


def test_statistics_lines_inside_held_runs_are_sampled_as_when_every_start_is_read(tmp_path, monkeypatch):
    serving = "".join(line for line in _text(SERVING).splitlines(keepends=True) if "Decode batch" in line)
    runs = [_attempt(SGLANG_OOM, n).replace("\n", "\n" + serving, 3) for n in range(50)]
    held, read_all, count = _both_ways(tmp_path, monkeypatch, "".join(runs))
    assert held == read_all and count > 20
    assert held["metrics"]["total"] == read_all["metrics"]["total"] > 0


def test_a_start_line_that_grows_a_digit_is_read_and_the_longer_launch_command_kept(tmp_path, monkeypatch):
    """`attempt 999` and `attempt 1000` drop to one key, but the file keeps the longest launch command: the
    first start line with one more digit is read, not held."""
    run = (
        "python3 -m sglang.launch_server --model-path /m --tp 4 --port 30000   # attempt {n}\n"
        "[2026-03-02 09:15:{s:02d}] Load weight begin. avail mem=78.00 GB\n"
        "Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 10, in run_scheduler\n'
        "RuntimeError: CUDA error: out of memory\n"
    )
    text = "".join(run.format(n=n, s=n % 60) for n in range(1, 1011))
    held, read_all, count = _both_ways(tmp_path, monkeypatch, text)
    assert held == read_all and count > 900
    assert held["launch_command"].endswith("# attempt 1000")


def test_statistics_lines_right_after_held_starts_keep_the_series_as_reading_every_start(
    tmp_path, monkeypatch
):
    """A statistics line right after a held start line has that line read first: put off, the samples
    changed when a long series is halved (a small target makes it halve here)."""
    from dispatchlab.core.parse import scan, sources

    monkeypatch.setattr(scan, "METRIC_POINTS_TARGET", 10)
    monkeypatch.setattr(sources, "METRIC_POINTS_TARGET", 10)
    serving = "".join(line for line in _text(SERVING).splitlines(keepends=True) if "Decode batch" in line)
    runs = []
    for n in range(60):
        first, rest = _attempt(SGLANG_OOM, n).split("\n", 2)[:2], _attempt(SGLANG_OOM, n).split("\n", 2)[2]
        runs.append(first[0] + "\n" + first[1] + "\n" + serving + rest)
    # compressed: its size says little of its lines, so the series outgrows its target and is halved
    held, read_all, count = _both_ways(tmp_path, monkeypatch, "".join(runs), gz=True)
    assert held == read_all and count > 0
    assert held["metrics"]["sampled_every"] > 1

"""A traceback's frame lines take a short way to the extractors (parse/framelines.py): the document of a log
is the one that handing each line to every extractor gives."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchlab.core import analyze_paths
from dispatchlab.core.parse import scan

from .helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
FRAMED = sorted(p for p in FIXTURES.rglob("*.log") if 'File "' in p.read_text(errors="replace"))

# frames of every kind the short way meets: server paths (SGLang's past its eight kept mentions, vLLM's), a
# kernel and an error word in a frame, an arch in a path, a version named, frames behind a prefix, a gutter
# or a tab, a frame-like line that is not one, frames with no traceback start, frames after an exception
EDGES = "\n".join(
    [
        "[2026-03-02 09:15:02 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/opt/build/sm_90a/ops.py", line 5, in run',
        '  File "/sgl-workspace/sglang/python/sglang/srt/ops.py", line 6, in run  # TrtllmGemmFp4Runner failed',
        *(
            f'  File "/sgl-workspace/sglang/python/sglang/srt/managers/m{i}.py", line {i}, in step_{i}\n'
            f"    self.step_{i + 1}(batch)"
            for i in range(12)
        ),
        '  File "/usr/local/lib/python3.12/dist-packages/flashinfer/fused_moe/core.py", line 1450, '
        "in trtllm_fp4_block_scale_moe_op",
        '  File "/opt/kernels/sm_120/fmha.py", line 7, in fmhaSm120Kernel_failed_check',
        '  File "/sgl-workspace/sglang/python/sglang/srt/utils.py", line 9, in check  # Sglang==0.5.2',
        "RuntimeError: No kernel found for the given options",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/io.py", line 3, in orphan_after_the_exception',
        '[rank0]:   File "/workspace/vllm/vllm/v1/engine/core.py", line 80, in __init__',
        '[rank1]:   File "/opt/app/main.py", line 3, in run',
        '  File "/opt/app/serve.py", line 9, in loop',
        "  + Exception Group Traceback (most recent call last):",
        '  |   File "/usr/lib/python3.12/asyncio/runners.py", line 118, in run',
        '\tFile "/workspace/vllm/vllm/entrypoints/openai/serving_chat.py", line 300, in create_chat_completion',
        "    print('File \"/tmp/x.py\", line 3, in f')",
        '  log: File "/tmp/x.py", line 3, in not_a_frame',
        "ValueError: bad request",
        "(EngineCore_DP0 pid=51) ERROR 12-29 15:21:11 [core.py:751] EngineCore failed to start.",
        '  File "/workspace/vllm/vllm/v1/executor/multiproc_executor.py", line 44, in __init__',
        "",
    ]
)


def _both_ways(monkeypatch: pytest.MonkeyPatch, path: Path) -> tuple[dict, dict]:
    short = analyze_paths([path])
    with monkeypatch.context() as patched:
        patched.setattr("dispatchlab.core.parse.framelines.SHORTCUT", False)
        long = analyze_paths([path])
    return short, long


@pytest.mark.parametrize("log", FRAMED, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_a_fixture_logs_tracebacks_read_the_short_way_give_its_document(monkeypatch, log):
    short, long = _both_ways(monkeypatch, log)
    assert short == long


@pytest.mark.parametrize("copies", [1, 400], ids=["once", "crash loop"])
def test_frames_of_every_kind_read_the_short_way_give_the_document(tmp_path, monkeypatch, copies):
    target = tmp_path / "frames.log"
    target.write_text(EDGES * copies)
    taken = []
    real = scan.read_frame_line
    monkeypatch.setattr(scan, "read_frame_line", lambda *args: taken.append(1) or real(*args))
    short, long = _both_ways(monkeypatch, target)
    assert taken, "no frame line took the short way"
    assert short == long
    assert short["gpu"]["arch"] == "sm_90"  # the first frame's path (sm_90a)
    assert "TrtllmGemmFp4Runner" in short["kernels"]
    assert short["versions"]["sglang"] == "0.5.2"


def _flood(tracebacks: int) -> str:
    """Distinct tracebacks from a scheduler (not even digits aside: no crash loop), each with frames under
    sglang/ and code lines between."""
    out = []
    for n in range(tracebacks):
        name = chr(97 + n % 26) + chr(97 + n // 26 % 26)
        out.append(
            f"[2026-03-02 10:00:{n % 60:02d} TP{n % 4}] Scheduler hit an exception: Traceback (most recent call last):"
        )
        for depth in range(3 + n % 9):
            out.append(
                f'  File "/sgl-workspace/sglang/python/sglang/srt/managers/m{depth}.py", line {n + depth}, in step_{name}_{depth}'
            )
            out.append(f"    self.step_{depth + 1}(batch, mode={n % 3})")
        out.append(f"{('ValueError', 'KeyError', 'AssertionError')[n % 3]}: unexpected state {n}")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("quick", [True, False], ids=["frames as a whole", "frame by frame"])
def test_a_flood_of_tracebacks_read_the_quick_way_gives_the_document(tmp_path, monkeypatch, quick):
    """The quick reads (QuickFrames) give the document that reading each frame line the long way gives; the
    flood's frames mostly take the quick way, whole tracebacks at a time."""
    from dispatchlab.core.parse import framelines

    target = tmp_path / "flood.log"
    target.write_text(_flood(300) + EDGES + _flood(50))
    runs: list[tuple[int, bool]] = []  # (frame lines read at once, read the quick way)
    real_run = framelines.QuickFrames.read_run

    def read_run(self, text, ends, first, stop, plans, rank):
        runs.append((stop - first, done := real_run(self, text, ends, first, stop, plans, rank)))
        return done

    monkeypatch.setattr(framelines.QuickFrames, "read_run", read_run)
    if not quick:
        monkeypatch.setattr(framelines.QuickFrames, "read_whole", lambda *args: 0)
    fast = analyze_paths([target])
    with monkeypatch.context() as patched:
        patched.setattr(framelines, "QUICK", False)
        slow = analyze_paths([target])
    assert fast == slow
    if quick:
        assert sum(1 for size, done in runs if size > 1 and done) > 250  # most tracebacks' frames at once
    else:
        assert sum(1 for size, done in runs if size == 1 and done) > 1500
    assert fast["tracebacks"][0]["frames"][0]["function"] == "step_aa_0"
    assert len(fast["tracebacks"][0]["frames"]) == 3


WORDS = st.sampled_from(
    [
        "Error",
        "error",
        "ERROR",
        "Exception",
        "fail",
        "Failed",
        "Unsupported",
        "not supported",
        "Assert",
        "Fatal",
        "No kernel",
        "no kernel",
        "requires",
        "sm_90",
        "SM100",
        "sm90a",
        "/100/",
        "version",
        "VERSION",
        "==0.5.2",
        " v1.2",
        " V2",
        ".py:12]",
        "|",
        "+",
        "\x1b[31m",
        "Line 3: ",
        "File",
        '"/opt/app.py"',
        "line",
        "42,",
        "in",
        "run_step",
        " ",
        "  ",
        "é",
        "\ufffd",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(WORDS, max_size=14).map("".join))
def test_the_marks_read_whole_runs_test_for_are_in_every_text_their_readers_act_on(text):
    """read_run sends frames the long way on MARK_KINDS' pieces: every text that is errorish, hints at an
    arch, may name a version or is a request's log line holds one of them (else frames would skip a reader)."""
    from dispatchlab.core.arch import weak_arch_hint
    from dispatchlab.core.parse.extract.failures import is_errorish, request_logged
    from dispatchlab.core.parse.extract.servers import _may_name_version
    from dispatchlab.core.parse.framelines import MARK_KINDS, _marks

    def holds(kind: str) -> bool:
        return any(piece in text for piece in MARK_KINDS[kind])

    assert not is_errorish(text) or holds("always")
    assert weak_arch_hint(text) is None or holds("arch")
    assert not _may_name_version(text) or holds("version")
    assert not request_logged(text) or holds("request")
    data = text.encode()
    assert _marks().of(data) == {
        kind for kind in MARK_KINDS if any(p.encode() in data for p in MARK_KINDS[kind])
    }

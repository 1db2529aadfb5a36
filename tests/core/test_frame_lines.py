"""A traceback's frame lines take a short way to the extractors (parse/framelines.py): the document of a log
is the one that handing each line to every extractor gives."""

from __future__ import annotations

from pathlib import Path

import pytest

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

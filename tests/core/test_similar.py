"""Similar incidents: the known cases whose failure evidence reads most like a log's (dispatchlab.core.similar)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatchlab.core import analyze_paths
from dispatchlab.core.similar import load_index, similar_cases, similar_hit_rate, train_index

from .helpers import LOGS

ILLEGAL_ACCESS = """\
[2025-06-01 10:00:0{n}] Capturing batches (bs={bs})
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/sglang/srt/model_executor/model_runner.py", line {line}, in forward
    out = self.model.forward(batch)
RuntimeError: CUDA error: an illegal memory access was encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
"""
NCCL_TIMEOUT = """\
[rank{n}]:[E601 10:00:00] [PG 0 Rank {n}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={bs}, OpType=ALLREDUCE, NumelIn={line}, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.
torch.distributed.DistBackendError: NCCL communicator was aborted on rank {n}.
"""
OOM = """\
Traceback (most recent call last):
  File "/opt/vllm/vllm/worker/worker.py", line {line}, in determine_num_available_blocks
    self.model_runner.profile_run()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {bs}.00 MiB. GPU {n} has a total capacity of 79.10 GiB of which 12.00 MiB is free.
"""


def _case(
    folder: Path, slug: str, text: str, failure_class: str, source: str, fix: str | None = None
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{slug}.log").write_text(text)
    label = {"source": source, "title": slug, "failure_class": failure_class, "fix_summary": fix}
    (folder / f"{slug}.json").write_text(json.dumps(label))


@pytest.fixture
def labelled(tmp_path: Path) -> Path:
    folder = tmp_path / "cases"
    _case(
        folder,
        "crash-a",
        ILLEGAL_ACCESS.format(n=1, bs=8, line=1712),
        "cuda_error",
        "https://github.com/org/server/issues/1",
        "Disable the fused kernel.",
    )
    _case(
        folder,
        "hang-b",
        NCCL_TIMEOUT.format(n=3, bs=77, line=4096),
        "nccl_error",
        "https://github.com/org/server/issues/2",
    )
    _case(folder, "oom-c", OOM.format(n=0, bs=224, line=88), "oom", "https://github.com/org/server/pull/3")
    _case(
        folder,
        "clean-d",
        (LOGS / "sglang_h100_serving.log").read_text(),
        "none",
        "https://github.com/org/x/issues/4",
    )
    return folder


def test_a_crash_of_the_same_shape_ranks_above_an_unrelated_one(labelled: Path, tmp_path: Path):
    out = tmp_path / "index.json"
    train_index([labelled], out)
    log = tmp_path / "new.log"
    # the same crash on another run: other rank, batch size, line numbers and install path
    log.write_text(
        ILLEGAL_ACCESS.format(n=7, bs=160, line=99).replace("/usr/lib/python3", "/home/me/venv/lib")
    )
    ranked = similar_cases(analyze_paths([log]), load_index(str(out)))
    assert ranked[0].id == "cases/crash-a"
    assert ranked[0].url == "https://github.com/org/server/issues/1"
    assert ranked[0].fix == "Disable the fused kernel."
    assert all(other.score < ranked[0].score for other in ranked[1:])


def test_a_clean_log_gets_no_similar_cases():
    document = analyze_paths([LOGS / "sglang_h100_serving.log"])
    assert document["failure_class"] == "none"
    assert document["similar"] == {"cases": [], "groups": []}


def test_a_crash_lists_known_public_threads_with_what_fixed_them():
    document = analyze_paths([LOGS / "vllm_engine_core_oom.log"])
    cases = document["similar"]["cases"]
    assert 1 <= len(cases) <= 3
    assert all(c["url"].startswith("https://github.com/") and c["title"] for c in cases)
    assert any(c["failure_class"] == document["failure_class"] for c in cases)
    assert [c["score"] for c in cases] == sorted((c["score"] for c in cases), reverse=True)


def test_the_index_build_is_deterministic(labelled: Path, tmp_path: Path):
    other = tmp_path / "more"
    _case(other, "oom-e", OOM.format(n=2, bs=512, line=90), "oom", "https://github.com/org/y/issues/5")
    first, second = tmp_path / "one.json", tmp_path / "two.json"
    train_index([labelled, other], first)
    train_index([other, labelled], second)
    assert first.read_bytes() == second.read_bytes()
    assert len(json.loads(first.read_text())["cases"]) == 4  # the clean log weighs terms but is no case


def test_the_locked_test_split_never_feeds_the_index(tmp_path: Path):
    locked = tmp_path / "cases-locked"
    _case(locked, "oom-z", OOM.format(n=0, bs=1, line=1), "oom", "https://github.com/org/z/issues/9")
    with pytest.raises(ValueError, match="locked"):
        train_index([locked], tmp_path / "index.json")


def test_the_hit_rate_leaves_out_every_case_of_the_same_thread(labelled: Path):
    # a second excerpt of crash-a's thread is its only look-alike: left out, it cannot count as a hit
    _case(
        labelled,
        "crash-a-b",
        ILLEGAL_ACCESS.format(n=2, bs=4, line=10),
        "cuda_error",
        "https://github.com/org/server/pull/1",
    )
    _case(labelled, "oom-f", OOM.format(n=5, bs=96, line=12), "oom", "https://github.com/org/other/issues/6")
    result = similar_hit_rate([labelled])
    # failed cases: crash-a, crash-a-b, hang-b, oom-c, oom-f; only the two OOMs find their class elsewhere
    assert result == {"hits": 2, "total": 5, "rate": 0.4}

"""The benchmark code measures what it says: grep's reference does its whole work, sizes parse, the
tree sampler counts forked children."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from common import parse_size
from parse_throughput import GREP_ENV, grep_command, to_ere
from treerun import run_tree


def test_the_grep_reference_reads_the_whole_log_and_counts_every_match(tmp_path: Path):
    log = tmp_path / "serve.log"
    lines = [f"[2026-01-01 00:00:00 TP0] Decode batch, #running-req: {n}" for n in range(20000)]
    lines[1::97] = ["CUDA error: an illegal memory access was encountered"] * len(lines[1::97])
    log.write_text("\n".join(lines) + "\n")
    patterns = tmp_path / "patterns.ere"
    patterns.write_text(to_ere(r"CUDA error: (?P<what>.*)") + "\n")
    run = run_tree(grep_command(patterns, log), env=GREP_ENV)
    expected = sum(1 for line in lines if "CUDA error" in line)
    # with its output on /dev/null, GNU grep -c prints nothing and stops at the first match
    assert int(run.output) == expected > 200


def test_a_case_insensitive_pattern_stays_case_insensitive_in_grep(tmp_path: Path):
    log = tmp_path / "x.log"
    log.write_text("RuntimeError: CUDA OUT OF MEMORY\nfine\n")
    ere = to_ere("(?i)cuda out of memory")
    found = subprocess.run(["grep", "-c", "-E", "-e", ere, str(log)], capture_output=True, text=True)
    assert found.stdout.strip() == "1"


@pytest.mark.parametrize(
    ("text", "size"),
    [("1GiB", 1 << 30), ("100MB", 100_000_000), ("1e9", 10**9), ("4096", 4096), ("2 mib", 2 << 20)],
)
def test_sizes_read_as_the_readme_writes_them(text: str, size: int):
    assert parse_size(text) == size


def test_a_size_that_is_none_is_refused():
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        parse_size("1GB of logs")


def test_the_tree_memory_counts_forked_children():
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    block = bytearray(80 * 1024 * 1024)\n"
        "    time.sleep(0.5)\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "print('done')\n"
    )
    run = run_tree([sys.executable, "-c", code])
    assert run.output.strip() == b"done"
    assert run.peak_mb > 80, f"the child's 80 MB were not counted ({run.peak_mb:.0f} MB)"
    assert run.wall >= 0.5, "the run ended before the child did"

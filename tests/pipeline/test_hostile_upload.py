"""Hostile uploads and killed parses on the real stack: compressed logs stop at the limits that name
themselves and leave nothing on disk; a parse killed with SIGKILL resumes at once and leaves no parts."""

from __future__ import annotations

import gzip
import io
import os
import signal
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.pipeline

MiB = 1024 * 1024
# Long enough that a resume waiting for the claim to go stale fails the test long before it comes.
STALE_WINDOW = 600
LINE = b"[2026-05-24 00:51:02 TP0] Decode batch. #running-req: 1, #token: 811, token usage: 0.01\n"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory, stack_with: Any) -> Iterator[tuple[Any, Path]]:
    folder = tmp_path_factory.mktemp("hostile")
    with stack_with(
        folder,
        DISPATCHLAB_MAX_EXPANDED_BYTES=str(4 * MiB),
        DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES=str(8 * MiB),
        DISPATCHLAB_MAX_ZIP_MEMBERS="100",
        DISPATCHLAB_STALE_CLAIM_SECONDS=str(STALE_WINDOW),
        DISPATCHLAB_PARSE_WORKERS="2",
    ) as stack:
        yield stack, folder


def leftovers(folder: Path) -> list[str]:
    return sorted(
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.name.endswith(".tmp") or path.name.startswith(".parts-")
    )


def repeated(size: int, tag: str) -> bytes:
    return f"[2026-05-24 00:51:00] {tag}\n".encode() + LINE * (size // len(LINE) + 1)


def test_a_refused_gz_bomb_leaves_no_temporary_files(hostile):
    stack, folder = hostile
    created = stack.upload([("server.log.gz", gzip.compress(repeated(32 * MiB, "bomb")))])
    report = stack.wait_finished(created["id"])
    assert report["status"] == "failed" and "DISPATCHLAB_MAX_EXPANDED_BYTES" in report["error"]
    assert leftovers(folder) == []


def test_twenty_small_gz_files_past_the_report_cap_are_refused_naming_it(hostile):
    stack, folder = hostile
    files = [(f"rank{n}.log.gz", gzip.compress(repeated(MiB, f"rank {n}"))) for n in range(20)]
    report = stack.wait_finished(stack.upload(files)["id"])
    assert report["status"] == "failed"
    assert "8,388,608 bytes" in report["error"] and "DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES" in report["error"]
    assert leftovers(folder) == []


def zip_of(members: int, tag: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for n in range(members):
            zf.writestr(f"rank{n}.log", f"[2026-05-24 00:51:00 TP{n}] {tag} rank {n} up\n")
    return out.getvalue()


def test_a_zip_within_the_member_limit_parses_and_one_past_it_is_refused_naming_it(hostile):
    stack, _ = hostile
    report = stack.wait_finished(stack.upload([("ranks.zip", zip_of(100, "within"))])["id"])
    assert report["status"] == "done" and len(report["document"]["sources"]) == 100
    report = stack.wait_finished(stack.upload([("ranks.zip", zip_of(101, "past"))])["id"])
    assert report["status"] == "failed"
    assert "101 members" in report["error"] and "DISPATCHLAB_MAX_ZIP_MEMBERS" in report["error"]


def test_a_parse_killed_mid_scan_resumes_at_once_and_leaves_no_parts(hostile):
    stack, folder = hostile
    log = repeated(120 * MiB, f"killed {time.time_ns()}")  # parsed by two scan workers, in parts
    created = stack.upload([("long.log", log)])
    report_folder = folder / "media" / "reports" / str(created["id"])
    deadline = time.monotonic() + 120
    while not any(part.is_file() for part in report_folder.glob(".parts-*/*")):
        assert time.monotonic() < deadline, f"the scan never wrote its parts\n{stack.worker_tail()}"
        time.sleep(0.01)
    killed_claim = stack.row(created["id"])["claim_token"]
    children = subprocess.run(
        ["pgrep", "-P", str(stack.worker.pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)
    # Before: the redelivered task found the dead worker's claim fresh and waited out the whole window.
    report = stack.wait_finished(created["id"], timeout=STALE_WINDOW / 3)
    assert report["status"] == "done", report["error"]
    row = stack.row(created["id"])
    assert row["attempts"] == 2 and row["claim_token"] != killed_claim
    assert row["line_count"] == log.count(b"\n")
    assert leftovers(folder) == []

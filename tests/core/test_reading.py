"""Reading: every kind of input a person drops on us either parses or fails with one clear line."""

from __future__ import annotations

import gzip
import os
import zipfile
from pathlib import Path

import pytest

from dispatchlab.core import LogReadError, parse_paths
from dispatchlab.core.lineindex import LineIndex, write_line_index
from dispatchlab.core.reading import expansion_limit, iter_lines

from .helpers import LOGS, run_cli

CANONICAL = LOGS / "sglang_dsv4_eagle_sm120.log"


def test_a_gzipped_log_parses_like_the_plain_one(tmp_path: Path):
    packed = tmp_path / "server.log.gz"
    packed.write_bytes(gzip.compress(CANONICAL.read_bytes()))
    plain, zipped = parse_paths([CANONICAL]), parse_paths([packed])
    assert zipped["crash"] == plain["crash"]
    assert zipped["backends"] == plain["backends"]


def test_a_zip_of_several_logs_is_one_document_with_one_source_each(tmp_path: Path):
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("launch/env.txt", "GPU 0: NVIDIA H100 80GB HBM3\nGPU 0 Compute Capability: 9.0\n")
        zf.writestr("launch/server.log", (LOGS / "sglang_h100_serving.log").read_text())
        zf.writestr("screenshot.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(200))
    doc = parse_paths([archive])
    assert [s["name"].split(":")[-1] for s in doc["sources"]] == ["launch/env.txt", "launch/server.log"]
    assert doc["sources"][1]["first_line"] == 3
    assert doc["gpu"]["arch"] == "sm_90"
    assert doc["outcome"] == "serving"


def test_invalid_utf8_crlf_and_ansi_colours_do_not_disturb_parsing(tmp_path: Path):
    log = tmp_path / "colour.log"
    log.write_bytes(
        b"\x1b[32m[2026-01-02 03:04:05 TP0] Load weight begin. avail mem=10.00 GB\x1b[0m\r\n"
        b"[2026-01-02 03:04:06 TP0] caf\xe9 \xff\xfe broken bytes\r\n"
        b"[2026-01-02 03:04:09 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=2.00 GB, mem usage=8.00 GB.\r\n"
    )
    doc = parse_paths([log])
    phases = [p for p in doc["phases"] if p["name"] == "weight_loading"]
    assert phases and phases[0]["seconds"] == 4.0
    assert list(iter_lines([log]))[1].startswith("[2026-01-02 03:04:06 TP0] caf\ufffd")


def test_a_ten_megabyte_single_line_and_a_long_args_dump_are_handled(tmp_path: Path):
    args = ", ".join(f"field_{i}='value {i}, with (parens)'" for i in range(400))
    log = tmp_path / "long.log"
    log.write_text(
        "x" * (10 * 1024 * 1024) + "\n"
        f"[2026-01-02 03:04:05] server_args=ServerArgs(model_path='m', {args}, moe_runner_backend='triton')\n"
    )
    doc = parse_paths([log])
    assert doc["server_args"]["field_399"] == "value 399, with (parens)"
    assert doc["backends"]["moe_runner_backend"] == "triton"
    assert doc["line_count"] == 2


def test_stdin_is_read_with_a_dash():
    result = run_cli("parse", "--json", "-", stdin=(LOGS / "sglang_hardwrapped_args.log").read_bytes())
    assert result.returncode == 0, result.stderr
    assert '"outcome":"crashed"' in result.stdout


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.log", b"", "empty"),
        ("core.bin", b"\x7fELF\x02\x01\x01\x00" + bytes(4096), "binary"),
        ("image.log.gz", gzip.compress(bytes(range(256)) * 64), "binary"),
        ("truncated.gz", gzip.compress(b"[2026-01-01 00:00:00] hello\n" * 5000)[:300], "corrupt"),
    ],
)
def test_a_file_that_is_not_a_log_fails_with_one_line_and_exit_code_1(tmp_path: Path, name, content, reason):
    path = tmp_path / name
    path.write_bytes(content)
    result = run_cli("parse", str(path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0] and name in lines[0]


def _zip_with(tmp_path: Path, entries: dict[str, bytes], *, compression=zipfile.ZIP_DEFLATED) -> Path:
    path = tmp_path / "upload.zip"
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for entry, data in entries.items():
            zf.writestr(entry, data)
    return path


def test_a_zip_entry_that_climbs_out_of_the_folder_is_refused(tmp_path: Path):
    path = _zip_with(tmp_path, {"../../etc/cron.d/evil.log": b"[2026-01-01 00:00:00] x\n"})
    with pytest.raises(LogReadError, match="unsafe entry name"):
        parse_paths([path])


def test_a_zip_bomb_is_refused_before_it_is_expanded(tmp_path: Path):
    path = tmp_path / "bomb.zip"
    block = b"A" * (1024 * 1024)
    with (
        zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf,
        zf.open("huge.log", "w", force_zip64=True) as member,
    ):
        for _ in range(300):
            member.write(block)
    assert path.stat().st_size < 1024 * 1024
    result = run_cli("parse", str(path))
    assert result.returncode == 1 and "decompression bomb" in result.stderr


def test_a_missing_file_and_a_directory_are_reported_plainly(tmp_path: Path):
    assert run_cli("parse", str(tmp_path / "nope.log")).stderr.strip().endswith("no such file")
    assert "is a directory" in run_cli("parse", str(tmp_path)).stderr


def test_usage_errors_exit_with_2():
    assert run_cli("parse").returncode == 2
    assert run_cli("frobnicate", "x").returncode == 2


def test_the_line_index_pages_through_a_log_by_line_number(tmp_path: Path):
    log = tmp_path / "many.log.gz"
    log.write_bytes(gzip.compress("".join(f"line {i}\n" for i in range(1, 5001)).encode()))
    count = write_line_index([log], tmp_path / "copy.txt", tmp_path / "copy.idx")
    index = LineIndex(tmp_path / "copy.txt", tmp_path / "copy.idx")
    assert count == 5000
    assert [text for text, _ in index.read_lines(4321, 3)] == ["line 4321", "line 4322", "line 4323"]
    assert [text for text, _ in index.read_lines(4999, 10)] == ["line 4999", "line 5000"]
    assert index.search("line 42", limit=3).hits == [(42, "line 42"), (420, "line 420"), (421, "line 421")]


def _peak_tree_mb_parsing(path: Path) -> float:
    """Peak PSS of the whole process tree of `dispatchlab match` (its forked scan workers counted)."""
    import os
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from treerun import run_tree

    env = {**os.environ, "DISPATCHLAB_PARSE_WORKERS": "2"}
    run = run_tree([sys.executable, "-m", "dispatchlab.core.cli", "match", "--json", str(path)], env=env)
    assert run.returncode == 0 and run.output
    return run.peak_mb


def test_the_whole_process_tree_keeps_memory_flat_as_the_log_grows(tmp_path: Path):
    line = (
        b"[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 8, #token: 4400, token usage: 0.01, "
        b"cuda graph: True, gen throughput (token/s): 512.33, #queue-req: 0, \n"
    )
    block = line * (1024 * 1024 // len(line))
    small, large = tmp_path / "small.log", tmp_path / "large.log"
    for path, megabytes in ((small, 100), (large, 250)):
        with path.open("wb") as handle:
            for _ in range(megabytes):
                handle.write(block)
    small_peak, large_peak = _peak_tree_mb_parsing(small), _peak_tree_mb_parsing(large)
    assert large_peak < 150, f"peak PSS of the process tree {large_peak:.0f} MB for a 250 MB log"
    assert large_peak < small_peak * 1.3, f"tree memory grew from {small_peak:.0f} MB to {large_peak:.0f} MB"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_parse_writes_the_viewers_copy_and_index_in_the_same_read(
    tmp_path: Path, monkeypatch, workers: str
):
    from dispatchlab.core import analyze_paths
    from dispatchlab.core.parse import chunkscan, parallelscan, sources

    monkeypatch.setattr(sources, "PARALLEL_MIN_BYTES", 64 * 1024)
    monkeypatch.setattr(chunkscan, "SAMPLED_STRETCH_BYTES", 128 * 1024)
    monkeypatch.setattr(parallelscan, "WORKER_CHUNK_BYTES", 16 * 1024)
    monkeypatch.setenv("DISPATCHLAB_PARSE_WORKERS", workers)
    lines = [f"[2026-01-01 00:00:{n % 60:02d} TP{n % 4}] step {n}\x1b[0m" for n in range(1, 30001)]
    log = tmp_path / "big.log"
    log.write_bytes("\r\n".join(lines).encode() + b"\r\n")  # CRLF and colour codes: the copy is normalised
    text, idx = tmp_path / "copy.txt", tmp_path / "copy.idx"
    doc = analyze_paths([log], line_index=(text, idx))
    assert doc["line_count"] == 30000
    assert text.read_bytes() == "\n".join(line.replace("\x1b[0m", "") for line in lines).encode() + b"\n"
    index = LineIndex(text, idx)
    for first in (1, 2, 777, 12345, 29999):
        expected = [f"[2026-01-01 00:00:{n % 60:02d} TP{n % 4}] step {n}" for n in (first, first + 1)]
        assert [t for t, _ in index.read_lines(first, 2)] == expected
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["big.log", "copy.idx", "copy.txt"], "the workers' shares of the text were left behind"


def _zip_of_members(path: Path, members: int) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for n in range(members):
            zf.writestr(f"rank{n}.log", f"[2026-01-01 00:00:00 TP{n}] worker {n} started\n")
    return path


def test_a_zip_of_many_members_reads_its_directory_once_and_each_member_a_fixed_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Reading the central directory again for every member made a 10,000-member zip take 665 s.
    path = _zip_of_members(tmp_path / "ranks.zip", 300)
    directories_read, members_opened = 0, 0
    real_init, real_open = zipfile.ZipFile.__init__, zipfile.ZipFile.open

    def counting_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal directories_read
        directories_read += 1
        real_init(self, *args, **kwargs)

    def counting_open(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal members_opened
        members_opened += 1
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "__init__", counting_init)
    monkeypatch.setattr(zipfile.ZipFile, "open", counting_open)
    document = parse_paths([path])
    assert len(document["sources"]) == 300 and document["line_count"] == 300
    assert directories_read == 1
    assert members_opened <= 2 * 300  # a look at its first bytes, then the read


def test_a_zip_with_more_members_than_the_limit_is_refused_naming_it(tmp_path: Path):
    path = _zip_of_members(tmp_path / "ranks.zip", 30)
    with expansion_limit(1024**3, zip_members=20), pytest.raises(LogReadError) as refused:
        parse_paths([path])
    assert "30 members" in str(refused.value) and "DISPATCHLAB_MAX_ZIP_MEMBERS" in str(refused.value)
    assert len(parse_paths([path])["sources"]) == 30  # the default limit lets it through


def test_logs_that_together_expand_past_the_report_limit_are_refused_naming_it(tmp_path: Path):
    line = b"[2026-05-24 00:51:02 TP0] Decode batch. #running-req: 1, #token: 811\n"
    paths = []
    for n in range(20):
        path = tmp_path / f"rank{n}.log.gz"
        path.write_bytes(gzip.compress(line * (1024 * 1024 // len(line)), compresslevel=6))
        paths.append(path)
    read = 0
    with (
        expansion_limit(4 * 1024 * 1024, report_bytes=8 * 1024 * 1024),
        pytest.raises(LogReadError) as refused,
    ):
        for text in iter_lines(paths):
            read += len(text) + 1
    assert "8,388,608 bytes" in str(refused.value) and "DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES" in str(
        refused.value
    )
    assert read <= 8 * 1024 * 1024  # stopped at the cap, not after expanding all twenty


def _corrupted_gz(seed: int) -> bytes:
    """A .gz whose deflate stream has a few bytes changed in its middle: the reader's own error, not a
    truncation (zlib.error from the standard library, IsalError from ISA-L)."""
    import random

    rng = random.Random(seed)
    data = bytearray(gzip.compress(CANONICAL.read_bytes() * 20))
    for _ in range(6):
        data[rng.randrange(len(data) // 3, 2 * len(data) // 3)] = rng.randrange(256)
    return bytes(data)


@pytest.mark.parametrize("isal", [True, False], ids=["ISA-L", "standard gzip"])
def test_gzip_reads_the_same_with_either_reader_and_a_damaged_one_fails_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isal: bool
):
    from dispatchlab.core import reading

    if isal and reading.gzip_module().__name__ != "isal.igzip":
        if os.environ.get("DISPATCHLAB_CI"):
            pytest.fail("isal is not installed: CI must read .gz files with it")
        pytest.skip("isal is not installed here")
    if isal:
        monkeypatch.delenv("DISPATCHLAB_NO_ISAL", raising=False)
    else:
        monkeypatch.setenv("DISPATCHLAB_NO_ISAL", "1")  # the CLI below inherits it
        assert reading.gzip_module().__name__ == "gzip"
    two_members = tmp_path / "server.log.gz"
    text = CANONICAL.read_bytes()
    two_members.write_bytes(gzip.compress(text[: len(text) // 2]) + gzip.compress(text[len(text) // 2 :]))
    assert parse_paths([two_members]) | {"sources": None} == parse_paths([CANONICAL]) | {"sources": None}
    failures = set()
    for seed in range(6):
        damaged = tmp_path / f"damaged{seed}.log.gz"
        damaged.write_bytes(_corrupted_gz(seed))
        result = run_cli("parse", str(damaged))
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert damaged.name in line
        failures.add(line)
    assert len(failures) == 6


def test_an_uploaded_gz_from_a_file_object_without_readinto_is_still_checked(monkeypatch: pytest.MonkeyPatch):
    """ISA-L's reader needs `readinto`; an upload handed over as a bare read/seek/tell object is read by the
    standard library's, and a log passes as a log, a binary .gz fails as binary."""
    import io

    from dispatchlab.core.reading import check_upload_head

    class ReadOnly:
        def __init__(self, data: bytes) -> None:
            self._inner = io.BytesIO(data)
            self.read, self.seek, self.tell = self._inner.read, self._inner.seek, self._inner.tell

    check_upload_head(ReadOnly(gzip.compress(CANONICAL.read_bytes())), "server.log.gz")  # type: ignore[arg-type]
    with pytest.raises(LogReadError, match="binary"):
        check_upload_head(ReadOnly(gzip.compress(bytes(range(256)) * 64)), "image.log.gz")  # type: ignore[arg-type]

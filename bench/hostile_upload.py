"""Hostile uploads: decompression bombs, a zip of many members, a parse killed with SIGKILL.

    python bench/hostile_upload.py                       # all three, small caps (runs in a few minutes)
    python bench/hostile_upload.py --only zip --members 1000,10000
    python bench/hostile_upload.py --json bench/out/hostile_upload.json

bombs: each bomb (a .gz, a zip, a .gz inside a zip, twenty .gz in one report) is read as the worker reads
an upload, under the caps given (--per-file, --per-report: DISPATCHLAB_MAX_EXPANDED_BYTES and
DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES), writing the text copy to a scratch folder: the figures are the
bytes written before the refusal, the time to the refusal, and what stays on disk once the worker's
service has cleaned up (it is 0 with the fix).

zip: parse time of a zip of N members (one short log each) for each N; time per member stays flat when the
member handling is linear (the ratio of the largest to the smallest N, divided by the ratio of N, is ~1;
before the fix, 10,000 members took 665 s: 100x the time of 1,000).

kill: a real stack (uvicorn, Celery on Redis, PostgreSQL: DISPATCHLAB_TEST_REDIS_URL and
DISPATCHLAB_TEST_POSTGRES_URL) with the default stale-claim window (300 s); a log of --kill-mb MB is
uploaded, the worker's pool processes are killed with SIGKILL while the scan writes its parts, and the
figures are the seconds from the kill to the resumed claim and to done, and the bytes of parts and
temporary copies left on disk at the kill and once it is done.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MiB = 1024 * 1024
LINE = b"[2026-05-24 00:51:02 TP0] Decode batch. #running-req: 1, #token: 811, token usage: 0.01\n"


def _repeated_gz(expanded: int) -> bytes:
    out = io.BytesIO()
    block = LINE * (MiB // len(LINE))
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as gz:
        for _ in range(expanded // len(block) + 1):
            gz.write(block)
    return out.getvalue()


def _bombs(folder: Path, per_file: int) -> dict[str, list[Path]]:
    """name -> the files of one report."""
    big = 4 * per_file
    gz = folder / "bomb.log.gz"
    gz.write_bytes(_repeated_gz(big))
    plain_zip = folder / "bomb.zip"
    block = LINE * (MiB // len(LINE))
    with (
        zipfile.ZipFile(plain_zip, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf,
        zf.open("huge.log", "w", force_zip64=True) as member,
    ):
        for _ in range(big // len(block) + 1):
            member.write(block)
    nested = folder / "nested.zip"
    with zipfile.ZipFile(nested, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("inner.log.gz", gz.read_bytes())
    twenty = []
    for n in range(20):
        path = folder / f"rank{n}.log.gz"
        path.write_bytes(_repeated_gz(per_file // 2))
        twenty.append(path)
    return {"gz": [gz], "zip": [plain_zip], "gz in zip": [nested], "twenty gz": twenty}


def bench_bombs(per_file: int, per_report: int) -> list[dict[str, Any]]:
    from dispatchlab.core import LogReadError, analyze_paths
    from dispatchlab.core.reading import expansion_limit

    results = []
    with tempfile.TemporaryDirectory(prefix="hostile-bombs-") as scratch:
        folder = Path(scratch)
        for name, paths in _bombs(folder, per_file).items():
            text, index = folder / f"{name}.text.tmp", folder / f"{name}.idx.tmp"
            started = time.monotonic()
            refusal = ""
            try:
                with expansion_limit(per_file, report_bytes=per_report):
                    analyze_paths(paths, line_index=(text, index))
            except LogReadError as error:
                refusal = str(error)
            seconds = time.monotonic() - started
            written = sum(p.stat().st_size for p in (text, index) if p.exists())
            for leftover in (text, index):  # what report_analyze does on every failure path
                leftover.unlink(missing_ok=True)
            results.append(
                {
                    "bomb": name,
                    "compressed_bytes": sum(p.stat().st_size for p in paths),
                    "written_before_refusal": written,
                    "seconds_to_refusal": round(seconds, 3),
                    "left_on_disk": sum(1 for p in folder.iterdir() if p.name.endswith(".tmp")),
                    "refusal": refusal[-160:] or "NOT REFUSED",
                }
            )
            print(
                f"bomb {name:10s} {results[-1]['compressed_bytes'] / MiB:7.2f} MiB compressed: "
                f"{written / MiB:8.1f} MiB written, refused in {seconds:6.2f} s: {refusal[-110:] or 'NOT REFUSED'}",
                flush=True,
            )
    return results


def bench_zip(counts: list[int]) -> dict[str, Any]:
    from dispatchlab.core import analyze_paths

    rows = []
    with tempfile.TemporaryDirectory(prefix="hostile-zip-") as scratch:
        for count in counts:
            path = Path(scratch) / f"ranks-{count}.zip"
            with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                for n in range(count):
                    zf.writestr(f"rank{n}.log", f"[2026-05-24 00:51:00 TP{n}] rank {n} up\n" + LINE.decode())
            started = time.monotonic()
            document = analyze_paths([path])
            seconds = time.monotonic() - started
            assert len(document["sources"]) == count
            rows.append({"members": count, "zip_bytes": path.stat().st_size, "seconds": round(seconds, 3)})
            print(
                f"zip of {count:6,d} members ({path.stat().st_size / MiB:5.2f} MiB): {seconds:7.2f} s",
                flush=True,
            )
    first, last = rows[0], rows[-1]
    ratio = last["seconds"] / max(first["seconds"], 1e-6)
    members = last["members"] / first["members"]
    print(f"zip: {members:.0f}x the members took {ratio:.1f}x the time (linear: ~{members:.0f}x)", flush=True)
    return {"runs": rows, "time_ratio": round(ratio, 2), "member_ratio": members}


def _leftover_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        inside = any(part.startswith(".parts-") for part in path.parts) or path.name.endswith(".tmp")
        if inside and path.is_file():
            total += path.stat().st_size
    return total


def bench_kill(megabytes: int) -> dict[str, Any]:
    import psycopg
    from common import BenchStack

    os.environ["DISPATCHLAB_PARSE_WORKERS"] = "2"
    folder = Path(tempfile.mkdtemp(prefix="hostile-kill-"))
    stack = BenchStack("services", folder, concurrency=2)
    try:
        log = f"[2026-05-24 00:51:00] kill bench {time.time_ns()}\n".encode() + LINE * (
            megabytes * MiB // len(LINE)
        )
        boundary = "hostilebench"
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="long.log"\r\n'
                "Content-Type: text/plain\r\n\r\n"
            ).encode()
            + log
            + f"\r\n--{boundary}--\r\n".encode()
        )
        request = urllib.request.Request(
            stack.base_url + "/api/v1/reports",
            data=body,
            headers={
                "Authorization": f"Bearer {stack.token}",
                "Content-Type": f"multipart/form-data; boundary={boundary}",
            },
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            report_id = json.loads(response.read())["id"]
        reports = folder / "media" / "reports" / str(report_id)
        deadline = time.monotonic() + 300
        while not any(p.is_file() for p in reports.glob(".parts-*/*")):
            if time.monotonic() > deadline:
                raise SystemExit("the scan never wrote parts: is the log big enough?")
            time.sleep(0.005)
        time.sleep(0.5)  # let the parts grow a little, as a real kill finds them
        assert stack.running is not None
        worker = stack.running.processes["worker"]
        pids = subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True, text=True).stdout.split()
        at_kill = _leftover_bytes(folder)
        killed = time.monotonic()
        for pid in pids:
            os.kill(int(pid), signal.SIGKILL)
        database = stack.env["DISPATCHLAB_DATABASE_URL"]
        resumed = done = None
        with psycopg.connect(database, autocommit=True) as connection:  # one connection: the server is shared
            while done is None and time.monotonic() - killed < 900:
                status, attempts = connection.execute(
                    "SELECT status, attempts FROM reports_report WHERE id = %s", (report_id,)
                ).fetchone()
                now = time.monotonic() - killed
                if resumed is None and attempts >= 2:
                    resumed = now
                if status in ("done", "failed"):
                    done = now
                time.sleep(0.05)
        result = {
            "log_mb": megabytes,
            "stale_claim_seconds": 300,
            "seconds_kill_to_resume": None if resumed is None else round(resumed, 2),
            "seconds_kill_to_done": None if done is None else round(done, 2),
            "leftover_bytes_at_kill": at_kill,
            "leftover_bytes_after": _leftover_bytes(folder),
            "status": status,
        }
        print(
            f"kill -9 during parse of {megabytes} MB: resumed {result['seconds_kill_to_resume']} s after, done "
            f"{result['seconds_kill_to_done']} s after; parts/tmp on disk at the kill "
            f"{at_kill / MiB:.1f} MiB, after {result['leftover_bytes_after'] / MiB:.1f} MiB",
            flush=True,
        )
        return result
    finally:
        stack.close()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["bombs", "zip", "kill"], action="append")
    parser.add_argument("--per-file", type=int, default=256 * MiB)
    parser.add_argument("--per-report", type=int, default=512 * MiB)
    parser.add_argument("--members", default="1000,10000")
    parser.add_argument("--kill-mb", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    parts = args.only or ["bombs", "zip", "kill"]
    out: dict[str, Any] = {}
    if "bombs" in parts:
        out["bombs"] = bench_bombs(args.per_file, args.per_report)
    if "zip" in parts:
        out["zip"] = bench_zip([int(n) for n in args.members.split(",")])
    if "kill" in parts:
        out["kill"] = bench_kill(args.kill_mb)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

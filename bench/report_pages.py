"""Server time of the report page and of log-viewer pages: a 1 GiB log against a 1 MB one.

    python bench/report_pages.py [--big-mb 1024] [--small-mb 1] [--runs 30] [--json bench/out/report_pages.json]

Both logs are the same kind of SGLang run (4 ranks, serving with batch metrics for hours, then a crash
at the very end), generated here. Each goes through the real pipeline (report_submit, then
report_analyze: parse, match, line index) into a throw-away SQLite database under bench/out/, and then
every page is requested through Django's test client as a logged-in member: the time measured is
the server's (URL resolution, middleware, queries, rendering), not the network's.

Target (issue #4): every page of the 1 GiB report within 2x of the same page of the 1 MB report.
The log search is listed for information: it scans (a bounded slice of) the log, so it grows with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"

HEADER = [
    "$ python -m sglang.launch_server --model-path /models/DeepSeek-V4-Flash-NVFP4 --tp 4 --context-length 8192 "
    "--moe-runner-backend flashinfer_cutlass",
    "GPU 0,1,2,3: NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "GPU 0,1,2,3 Compute Capability: 12.0",
    "sglang: 0.5.10.post1",
    "flashinfer_python: 0.5.3",
    "PyTorch: 2.9.1+cu130",
    "[2026-05-01 00:00:00] server_args=ServerArgs(model_path='/models/DeepSeek-V4-Flash-NVFP4', tp_size=4, "
    "context_length=8192, quantization=None, kv_cache_dtype='auto', mem_fraction_static=0.85, "
    "attention_backend=None, moe_runner_backend='flashinfer_cutlass', cuda_graph_max_bs=64, port=30000)",
    *[f"[2026-05-01 00:00:02 TP{r}] Init torch distributed begin." for r in range(4)],
    *[f"[2026-05-01 00:00:03 TP{r}] Init torch distributed ends. mem usage=0.00 GB" for r in range(4)],
    *[f"[2026-05-01 00:00:03 TP{r}] Load weight begin. avail mem=94.50 GB" for r in range(4)],
    "[2026-05-01 00:00:03 TP0] Detected nvfp4 checkpoint. Please note that the format is experimental and subject to change.",
    "[2026-05-01 00:00:03 TP0] Use dsv4 attention backend for DeepseekV4ForCausalLM",
    *[
        f"[2026-05-01 00:01:38 TP{r}] Load weight end. type=DeepseekV4ForCausalLM, dtype=torch.bfloat16, "
        "avail mem=40.12 GB, mem usage=54.38 GB."
        for r in range(4)
    ],
    "[2026-05-01 00:01:38 TP0] Use flashinfer_cutlass as MoE runner backend.",
    *[
        f"[2026-05-01 00:01:43 TP{r}] KV Cache is allocated. #tokens: 205312, K size: 8.12 GB, V size: 8.12 GB"
        for r in range(4)
    ],
    *[
        f"[2026-05-01 00:01:44 TP{r}] Capture cuda graph begin. This can take up to several minutes. avail mem=13.90 GB"
        for r in range(4)
    ],
    *[
        f"[2026-05-01 00:02:04 TP{r}] Capture cuda graph end. Time elapsed: 20.21 s. mem usage=2.10 GB. avail mem=11.80 GB."
        for r in range(4)
    ],
    "[2026-05-01 00:02:10] The server is fired up and ready to roll!",
]

TAIL = [
    "[{stamp} TP2] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2890, in run_scheduler_process',
    "    scheduler.event_loop_overlap()",
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1004, in event_loop_overlap',
    "    batch_result = self.run_batch(batch)",
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 2101, in forward',
    "    return self.cuda_graph_runner.replay(forward_batch)",
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
    "[{stamp}] Received sigquit from a child process. It usually means the child failed.",
]


def _minute_block(lines_per_minute: int) -> bytes:
    """One minute of serving (decode batches, a prefill now and then) with DD HH:MM placeholders."""
    out = []
    for n in range(lines_per_minute):
        second = n * 60 // lines_per_minute
        stamp = f"2026-05-DD HH:MM:{second:02d}"
        if n % 25 == 0:
            out.append(
                f"[{stamp} TP0] Prefill batch. #new-seq: 4, #new-token: 8192, #cached-token: {n * 7 % 4096}, "
                f"token usage: 0.{n % 90:02d}, #running-req: {n % 32}, #queue-req: {n % 5}, "
                f"input throughput (token/s): {5200 + n % 700:.2f}"
            )
        out.append(
            f"[{stamp} TP0] Decode batch. #running-req: {8 + n % 24}, #token: {4096 + 64 * (n % 500)}, "
            f"token usage: 0.{10 + n % 80:02d}, cuda graph: True, gen throughput (token/s): {60 + (n * 7) % 25:.2f}, "
            f"#queue-req: {n % 3}"
        )
    return ("\n".join(out) + "\n").encode()


def write_log(path: Path, size_bytes: int) -> int:
    """A serving log of about size_bytes, crashing at the end. Returns its size."""
    block = _minute_block(lines_per_minute=300 if size_bytes < 8 * 1024 * 1024 else 4000)
    with path.open("wb") as out:
        out.write(("\n".join(HEADER) + "\n").encode())
        written = out.tell()
        minute = 3
        while written < size_bytes:
            day, rest = divmod(minute, 24 * 60)
            hour, mins = divmod(rest, 60)
            chunk = block.replace(b"DD HH:MM", f"{1 + day:02d} {hour:02d}:{mins:02d}".encode())
            out.write(chunk)
            written += len(chunk)
            minute += 1
        day, rest = divmod(minute, 24 * 60)
        stamp = f"2026-05-{1 + day:02d} {rest // 60:02d}:{rest % 60:02d}:00"
        out.write(("\n".join(line.format(stamp=stamp) for line in TAIL) + "\n").encode())
        return out.tell()


def _setup_django(workdir: Path) -> None:
    os.environ["DISPATCHLAB_DATA_DIR"] = str(workdir)
    os.environ["DISPATCHLAB_DATABASE_URL"] = f"sqlite:///{workdir / 'bench.sqlite3'}"
    os.environ["DISPATCHLAB_EAGER_TASKS"] = "false"
    os.environ["DISPATCHLAB_ALLOWED_HOSTS"] = "testserver"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _time_pair(client, urls: dict[str, str], runs: int) -> dict[str, dict[str, float]]:
    """Median and p90 server time of each url; the urls are requested in turn, so a machine whose
    load drifts during the run slows them alike and the ratio stays fair."""
    for url in urls.values():
        for _ in range(3):  # warm: templates compiled, the file's pages in the OS cache
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)
    samples: dict[str, list[float]] = {label: [] for label in urls}
    sizes: dict[str, int] = {}
    for _ in range(runs):
        for label, url in urls.items():
            start = time.perf_counter()
            response = client.get(url)
            samples[label].append((time.perf_counter() - start) * 1000)
            assert response.status_code == 200
            sizes[label] = len(response.content)
    out = {}
    for label, values in samples.items():
        values.sort()
        out[label] = {
            "median_ms": round(statistics.median(values), 2),
            "p90_ms": round(values[max(0, int(len(values) * 0.9) - 1)], 2),
            "bytes": sizes[label],
        }
    return out


def _size_name(megabytes: float) -> str:
    return f"{megabytes / 1024:g} GiB" if megabytes >= 1024 else f"{megabytes:g} MB"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--big-mb", type=float, default=1024.0)
    parser.add_argument("--small-mb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", type=Path, default=OUT / "report_pages.json")
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the generated logs in bench/out/ for the next run"
    )
    args = parser.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="report-pages-", dir=OUT))
    _setup_django(workdir)

    from django.contrib.auth.models import User
    from django.core.files import File
    from django.test import Client

    from dispatchlab.reports.analysis import report_analyze
    from dispatchlab.reports.models import Membership, Project, Report
    from dispatchlab.reports.submit import report_submit

    project = Project.objects.create(name="bench", slug="bench")
    user = User.objects.create_user("alice", password="x")
    Membership.objects.create(user=user, project=project, role="member")
    client = Client()
    client.force_login(user)

    results: dict[str, dict] = {}
    urls: dict[str, dict[str, str]] = {}
    logs = []
    for label, megabytes in (("small", args.small_mb), ("big", args.big_mb)):
        log = OUT / f"serving-{megabytes:g}MB.log"
        logs.append(log)
        started = time.perf_counter()
        if not log.exists():
            write_log(log, int(megabytes * 1024 * 1024))
        generated = time.perf_counter() - started
        with log.open("rb") as handle:
            report, _ = report_submit(
                project=project, user=user, files=[File(handle, name=log.name)], title=log.name
            )
        started = time.perf_counter()
        outcome = report_analyze(report_id=report.pk)
        analyzed = time.perf_counter() - started
        report.refresh_from_db()
        assert report.status == Report.Status.DONE, (outcome, report.error)
        crash = (report.document.get("crash") or {}).get("line") or report.line_count
        base = f"/reports/{report.pk}"
        urls[label] = {
            "report": f"{base}/",
            "log, first window": f"{base}/log/",
            "log, middle": f"{base}/log/?line={report.line_count // 2}",
            "log, at the crash (end)": f"{base}/log/?line={crash}",
            # for information: one search request scans a bounded slice of the log
            "log search (info)": f"{base}/log/?q=illegal+memory+access",
        }
        results[label] = {
            "log_bytes": log.stat().st_size,
            "lines": report.line_count,
            "document_bytes": len(json.dumps(report.document)),
            "generate_s": round(generated, 1),
            "analyze_s": round(analyzed, 1),
            "pages": {},
        }
        print(
            f"{label}: {log.stat().st_size / 2**20:,.1f} MiB, {report.line_count:,} lines, "
            f"analysed in {analyzed:.1f} s, document {results[label]['document_bytes'] / 1024:.0f} KiB",
            flush=True,
        )
    for page in urls["small"]:
        runs = max(3, args.runs // 10) if "info" in page else args.runs
        timed = _time_pair(client, {label: urls[label][page] for label in urls}, runs)
        for label, numbers in timed.items():
            results[label]["pages"][page] = numbers
    if not args.keep_logs:
        logs[-1].unlink()

    small, big = results["small"]["pages"], results["big"]["pages"]
    ok = True
    small_name, big_name = _size_name(args.small_mb), _size_name(args.big_mb)
    print(
        f"\n{'page':<26} {small_name + ' median':>13} {big_name + ' median':>14} {'ratio':>7}  target <= 2x"
    )
    for name in small:
        ratio = big[name]["median_ms"] / max(small[name]["median_ms"], 1e-6)
        judged = "info" if "info" in name else ("ok" if ratio <= 2.0 else "SLOW")
        ok &= judged != "SLOW"
        print(
            f"{name:<26} {small[name]['median_ms']:>10.1f}ms {big[name]['median_ms']:>11.1f}ms {ratio:>6.2f}x  {judged}"
        )
        results.setdefault("ratios", {})[name] = round(ratio, 2)
    results["target_met"] = ok
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(
        f"\n{'PASS' if ok else 'FAIL'}: the 1 GiB report pages are {'within' if ok else 'NOT within'} 2x of the 1 MB ones"
    )
    print(f"details: {args.json}")
    import shutil

    shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

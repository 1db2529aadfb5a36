"""Upload-to-report latency of the pipeline for a 10 MB log, beside the parse time of the same log alone.

    python bench/pipeline_latency.py                      # embedded: SQLite + kombu filesystem broker
    python bench/pipeline_latency.py --stack services     # PostgreSQL + Redis of this machine
    python bench/pipeline_latency.py --runs 9 --mb 10 --json bench/out/pipeline_latency.json

It starts the stack of `dispatchlab.stack` (uvicorn and a real Celery worker) on a scratch data
folder (and, for --stack services, a scratch PostgreSQL database and Redis queue), warms the worker
with one upload, then times each run from the start of `POST /api/v1/reports` (multipart, over HTTP)
until `GET /api/v1/reports/<id>` says done. Every run uploads different bytes (one unique line), so
checksum de-duplication never answers early. "Parse alone" is `analyze_paths` on the same file in this
process, warm, i.e. the least any pipeline could take. Overhead = pipeline median - parse median;
the target is < 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from common import BenchStack

ROOT = Path(__file__).resolve().parent.parent
TARGET_OVERHEAD_S = 0.5
POLL_S = 0.05

HEADER = """\
[2026-05-24 00:51:02] server_args=ServerArgs(model_path='Qwen/Qwen3-30B-A3B', tokenizer_path='Qwen/Qwen3-30B-A3B', tp_size=1, dp_size=1, mem_fraction_static=0.88, attention_backend='fa3', chunked_prefill_size=8192, max_running_requests=256, port=30000, host='127.0.0.1')
[2026-05-24 00:51:09 TP0] Init torch distributed begin.
[2026-05-24 00:51:10 TP0] Load weight begin. avail mem=78.68 GB
[2026-05-24 00:51:41 TP0] Load weight end. type=Qwen3MoeForCausalLM, dtype=torch.bfloat16, avail mem=21.43 GB, mem usage=57.25 GB.
[2026-05-24 00:51:42 TP0] KV Cache is allocated. #tokens: 412160, K size: 9.43 GB, V size: 9.43 GB
[2026-05-24 00:51:43 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=2.18 GB
[2026-05-24 00:51:58 TP0] Capture cuda graph end. Time elapsed: 15.02 s. mem usage=0.61 GB. avail mem=1.57 GB.
[2026-05-24 00:52:00] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-05-24 00:52:01] The server is fired up and ready to roll!
"""

CRASH = """\
[2026-05-24 03:11:47 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 2612, in run_scheduler_process
    scheduler.event_loop_overlap()
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/model_runner.py", line 1710, in forward
    return self.forward_decode(forward_batch)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.76 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free.

[2026-05-24 03:11:47] Received sigquit from a child process. It usually means the child failed.
"""


def make_log(path: Path, megabytes: float, *, seed: int = 7) -> None:
    """A realistic SGLang serving log: start-up, decode/prefill batches and requests, then a crash."""
    rng = random.Random(seed)
    target = int(megabytes * 1024 * 1024)
    with path.open("w", encoding="utf-8") as out:
        out.write(HEADER)
        size, second = len(HEADER), 0
        while size < target - len(CRASH):
            second += 1
            stamp = f"2026-05-24 {(second // 3600) % 24:02d}:{(second // 60) % 60:02d}:{second % 60:02d}"
            running = rng.randint(1, 64)
            if rng.random() < 0.15:
                line = (
                    f"[{stamp} TP0] Prefill batch. #new-seq: {rng.randint(1, 8)}, #new-token: {rng.randint(64, 8192)}, "
                    f"#cached-token: {rng.randint(0, 4096)}, token usage: {rng.random():.2f}, "
                    f"#running-req: {running}, #queue-req: {rng.randint(0, 9)}\n"
                )
            elif rng.random() < 0.1:
                line = f'[{stamp}] INFO:     127.0.0.1:{rng.randint(30000, 60000)} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
            else:
                line = (
                    f"[{stamp} TP0] Decode batch. #running-req: {running}, #token: {rng.randint(1000, 400000)}, "
                    f"token usage: {rng.random():.2f}, cuda graph: True, gen throughput (token/s): "
                    f"{rng.uniform(200, 4000):.2f}, #queue-req: {rng.randint(0, 9)}\n"
                )
            out.write(line)
            size += len(line)
        out.write(CRASH)


def with_unique_line(template: bytes) -> bytes:
    return template + f"[2026-05-24 03:11:48] bench run {secrets.token_hex(8)}\n".encode()


# ---------------------------------------------------------------- the stack


@dataclass
class Run:
    total: float  # upload start -> the report row says done (server clock)
    seen: float  # upload start -> the client's poll sees done
    upload: float  # HTTP upload until 201
    queue: float  # 201 -> a worker claims the report
    parse: float  # analyze_paths inside the worker
    store: float  # claim -> done, less the parse: local copies, line index, storing the document
    failure_class: str


class Stack(BenchStack):
    """The scratch stack (bench/common.py) with the timed upload-to-report round trip."""

    def upload_request(self, name: str, content: bytes) -> urllib.request.Request:
        """The multipart request, built before the clock starts: its cost is the client's, not ours."""
        boundary = "bench" + secrets.token_hex(8)
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                "Content-Type: text/plain\r\n\r\n"
            ).encode()
            + content
            + f"\r\n--{boundary}--\r\n".encode()
        )
        return urllib.request.Request(
            self.base_url + "/api/v1/reports",
            data=body,
            method="POST",
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": f"multipart/form-data; boundary={boundary}",
            },
        )

    def status(self, report_id: int) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.base_url}/api/v1/reports/{report_id}", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return dict(json.loads(response.read()))

    def run_once(self, content: bytes) -> Run:
        request = self.upload_request("bench.log", content)
        wall_start, started = time.time(), time.perf_counter()
        with urllib.request.urlopen(request, timeout=120) as response:
            report_id = int(json.loads(response.read())["id"])
        uploaded = time.perf_counter() - started
        while True:
            answer = self.status(report_id)
            if answer["status"] in ("done", "failed"):
                break
            time.sleep(POLL_S)
        seen = time.perf_counter() - started
        if answer["status"] != "done":
            raise SystemExit(f"report {report_id} failed: {answer['error']}")
        # Server-side timestamps (same machine, same clock) split the time and remove the poll lag.
        claimed = datetime.fromisoformat(answer["started_at"]).timestamp() - wall_start
        finished = datetime.fromisoformat(answer["finished_at"]).timestamp() - wall_start
        return Run(
            total=finished,
            seen=seen,
            upload=uploaded,
            queue=claimed - uploaded,
            parse=float(answer["parse_seconds"]),
            store=finished - claimed - float(answer["parse_seconds"]),
            failure_class=answer["document"]["failure_class"],
        )


# ---------------------------------------------------------------- main


def parse_alone(path: Path, runs: int) -> list[float]:
    from dispatchlab.core import analyze_paths
    from dispatchlab.core.lineindex import write_line_index

    analyze_paths([path])  # warm, like the worker after its first report
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        analyze_paths([path])
        times.append(time.perf_counter() - started)
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        write_line_index([path], Path(scratch) / "t", Path(scratch) / "i")
        index_s = time.perf_counter() - started
    print(f"  line index alone (write_line_index): {index_s:.3f} s (part of the pipeline's overhead)")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", choices=["embedded", "services"], default="embedded")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--mb", type=float, default=10.0, help="size of the log in MB")
    parser.add_argument("--concurrency", type=int, default=1, help="worker processes")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))

    with tempfile.TemporaryDirectory(prefix="dispatchlab-bench-") as scratch:
        folder = Path(scratch)
        log = folder / "bench.log"
        make_log(log, args.mb)
        template = log.read_bytes()
        log.write_bytes(with_unique_line(template))
        lines = template.count(b"\n") + 1
        print(f"log: {len(template) / 1e6:.1f} MB, {lines:,} lines (SGLang serving, then an OOM crash)")

        alone = parse_alone(log, args.runs)
        parse_median = statistics.median(alone)
        print(f"parse alone (analyze_paths, warm, median of {args.runs}): {parse_median:.3f} s")

        (folder / "stack").mkdir()
        stack = Stack(args.stack, folder / "stack", args.concurrency)
        try:
            stack.run_once(with_unique_line(template))  # warm the worker (imports, knowledge base)
            runs = [stack.run_once(with_unique_line(template)) for _ in range(args.runs)]
        finally:
            stack.close()

    def median(field: str) -> float:
        return statistics.median(getattr(run, field) for run in runs)

    pipeline_median = median("total")
    overhead = pipeline_median - parse_median
    label = "SQLite + kombu filesystem broker" if args.stack == "embedded" else "PostgreSQL + Redis"
    print(
        f"pipeline upload->done ({args.stack}: {label}, warm worker, median of {args.runs}): "
        f"{pipeline_median:.3f} s  [runs: {', '.join(f'{run.total:.2f}' for run in runs)}]"
    )
    print(
        f"  medians: HTTP upload {median('upload'):.3f} s, queue {median('queue'):.3f} s, "
        f"parse in the worker {median('parse'):.3f} s, copies+line index+store {median('store'):.3f} s; "
        f"seen by a client polling every {POLL_S} s: {median('seen'):.3f} s"
    )
    print(f"  diagnosis: {runs[-1].failure_class}")
    verdict = "OK" if overhead < TARGET_OVERHEAD_S else "OVER TARGET"
    print(
        f"overhead: {overhead:+.3f} s beyond parsing alone, ratio {pipeline_median / parse_median:.2f}x parse "
        f"(target < {TARGET_OVERHEAD_S} s: {verdict})"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "stack": args.stack,
                    "log_bytes": len(template),
                    "runs": args.runs,
                    "parse_alone_s": alone,
                    "runs_s": [run.__dict__ for run in runs],
                    "parse_median_s": parse_median,
                    "pipeline_median_s": pipeline_median,
                    "overhead_s": overhead,
                    "ratio": pipeline_median / parse_median,
                },
                indent=2,
            )
        )
    return 0 if overhead < TARGET_OVERHEAD_S else 1


if __name__ == "__main__":
    sys.exit(main())

"""Load: N clients uploading logs (API, bearer token) and delivering CI webhooks (HMAC-signed) for a while.

    python bench/load.py                                  # 50 clients x 60 s on a scratch services stack
    python bench/load.py --clients 20 --duration 30 --stack embedded
    python bench/load.py --url http://127.0.0.1:8000 --token TOKEN --webhook-secret SECRET

Without --url it starts the production-shaped stack of `dispatchlab.stack` (uvicorn, a Celery worker and
beat) on this machine's PostgreSQL and Redis (DISPATCHLAB_TEST_POSTGRES_URL, DISPATCHLAB_TEST_REDIS_URL),
a scratch database and queue of its own. Every request sends different bytes (one unique line), so
de-duplication never answers early. Afterwards it waits until every accepted report is finished and
prints requests/s, latency percentiles, answers by status, and how many accepted reports never finished
(lost). Exit status 1 when a report was lost or a request got a 5xx or no answer.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import random
import secrets
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "tests" / "pipeline" / "data" / "sglang_oom.log"
TIMEOUT_S = 120


@dataclass
class Target:
    base_url: str
    token: str
    webhook_secret: str
    project: str = "bench"


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    accepted: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, status: str, seconds: float, report_id: int | None) -> None:
        with self.lock:
            self.latencies.append(seconds)
            self.statuses[f"{kind} {status}"] += 1
            if report_id is not None:
                self.accepted.append(report_id)


def _unique(log: bytes) -> bytes:
    return log + f"[2026-05-24 03:11:48] load run {secrets.token_hex(8)}\n".encode()


def upload_request(target: Target, log: bytes) -> urllib.request.Request:
    boundary = "load" + secrets.token_hex(8)
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="server.log"\r\n'
            "Content-Type: text/plain\r\n\r\n"
        ).encode()
        + log
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {
        "Authorization": f"Bearer {target.token}",
        "Content-Type": f"multipart/form-data; boundary={boundary}",
    }
    return urllib.request.Request(target.base_url + "/api/v1/reports", data=body, headers=headers)


def webhook_request(target: Target, log: bytes) -> urllib.request.Request:
    """A CI delivery signed as docs/api-quickstart.md says: HMAC-SHA256 over `<timestamp>.<body>`."""
    body = json.dumps({"log": log.decode(), "job": "load", "commit": secrets.token_hex(20)}).encode()
    timestamp = int(time.time())
    digest = hmac.new(target.webhook_secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    headers = {
        "Content-Type": "application/json",
        "X-Dispatchlab-Timestamp": str(timestamp),
        "X-Dispatchlab-Signature": f"sha256={digest.hexdigest()}",
        "X-Dispatchlab-Delivery": secrets.token_hex(12),
        "X-Dispatchlab-Project": target.project,
    }
    return urllib.request.Request(target.base_url + "/api/v1/hooks/ci", data=body, headers=headers)


def _send(request: urllib.request.Request) -> tuple[str, int | None]:
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return str(response.status), int(json.loads(response.read())["id"])
    except urllib.error.HTTPError as error:
        error.read()
        return str(error.code), None
    except OSError as error:
        return f"no answer ({type(error).__name__})", None


def client(target: Target, log: bytes, webhook_share: float, until: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        webhook = target.webhook_secret and rng.random() < webhook_share
        request = webhook_request(target, _unique(log)) if webhook else upload_request(target, _unique(log))
        started = time.monotonic()
        status, report_id = _send(request)
        tally.record("webhook" if webhook else "upload", status, time.monotonic() - started, report_id)


def unfinished(target: Target, report_ids: list[int], timeout: float) -> tuple[list[int], Counter[str]]:
    """Poll every accepted report until it is done or failed; the ones still open after `timeout`."""
    waiting, outcomes = set(report_ids), Counter[str]()
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for report_id in sorted(waiting):
            request = urllib.request.Request(
                f"{target.base_url}/api/v1/reports/{report_id}",
                headers={"Authorization": f"Bearer {target.token}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    status = json.loads(response.read())["status"]
            except OSError:
                continue
            if status in ("done", "failed"):
                outcomes[status] += 1
                waiting.discard(report_id)
        if waiting:
            time.sleep(1)
    return sorted(waiting), outcomes


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def run(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    log = LOG.read_bytes()
    tally = Tally()
    until = time.monotonic() + args.duration
    threads = [
        threading.Thread(target=client, args=(target, log, args.webhook_share, until, tally, n), daemon=True)
        for n in range(args.clients)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    print(f"waiting for the {len(tally.accepted)} accepted reports to finish ...", flush=True)
    lost, outcomes = unfinished(target, tally.accepted, args.finish_timeout)
    latencies = tally.latencies or [0.0]
    return {
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "requests": len(tally.latencies),
        "requests_per_s": round(len(tally.latencies) / elapsed, 1),
        "latency_ms": {
            name: round(1000 * value, 1)
            for name, value in (
                ("p50", percentile(latencies, 0.50)),
                ("p95", percentile(latencies, 0.95)),
                ("p99", percentile(latencies, 0.99)),
                ("max", max(latencies)),
                ("mean", statistics.fmean(latencies)),
            )
        },
        "answers": dict(sorted(tally.statuses.items())),
        "accepted": len(tally.accepted),
        "finished": dict(outcomes),
        "lost": lost,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument(
        "--duration", "--seconds", dest="duration", type=float, default=60, help="seconds of load"
    )
    parser.add_argument(
        "--webhook-share", type=float, default=0.3, help="share of requests that are webhooks"
    )
    parser.add_argument("--finish-timeout", type=float, default=300, help="seconds to wait for the reports")
    parser.add_argument("--stack", choices=["services", "embedded"], default="services")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2, help="Celery worker processes")
    parser.add_argument("--url", help="load this running server instead of starting one")
    parser.add_argument("--token", help="with --url: a member's API token")
    parser.add_argument("--webhook-secret", default="", help="with --url: the same project's webhook secret")
    parser.add_argument("--project", default="bench", help="with --url: the slug of that project")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    stack = None
    if args.url:
        if not args.token:
            parser.error("--url needs --token")
        target = Target(args.url.rstrip("/"), args.token, args.webhook_secret, args.project)
    else:
        from common import BenchStack

        folder = Path(tempfile.mkdtemp(prefix="dispatchlab-load-"))
        stack = BenchStack(
            args.stack, folder, args.concurrency, web_workers=args.web_workers, beat="separate"
        )
        secret = stack._manage("webhooksecret", "--project", "bench").splitlines()[-1]
        target = Target(stack.base_url, stack.token, secret)
        print(
            f"stack: {args.stack}, uvicorn x{args.web_workers}, worker x{args.concurrency}, logs in {folder}"
        )
    try:
        figures = run(target, args)
    finally:
        if stack is not None:
            stack.close()
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2))
    server_errors = sum(
        count for name, count in figures["answers"].items() if name.split()[-1][:1] not in "1234"
    )
    print(
        f"{figures['requests_per_s']} req/s, p50 {figures['latency_ms']['p50']} ms, "
        f"p95 {figures['latency_ms']['p95']} ms, p99 {figures['latency_ms']['p99']} ms; "
        f"{server_errors} 5xx or unanswered; {len(figures['lost'])} of {figures['accepted']} accepted reports lost"
    )
    return 1 if server_errors or figures["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""Hostile clients at the edge (issue 16): a crowd of signed webhooks, anonymous large bodies, parallel
wrong logins, against the production-shaped stack of `dispatchlab.stack` on this machine's PostgreSQL
and Redis (a scratch database and queue, as bench/load.py).

    python bench/hostile_edge.py [--webhooks 100 --wait 2 --large 6 --push-mb 32 --guesses 40]

Prints, as JSON:
- webhooks: N simultaneous signed deliveries (each waiting ?wait seconds for its parse): answers by
  status, p50/p99 latency, the 5xx count;
- large bodies: for each kind of request that should be refused (an anonymous upload, an anonymous page
  upload, a mistyped path, a well-formed wrong signature), N simultaneous requests announcing 500 MB:
  their answers, the bytes pushed before each answer (the most the server can have read), and how much
  the temporary directory's file system filled meanwhile;
- logins: N parallel wrong guesses for one user: how many were checked, how many refused as locked,
  and the count the server stored (sent vs stored).
Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import html
import json
import os
import re
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

ANNOUNCED = 500_000_000
PASSWORD = "the-right-password-4711"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000, 1) if ordered else 0.0


def signed_webhooks(base_url: str, secret: str, count: int, wait: int) -> dict[str, Any]:
    def deliver(n: int) -> tuple[int, float]:
        body = json.dumps(
            {"log": f"Traceback (most recent call last):\nRuntimeError: crowd {n} {secrets.token_hex(4)}\n"}
        ).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Dispatchlab-Signature": "sha256="
            + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
            "X-Dispatchlab-Project": "bench",
        }
        url = f"{base_url}/api/v1/hooks/ci?wait={wait}"
        started = time.monotonic()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=300) as answer:
                status = answer.status
        except urllib.error.HTTPError as error:
            status = error.code
        except OSError:
            status = 0
        return status, time.monotonic() - started

    with ThreadPoolExecutor(count) as pool:
        results = list(pool.map(deliver, range(count)))
    latencies = [seconds for _, seconds in results]
    statuses = Counter(str(status) for status, _ in results)
    return {
        "sent": count,
        "answers": dict(statuses),
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "server_errors": sum(n for status, n in statuses.items() if status.startswith("5") or status == "0"),
    }


def _push_until_answered(port: int, head: bytes, push_bytes: int) -> tuple[int, int]:
    """Send the head, then body bytes until an answer is readable (or `push_bytes` were sent); the
    status (0: none) and the bytes pushed."""
    piece = b"x" * 65536
    pushed = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        answer = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                answer = sock.recv(65536)
                break
            except BlockingIOError:
                pass
            except OSError:
                break
            if pushed < push_bytes:
                try:
                    pushed += sock.send(piece)
                except BlockingIOError:
                    time.sleep(0.01)
                except OSError:
                    break
            else:
                time.sleep(0.05)
    status = int(answer.split()[1]) if answer.startswith(b"HTTP/") else 0
    return status, pushed


def _crowd_watching_disk(
    port: int, head: bytes, push_bytes: int, count: int, tmp: str
) -> tuple[list[tuple[int, int]], int]:
    """`count` simultaneous pushes of `head`; their results and the least free space of `tmp`'s file
    system seen meanwhile (the server's spooled bodies are unlinked files: only the file system sees them)."""
    lowest = shutil.disk_usage(tmp).free
    done = threading.Event()

    def watch() -> None:
        nonlocal lowest
        while not done.is_set():
            lowest = min(lowest, shutil.disk_usage(tmp).free)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(count) as pool:
            results = list(pool.map(lambda _: _push_until_answered(port, head, push_bytes), range(count)))
    finally:
        done.set()
        watcher.join()
    return results, lowest


def large_bodies(port: int, count: int, push_bytes: int) -> dict[str, Any]:
    zero_signature = "sha256=" + "0" * 64
    kinds = {
        "anonymous upload": ("/api/v1/reports", ""),
        "anonymous page upload": ("/upload/", ""),
        "mistyped path": ("/api/v1/report", ""),
        "wrong signature": (
            "/api/v1/hooks/ci",
            f"X-Dispatchlab-Project: bench\r\nX-Dispatchlab-Signature: {zero_signature}\r\n",
        ),
    }
    figures: dict[str, Any] = {}
    tmp = tempfile.gettempdir()
    for kind, (path, extra) in kinds.items():
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Content-Type: multipart/form-data; boundary=xyz\r\nContent-Length: {ANNOUNCED}\r\n{extra}\r\n"
        ).encode()
        free_before = shutil.disk_usage(tmp).free
        results, lowest_free = _crowd_watching_disk(port, head, push_bytes, count, tmp)
        figures[kind] = {
            "requests": count,
            "announced_bytes_each": ANNOUNCED,
            "answers": dict(Counter(str(status) for status, _ in results)),
            "bytes_pushed_before_answer": [pushed for _, pushed in results],
            "temp_disk_growth_bytes": max(0, free_before - lowest_free),
        }
    return figures


def parallel_logins(base_url: str, manage: Any, count: int) -> dict[str, Any]:
    manage(
        "shell",
        "-c",
        f"from django.contrib.auth.models import User; User.objects.create_user('carol', password={PASSWORD!r})",
    )
    with urllib.request.urlopen(base_url + "/accounts/login/", timeout=30) as response:
        cookie = response.headers["Set-Cookie"].split(";")[0]
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.read().decode())
    assert token is not None
    body = urllib.parse.urlencode(
        {"username": "carol", "password": "wrong", "csrfmiddlewaretoken": token.group(1)}
    ).encode()

    def guess(_: int) -> str:
        request = urllib.request.Request(
            base_url + "/accounts/login/",
            body,
            {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                page = html.unescape(answer.read().decode())
        except urllib.error.HTTPError as error:
            return f"HTTP {error.code}"
        return "locked" if "Too many failed logins" in page else "checked"

    with ThreadPoolExecutor(count) as pool:
        answers = Counter(pool.map(guess, range(count)))
    stored = manage(
        "shell",
        "-c",
        "from django.core.cache import cache; from dispatchlab.security.login import _key; "
        "entry = cache.get(_key('carol', '127.0.0.1')); "
        "print(entry['count'] if isinstance(entry, dict) else entry)",
    )
    return {"sent": count, "answers": dict(answers), "stored_count": stored.strip().splitlines()[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--webhooks", type=int, default=100)
    parser.add_argument("--wait", type=int, default=2, help="?wait seconds of each webhook")
    parser.add_argument("--large", type=int, default=6, help="simultaneous large bodies of each kind")
    parser.add_argument("--push-mb", type=int, default=32, help="most MB pushed into one large body")
    parser.add_argument("--guesses", type=int, default=40)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    from common import BenchStack

    folder = Path(tempfile.mkdtemp(prefix="dispatchlab-edge-"))
    stack = BenchStack("services", folder, 2, web_workers=args.web_workers)
    try:
        secret = stack._manage("webhooksecret", "--project", "bench").splitlines()[-1]
        port = int(stack.base_url.rsplit(":", 1)[1])
        figures = {
            "webhooks": signed_webhooks(stack.base_url, secret, args.webhooks, args.wait),
            "large_bodies": large_bodies(port, args.large, args.push_mb * 1024 * 1024),
            "logins": parallel_logins(stack.base_url, stack._manage, args.guesses),
        }
    finally:
        stack.close()
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2))
    return 1 if figures["webhooks"]["server_errors"] else 0


if __name__ == "__main__":
    os.environ.setdefault("DISPATCHLAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
    sys.exit(main())

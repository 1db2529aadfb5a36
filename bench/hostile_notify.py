"""Hostile webhook endpoints against a production-shaped stack (issue 16, items 2 and 9b).

    python bench/hostile_notify.py                          # PostgreSQL + Redis of this machine
    python bench/hostile_notify.py --uploads 8 --every 5 --stack embedded

It starts the stack of `dispatchlab.stack` (uvicorn, the parsing worker, the notify worker) with
DISPATCHLAB_NOTIFY_ALLOW_NETWORKS=127.0.0.0/8, since its endpoints listen on loopback, then:

1. uploads N logs one after another and times each from the upload to `status: done`;
2. fires test events at two endpoints that answer one byte every --every seconds (enough deliveries to
   keep the notify worker busy throughout) and times N more uploads while they are dribbled;
3. sends one delivery to an endpoint that holds the request, kills -9 the notify worker's process
   during it, runs the sweep (notify.requeue_stale) once the claim is stale, and counts how many times
   the endpoint received the delivery.

Prints the latencies (median, max, ratio) and what held.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import BenchStack

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "tests" / "pipeline" / "data" / "sglang_oom.log"


class Dribbler:
    """Endpoints on 127.0.0.1 that read each request, then answer one byte every `every` seconds (a
    status line that never ends) until the client hangs up."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.received: list[str] = []  # X-Dispatchlab-Delivery of each request
        self.open = 0
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                request += chunk
            headers = request.split(b"\r\n\r\n", 1)[0].decode(errors="replace").lower().splitlines()
            delivery = next(
                (h.split(":", 1)[1].strip() for h in headers if h.startswith("x-dispatchlab-delivery")), ""
            )
            self.received.append(delivery)
            self.open += 1
            try:
                for byte in b"HTTP/1.1 200 " + b"O" * 100_000:
                    if self.stop.wait(self.every):
                        break
                    connection.sendall(bytes([byte]))
            except OSError:
                pass
            finally:
                self.open -= 1

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


class Stack(BenchStack):
    def project(self, name: str, urls: list[str]) -> str:
        token = self._manage("apitoken", "--user", "bench", "--project", name, "--create").splitlines()[-1]
        for url in urls:
            self._manage("notifyendpoint", "--project", name, "--url", url, "--event", "group.new")
        return token

    def upload_until_done(self, token: str) -> float:
        content = LOG.read_bytes() + f"[bench {secrets.token_hex(8)}]\n".encode()
        boundary = "bench" + secrets.token_hex(8)
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="server.log"\r\n'
                "Content-Type: text/plain\r\n\r\n"
            ).encode()
            + content
            + f"\r\n--{boundary}--\r\n".encode()
        )
        request = urllib.request.Request(
            self.base_url + "/api/v1/reports",
            data=body,
            method="POST",
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": f"multipart/form-data; boundary={boundary}",
            },
        )
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=120) as response:
            report_id = json.loads(response.read())["id"]
        while True:
            status = urllib.request.Request(
                f"{self.base_url}/api/v1/reports/{report_id}", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(status, timeout=30) as response:
                answer = json.loads(response.read())
            if answer["status"] in ("done", "failed"):
                return time.perf_counter() - started
            if time.perf_counter() - started > 900:
                raise SystemExit(f"report {report_id} still {answer['status']} after 900 s")
            time.sleep(0.05)

    def shell(self, code: str) -> str:
        return self._manage("shell", "-c", code)

    def send_test_events(self, project: str, rounds: int) -> None:
        self.shell(
            "from dispatchlab.notify.models import Endpoint\n"
            "from dispatchlab.notify.services import endpoint_send_test\n"
            f"for _ in range({rounds}):\n"
            f"    for e in Endpoint.objects.filter(project__slug={project!r}):\n"
            "        endpoint_send_test(endpoint=e, user=None)\n"
        )

    def deliveries(self, project: str) -> list[dict[str, Any]]:
        out = self.shell(
            "import json\nfrom dispatchlab.notify.models import Delivery\n"
            f"rows = Delivery.objects.filter(endpoint__project__slug={project!r}).order_by('id')\n"
            "print(json.dumps([{'status': d.status, 'attempts': d.attempts, 'error': d.error} for d in rows]))"
        )
        return list(json.loads(out.splitlines()[-1]))

    def notify_pool(self) -> list[int]:
        assert self.running is not None
        worker = self.running.processes["notify"]
        found = subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True, text=True, check=False)
        return [int(pid) for pid in found.stdout.split()]

    def send_task(self, name: str, args: list[Any]) -> None:
        from celery import Celery

        client = Celery("bench", broker=self.env["DISPATCHLAB_BROKER_URL"])
        client.send_task(name, args=args, queue=self.env["DISPATCHLAB_QUEUE"] + ".notify")
        client.close()


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _figures(times: list[float]) -> str:
    return f"median {statistics.median(times):.2f} s, max {max(times):.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", choices=["embedded", "services"], default="services")
    parser.add_argument("--uploads", type=int, default=6)
    parser.add_argument(
        "--every", type=float, default=5.0, help="seconds between the bytes an endpoint answers"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ["DISPATCHLAB_NOTIFY_ALLOW_NETWORKS"] = "127.0.0.0/8"  # the endpoints below are on loopback
    held: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="hostile-notify-"))
    stack = Stack(args.stack, Path(folder), concurrency=2)
    dribbler = Dribbler(args.every)
    try:
        quiet = stack.project("quiet", [])
        stack.upload_until_done(quiet)  # warm
        baseline = [stack.upload_until_done(quiet) for _ in range(args.uploads)]
        print(f"upload -> done, no notifications:           {_figures(baseline)}")

        stack.project("slow", [dribbler.url + "/a", dribbler.url + "/b"])
        stack.send_test_events("slow", rounds=args.uploads)
        deadline = time.monotonic() + 60
        while not dribbler.received and time.monotonic() < deadline:
            time.sleep(0.1)
        dribbled = []
        slow = []
        for _ in range(args.uploads):
            slow.append(stack.upload_until_done(quiet))
            dribbled.append(dribbler.open)
        print(f"upload -> done, slow endpoint (1 B / {args.every:g} s): {_figures(slow)}")
        ratio = statistics.median(slow) / statistics.median(baseline)
        print(
            f"  ratio of medians {ratio:.2f}; deliveries being dribbled as each report finished: {dribbled}"
        )
        if all(dribbled):
            held.append("every report finished while a delivery was being dribbled")
        deadline = time.monotonic() + 60  # let the first attempts reach their deadline
        while (
            sum(r["status"] == "failed" for r in stack.deliveries("slow")) < 2 and time.monotonic() < deadline
        ):
            time.sleep(1)
        rows = stack.deliveries("slow")
        finished = [r for r in rows if r["status"] == "failed"]
        timed_out = [r for r in finished if r["error"].startswith("timed out after")]
        print(
            f"  slow deliveries: {len(rows)}, failed so far {len(finished)} "
            f"({len(timed_out)} timed out at the deadline), requests received {len(dribbler.received)}"
        )
        if timed_out and len(set(dribbler.received)) == len(dribbler.received):
            held.append("each slow attempt ended at the total deadline and no delivery id came twice")

        # ---- kill -9 during a delivery
        holder = Dribbler(args.every)
        try:
            stack.project("killed", [holder.url + "/hook"])
            # the slow endpoints go: their queued deliveries find nothing to send
            stack.shell(
                "from dispatchlab.notify.models import Endpoint\n"
                "Endpoint.objects.filter(project__slug='slow').delete()"
            )
            stack.send_test_events("killed", rounds=1)
            deadline = time.monotonic() + 60
            while not holder.received and time.monotonic() < deadline:
                time.sleep(0.1)
            _say(f"the held endpoint received {len(holder.received)} request(s)")
            pool = stack.notify_pool()
            for pid in pool:
                os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            print(f"killed -9 the notify worker's pool {pool} while the endpoint held the request")
            _say("waiting for the killed delivery to be recorded")
            while stack.deliveries("killed")[0]["status"] in ("pending", "sending"):
                if time.monotonic() - killed_at > 180:
                    break
                time.sleep(1)
            stack.send_task("notify.requeue_stale", [])  # what beat runs every minute
            time.sleep(5)
            row = stack.deliveries("killed")[0]
            print(
                f"  after {time.monotonic() - killed_at:.0f} s: delivery {row['status']} after "
                f"{row['attempts']} attempt(s) ({row['error'][:90]}...); the endpoint received it "
                f"{len(holder.received)} time(s)"
            )
            if len(holder.received) == 1 and row["status"] == "failed":
                held.append("the killed delivery was recorded as interrupted and received once")
        finally:
            holder.close()
    finally:
        dribbler.close()
        stack.close()
    if len(held) == 3:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        print(f"the stack's logs are kept in {folder}")
    print("held:" if held else "nothing held")
    for line in held:
        print(f"  - {line}")
    return 0 if len(held) == 3 else 1


if __name__ == "__main__":
    sys.exit(main())

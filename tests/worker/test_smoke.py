"""Talking to a launched server: readiness, the smoke answer judged, throughput, and every failure
reported in the result instead of raised. A small stdlib HTTP server plays the OpenAI-compatible
server: sensible, collapsed to '!!!!', chat-only, never healthy, broken, slow."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dispatchlab.core.garbage import GarbageKind
from worker.smoke import ReadyOutcome, measure_throughput, smoke_request, wait_until_ready

SENSIBLE = " Paris. It is known for the Eiffel Tower, the Louvre and its cafés."


@dataclass
class FakeServer:
    """How the pretend server behaves, and what it saw."""

    answer: str = SENSIBLE
    healthy: bool = True
    health_route: bool = True  # False: /health is 404, readiness only through /v1/models
    completions_status: int = 200  # 404: chat only; 500: broken
    delay: float = 0.0  # seconds spent on each completion
    usage: bool = True
    refuse_ignore_eos: bool = False
    bodies: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def completion(self, body: dict[str, Any], chat: bool) -> tuple[int, dict[str, Any]]:
        if self.refuse_ignore_eos and "ignore_eos" in body:
            return 400, {"error": {"message": "Unrecognized request argument supplied: ignore_eos"}}
        with self.lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            time.sleep(self.delay)
        finally:
            with self.lock:
                self.in_flight -= 1
        tokens = body["max_tokens"] if body.get("ignore_eos") else len(self.answer.split())
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if body.get("ignore_eos") else "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": self.answer}
        else:
            choice["text"] = self.answer
        answer: dict[str, Any] = {"id": "cmpl-1", "model": body.get("model"), "choices": [choice]}
        if self.usage:
            answer["usage"] = {"prompt_tokens": 6, "completion_tokens": tokens, "total_tokens": 6 + tokens}
        return 200, answer


def _handler(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def reply(self, status: int, payload: dict[str, Any] | None = None) -> None:
            data = json.dumps(payload or {}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health" and server.health_route:
                self.reply(200 if server.healthy else 503)
            elif self.path == "/v1/models":
                if server.healthy:
                    self.reply(200, {"object": "list", "data": [{"id": "tiny-model", "object": "model"}]})
                else:
                    self.reply(503, {"error": "loading weights"})
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            server.bodies.append({"path": self.path, **body})
            if self.path == "/v1/completions" and server.completions_status != 200:
                message = {404: "Not Found", 500: "CUDA error: an illegal memory access was encountered"}
                self.reply(
                    server.completions_status, {"error": {"message": message[server.completions_status]}}
                )
            elif self.path in ("/v1/completions", "/v1/chat/completions"):
                self.reply(*server.completion(body, chat=self.path.endswith("chat/completions")))
            else:
                self.reply(404, {"detail": "Not Found"})

    return Handler


@contextmanager
def serving(server: FakeServer) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    httpd.daemon_threads = True
    httpd.block_on_close = False  # a handler still sleeping for a timed-out request is abandoned
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def alive() -> bool:
    return True


def test_a_healthy_server_is_ready_at_once():
    with serving(FakeServer()) as url:
        ready = wait_until_ready(url, deadline=time.monotonic() + 5, is_alive=alive)
    assert ready.ready and ready.outcome == ReadyOutcome.READY
    assert ready.url == f"{url}/health" and ready.attempts == 1 and ready.seconds < 2


def test_a_server_without_a_health_route_is_ready_by_its_model_list():
    with serving(FakeServer(health_route=False)) as url:
        ready = wait_until_ready(url, deadline=time.monotonic() + 5, is_alive=alive)
    assert ready.ready and ready.url == f"{url}/v1/models"


def test_a_server_that_never_becomes_healthy_runs_out_of_time_and_says_so():
    with serving(FakeServer(healthy=False)) as url:
        started = time.monotonic()
        ready = wait_until_ready(url, deadline=started + 0.8, is_alive=alive, poll_interval=0.1)
        took = time.monotonic() - started
    assert not ready.ready and ready.outcome == ReadyOutcome.DEADLINE_PASSED
    assert "503" in (ready.last_error or "") and "still running" in ready.reason
    assert 0.7 <= took < 2.5 and ready.attempts >= 4


def test_a_process_that_dies_while_loading_is_reported_as_dead_not_as_slow():
    calls = iter([True, True, False])
    with serving(FakeServer(healthy=False)) as url:
        started = time.monotonic()
        ready = wait_until_ready(url, deadline=started + 30, is_alive=lambda: next(calls), poll_interval=0.05)
    assert ready.outcome == ReadyOutcome.PROCESS_DIED and not ready.ready
    assert "exited" in ready.reason and time.monotonic() - started < 5


def test_a_sensible_answer_passes_the_smoke_test():
    server = FakeServer()
    with serving(server) as url:
        smoke = smoke_request(url)
    assert smoke.ok and smoke.answered and smoke.error is None and smoke.status == 200
    assert smoke.text == SENSIBLE and not smoke.garbage.garbage
    assert smoke.completion_tokens == len(SENSIBLE.split()) and smoke.finish_reason == "stop"
    assert smoke.url.endswith("/v1/completions") and smoke.latency_s > 0
    # The model comes from /v1/models; the request is greedy and short.
    assert smoke.model == "tiny-model"
    sent = server.bodies[-1]
    assert sent["model"] == "tiny-model" and sent["temperature"] == 0 and sent["max_tokens"] == 32
    assert sent["prompt"] == "The capital of France is"


def test_an_answer_of_exclamation_marks_is_flagged_as_garbage_with_its_reason():
    with serving(FakeServer(answer="!" * 32)) as url:
        smoke = smoke_request(url, model="tiny-model")
    assert smoke.answered and not smoke.ok and smoke.error is None
    assert smoke.garbage.garbage and smoke.garbage.kind == GarbageKind.PUNCTUATION_RUN
    assert "'!'" in smoke.garbage.reason and "100%" in smoke.garbage.reason


def test_a_server_without_completions_is_asked_through_chat():
    server = FakeServer(completions_status=404)
    with serving(server) as url:
        smoke = smoke_request(url, model="tiny-model", prompt="What is the capital of France?")
    assert smoke.ok and smoke.text == SENSIBLE and smoke.url.endswith("/v1/chat/completions")
    assert [body["path"] for body in server.bodies] == ["/v1/completions", "/v1/chat/completions"]
    assert server.bodies[-1]["messages"] == [{"role": "user", "content": "What is the capital of France?"}]


def test_a_server_error_is_reported_in_the_result_not_raised():
    with serving(FakeServer(completions_status=500)) as url:
        smoke = smoke_request(url, model="tiny-model")
    assert not smoke.ok and not smoke.answered and smoke.status == 500
    assert "HTTP 500" in (smoke.error or "") and "illegal memory access" in (smoke.error or "")
    # A failed request is an error, not garbage.
    assert not smoke.garbage.garbage and smoke.text == ""


def test_a_server_that_hangs_is_given_up_on_at_the_timeout():
    with serving(FakeServer(delay=3.0)) as url:
        started = time.monotonic()
        smoke = smoke_request(url, model="tiny-model", timeout=0.5)
        took = time.monotonic() - started
    assert not smoke.answered and "timed out" in (smoke.error or "") and took < 2.0


def test_nothing_listening_is_an_answer_not_an_exception():
    url = closed_port_url()
    ready = wait_until_ready(url, deadline=time.monotonic() + 0.3, is_alive=alive, poll_interval=0.05)
    assert ready.outcome == ReadyOutcome.DEADLINE_PASSED and "refused" in (ready.last_error or "")
    smoke = smoke_request(url, timeout=2)
    assert not smoke.answered and smoke.status is None and "refused" in (smoke.error or "")
    points = measure_throughput(url, model="m", concurrency_levels=(2,), requests_per_level=2, timeout=2)
    assert points[0].errors == 2 and points[0].completion_tokens == 0 and points[0].tokens_per_s == 0
    assert "refused" in (points[0].first_error or "")
    assert not smoke_request("not a url", timeout=1).answered


def test_an_openai_client_style_base_url_ending_in_v1_works():
    with serving(FakeServer()) as url:
        assert smoke_request(f"{url}/v1/").ok
        assert wait_until_ready(f"{url}/v1", deadline=time.monotonic() + 5, is_alive=alive).ready


def test_throughput_honours_each_concurrency_and_counts_tokens():
    server = FakeServer(delay=0.1)
    with serving(server) as url:
        serial = measure_throughput(url, concurrency_levels=(1,), requests_per_level=4, max_tokens=64)
        serial_peak = server.peak_in_flight
        parallel = measure_throughput(url, concurrency_levels=(4,), requests_per_level=8, max_tokens=64)
    assert serial_peak == 1 and server.peak_in_flight == 4
    one, four = serial[0], parallel[0]
    assert (one.concurrency, one.requests, four.concurrency, four.requests) == (1, 4, 4, 8)
    # ignore_eos makes every answer max_tokens long, as the server's usage reports.
    assert one.completion_tokens == 4 * 64 and four.completion_tokens == 8 * 64
    assert one.ignore_eos and four.ignore_eos and not one.tokens_estimated
    assert one.errors == four.errors == 0 and one.first_error is None
    assert 0 < one.tokens_per_s < four.tokens_per_s
    assert one.seconds >= 0.4 and four.seconds < one.seconds
    assert all(body.get("ignore_eos") is True for body in server.bodies)


def test_throughput_drops_ignore_eos_when_the_server_refuses_it():
    server = FakeServer(refuse_ignore_eos=True)
    with serving(server) as url:
        points = measure_throughput(url, model="tiny-model", concurrency_levels=(1, 2), requests_per_level=2)
    assert [p.errors for p in points] == [0, 0] and not any(p.ignore_eos for p in points)
    assert all(p.completion_tokens == 2 * len(SENSIBLE.split()) for p in points)


def test_throughput_without_usage_is_estimated_and_marked_so():
    with serving(FakeServer(usage=False)) as url:
        (point,) = measure_throughput(
            url, model="m", concurrency_levels=(2,), requests_per_level=2, max_tokens=16
        )
    # finish_reason 'length' under ignore_eos: each answer counts max_tokens.
    assert point.tokens_estimated and point.completion_tokens == 2 * 16


def test_throughput_against_a_broken_server_counts_errors():
    with serving(FakeServer(completions_status=500)) as url:
        points = measure_throughput(url, model="m", concurrency_levels=(1, 4), requests_per_level=4)
    assert [(p.concurrency, p.requests, p.errors) for p in points] == [(1, 4, 4), (4, 4, 4)]
    assert all(p.completion_tokens == 0 and "HTTP 500" in (p.first_error or "") for p in points)


def test_every_result_travels_as_json():
    with serving(FakeServer(answer="the the the the the the the the the the")) as url:
        ready = wait_until_ready(url, deadline=time.monotonic() + 5, is_alive=alive)
        smoke = smoke_request(url)
        points = measure_throughput(url, concurrency_levels=(1,), requests_per_level=1)
    for result in (ready.to_dict(), smoke.to_dict(), points[0].to_dict()):
        assert json.loads(json.dumps(result)) == result
    assert ready.to_dict()["outcome"] == "ready"
    assert smoke.to_dict()["garbage"] == {
        "garbage": True,
        "kind": "repeated_token",
        "reason": smoke.garbage.reason,
        "score": 1.0,
    }

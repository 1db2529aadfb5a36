"""Does a re-run server answer sensibly? Readiness, one smoke request, a throughput sample.

Talks to any OpenAI-compatible server (SGLang, vLLM, a repro program) with the standard library
only. No function raises on a network failure or a bad answer: the result says what went wrong.
Every request carries a timeout (urllib's, per socket operation: a non-streaming answer arrives in
one piece), and waiting for readiness stops at a deadline.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dispatchlab.core.garbage import GarbageVerdict, detect_garbage

# The server runs on this host: an http_proxy in the worker's environment must not intercept it.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_SNIPPET_CHARS = 500
_COMPLETIONS = "/v1/completions"
_CHAT = "/v1/chat/completions"
_MODELS = "/v1/models"
# Judged only when an answer arrived: a failed request is an error, not garbage.
_NO_ANSWER = GarbageVerdict(garbage=False, kind=None, reason="no answer to judge", score=0.0)
THROUGHPUT_PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."


class ReadyOutcome(StrEnum):
    READY = "ready"
    PROCESS_DIED = "process_died"
    DEADLINE_PASSED = "deadline_passed"


@dataclass(frozen=True)
class ReadyResult:
    ready: bool
    outcome: ReadyOutcome
    url: str | None  # the health URL that answered 200
    seconds: float
    attempts: int
    last_error: str | None  # what the last unsuccessful poll saw ('/health: HTTP 503 ...')
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "outcome": str(self.outcome),
            "url": self.url,
            "seconds": round(self.seconds, 3),
            "attempts": self.attempts,
            "last_error": self.last_error,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class SmokeResult:
    ok: bool  # an answer arrived and it is not garbage
    answered: bool  # HTTP 200 with a readable completion
    url: str  # the endpoint that answered, or the last one tried
    model: str | None
    status: int | None  # None when no HTTP answer came at all
    text: str
    completion_tokens: int | None  # from usage.completion_tokens, when the server gives it
    finish_reason: str | None
    latency_s: float
    error: str | None
    garbage: GarbageVerdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "answered": self.answered,
            "url": self.url,
            "model": self.model,
            "status": self.status,
            "text": self.text,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "latency_s": round(self.latency_s, 3),
            "error": self.error,
            "garbage": self.garbage.to_dict(),
        }


@dataclass(frozen=True)
class ThroughputPoint:
    concurrency: int
    requests: int
    completion_tokens: int
    seconds: float
    tokens_per_s: float
    errors: int
    ignore_eos: bool  # whether requests asked the server to ignore EOS (it refused it otherwise)
    tokens_estimated: bool  # some answers carried no usage: their tokens were estimated
    first_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "completion_tokens": self.completion_tokens,
            "seconds": round(self.seconds, 3),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "errors": self.errors,
            "ignore_eos": self.ignore_eos,
            "tokens_estimated": self.tokens_estimated,
            "first_error": self.first_error,
        }


@dataclass(frozen=True)
class _Reply:
    status: int | None
    body: bytes
    error: str | None  # None only for a 2xx answer
    seconds: float


def _snippet(body: bytes) -> str:
    text = " ".join(body.decode("utf-8", errors="replace").split())
    return text if len(text) <= _SNIPPET_CHARS else text[: _SNIPPET_CHARS - 3] + "..."


def _describe(error: BaseException, timeout: float) -> str:
    if isinstance(error, urllib.error.URLError) and isinstance(error.reason, BaseException):
        error = error.reason
    if isinstance(error, TimeoutError):
        return f"timed out after {timeout:g}s"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (nothing listening)"
    if isinstance(error, urllib.error.URLError):
        return f"cannot connect: {error.reason}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _http(url: str, payload: dict[str, Any] | None, timeout: float) -> _Reply:
    """GET (no payload) or POST JSON; never raises for network trouble."""
    data = None if payload is None else json.dumps(payload).encode()
    started = time.monotonic()
    try:
        request = urllib.request.Request(
            url,
            data=data,
            method="GET" if data is None else "POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        with _OPENER.open(request, timeout=max(timeout, 0.001)) as response:
            return _Reply(response.status, response.read(), None, time.monotonic() - started)
    except urllib.error.HTTPError as error:
        try:
            body = error.read()
        except (OSError, http.client.HTTPException):
            body = b""
        detail = _snippet(body) or str(error.reason)
        return _Reply(error.code, body, f"HTTP {error.code}: {detail}", time.monotonic() - started)
    except (OSError, http.client.HTTPException, ValueError) as error:
        # URLError, refused or reset connections, timeouts, a truncated answer, a malformed URL.
        return _Reply(None, b"", _describe(error, timeout), time.monotonic() - started)


def _base(base_url: str) -> str:
    """'http://h:30000/', 'http://h:30000/v1' (an OpenAI client's base URL) -> 'http://h:30000'."""
    base = base_url.strip().rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def wait_until_ready(
    base_url: str,
    *,
    health_paths: Sequence[str] = ("/health", _MODELS),
    deadline: float,
    is_alive: Callable[[], bool],
    poll_interval: float = 1.0,
    request_timeout: float = 5.0,
) -> ReadyResult:
    """Poll the health URLs until one answers 200, the process dies or `deadline` (a
    `time.monotonic()` value) passes; the result says which of the three happened."""
    base = _base(base_url)
    started = time.monotonic()
    attempts = 0
    last_error: str | None = None

    def result(outcome: ReadyOutcome, url: str | None, reason: str) -> ReadyResult:
        return ReadyResult(
            ready=outcome is ReadyOutcome.READY,
            outcome=outcome,
            url=url,
            seconds=time.monotonic() - started,
            attempts=attempts,
            last_error=last_error,
            reason=reason,
        )

    paths = " or ".join(health_paths)
    while True:
        if not is_alive():
            elapsed = time.monotonic() - started
            return result(
                ReadyOutcome.PROCESS_DIED,
                None,
                f"the server process exited after {elapsed:.1f}s, before {paths} answered",
            )
        for path in health_paths:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            attempts += 1
            reply = _http(base + path, None, min(request_timeout, remaining))
            if reply.status == 200:
                return result(ReadyOutcome.READY, base + path, f"{path} answered 200")
            last_error = f"{path}: {reply.error}"
        now = time.monotonic()
        if now >= deadline:
            # A process that died during the last poll died: say so rather than 'too slow'.
            if not is_alive():
                return result(
                    ReadyOutcome.PROCESS_DIED, None, f"the server process exited before {paths} answered"
                )
            return result(
                ReadyOutcome.DEADLINE_PASSED,
                None,
                f"no 200 from {paths} within {now - started:.1f}s; the process is still running",
            )
        time.sleep(max(0.0, min(poll_interval, deadline - now)))


def _first_model(base: str, timeout: float) -> str | None:
    reply = _http(base + _MODELS, None, timeout)
    if reply.status != 200:
        return None
    try:
        data = json.loads(reply.body)["data"]
        model = data[0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return model if isinstance(model, str) else None


@dataclass(frozen=True)
class _Completion:
    url: str
    status: int | None
    text: str | None  # None: no readable completion
    completion_tokens: int | None
    finish_reason: str | None
    seconds: float
    error: str | None


def _complete(
    base: str,
    path: str,
    *,
    model: str | None,
    prompt: str,
    max_tokens: int,
    extra: dict[str, Any],
    timeout: float,
) -> _Completion:
    payload: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0, **extra}
    if model is not None:
        payload["model"] = model
    if path == _CHAT:
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    url = base + path
    reply = _http(url, payload, timeout)
    if reply.error is not None:
        return _Completion(url, reply.status, None, None, None, reply.seconds, reply.error)
    try:
        answer = json.loads(reply.body)
        choice = answer["choices"][0]
        if path == _CHAT:
            message = choice["message"]
            # A reasoning model may spend a short budget entirely on its reasoning.
            text = message.get("content") or message.get("reasoning_content") or ""
        else:
            text = choice["text"]
        if not isinstance(text, str):
            raise TypeError("text is not a string")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        error = f"HTTP {reply.status} but no completion in the answer: {_snippet(reply.body)}"
        return _Completion(url, reply.status, None, None, None, reply.seconds, error)
    usage = answer.get("usage") if isinstance(answer, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    return _Completion(
        url,
        reply.status,
        text,
        tokens if isinstance(tokens, int) else None,
        finish if isinstance(finish, str) else None,
        reply.seconds,
        None,
    )


def _complete_any(
    base: str, *, model: str | None, prompt: str, max_tokens: int, extra: dict[str, Any], timeout: float
) -> tuple[_Completion, str]:
    """Completions first; chat when the server has no completions route. Returns the endpoint used."""
    started = time.monotonic()
    first = _complete(
        base, _COMPLETIONS, model=model, prompt=prompt, max_tokens=max_tokens, extra=extra, timeout=timeout
    )
    if first.status not in (404, 405):
        return first, _COMPLETIONS
    remaining = timeout - (time.monotonic() - started)
    if remaining <= 0:
        return first, _COMPLETIONS
    chat = _complete(
        base, _CHAT, model=model, prompt=prompt, max_tokens=max_tokens, extra=extra, timeout=remaining
    )
    return chat, _CHAT


def smoke_request(
    base_url: str,
    *,
    model: str | None = None,
    prompt: str = "The capital of France is",
    max_tokens: int = 32,
    timeout: float = 60.0,
) -> SmokeResult:
    """One greedy request through /v1/completions (/v1/chat/completions when that is 404), its answer
    judged by detect_garbage. `model` None: the first model /v1/models lists, else the server's
    default. `timeout` bounds the whole call."""
    base = _base(base_url)
    started = time.monotonic()
    if model is None:
        model = _first_model(base, min(10.0, timeout / 2))
    remaining = max(0.001, timeout - (time.monotonic() - started))
    done, _ = _complete_any(
        base, model=model, prompt=prompt, max_tokens=max_tokens, extra={}, timeout=remaining
    )
    answered = done.text is not None
    verdict = detect_garbage(done.text) if done.text is not None else _NO_ANSWER
    return SmokeResult(
        ok=answered and not verdict.garbage,
        answered=answered,
        url=done.url,
        model=model,
        status=done.status,
        text=done.text or "",
        completion_tokens=done.completion_tokens,
        finish_reason=done.finish_reason,
        latency_s=done.seconds,
        error=done.error,
        garbage=verdict,
    )


def _tokens_of(done: _Completion, max_tokens: int) -> tuple[int, bool]:
    """Completion tokens of one answer and whether they are an estimate (no usage in the answer)."""
    if done.completion_tokens is not None:
        return done.completion_tokens, False
    if done.finish_reason == "length":
        return max_tokens, True
    return len((done.text or "").split()), True


def _refuses_ignore_eos(done: _Completion) -> bool:
    return done.status in (400, 422) and "ignore_eos" in (done.error or "")


def measure_throughput(
    base_url: str,
    *,
    model: str | None = None,
    concurrency_levels: Sequence[int] = (1, 4),
    requests_per_level: int = 8,
    max_tokens: int = 64,
    timeout: float = 120.0,
    prompt: str = THROUGHPUT_PROMPT,
) -> list[ThroughputPoint]:
    """Decode throughput at each concurrency: `requests_per_level` requests (at least one per slot)
    sent by that many threads at once. Asks the server to ignore EOS so each answer is `max_tokens`
    long (SGLang and vLLM accept it); a server that refuses the field gets requests without it.
    `timeout` bounds each request."""
    base = _base(base_url)
    if model is None:
        model = _first_model(base, min(10.0, timeout))
    extra: dict[str, Any] = {"ignore_eos": True}
    # One warm-up request: it pays for lazy initialisation, finds the endpoint, and learns whether
    # the server accepts ignore_eos.
    warm, path = _complete_any(
        base, model=model, prompt=prompt, max_tokens=max_tokens, extra=extra, timeout=timeout
    )
    if _refuses_ignore_eos(warm):
        extra = {}
        _complete(base, path, model=model, prompt=prompt, max_tokens=max_tokens, extra=extra, timeout=timeout)

    def one(_: int) -> _Completion:
        return _complete(
            base, path, model=model, prompt=prompt, max_tokens=max_tokens, extra=extra, timeout=timeout
        )

    points = []
    for concurrency in concurrency_levels:
        concurrency = max(1, concurrency)
        count = max(requests_per_level, concurrency)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="smoke") as pool:
            results = list(pool.map(one, range(count)))
        seconds = time.monotonic() - started
        answered = [done for done in results if done.text is not None]
        counted = [_tokens_of(done, max_tokens) for done in answered]
        tokens = sum(n for n, _ in counted)
        failures = [done.error for done in results if done.text is None]
        points.append(
            ThroughputPoint(
                concurrency=concurrency,
                requests=count,
                completion_tokens=tokens,
                seconds=seconds,
                tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
                errors=len(failures),
                ignore_eos=bool(extra),
                tokens_estimated=any(estimated for _, estimated in counted),
                first_error=failures[0] if failures else None,
            )
        )
    return points

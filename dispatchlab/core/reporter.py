"""`dispatchlab report`: send logs to a dispatchlab server as one report, wait, print the diagnosis.

Two ways in (docs/contract.md, HTTP API):
- the upload API, `POST /api/v1/reports` with `Authorization: Bearer <token>`;
- the CI webhook, `POST /api/v1/hooks/ci`, signed with the project's webhook secret: HMAC-SHA256 over
  `<timestamp>.<raw body>` (`X-Dispatchlab-Signature: sha256=<hex>`, `X-Dispatchlab-Timestamp`), which
  also stores the CI job, its URL and the commit, read here from the CI's own environment.

The logs travel as they are on disk (plain, .gz, .zip: the server reads them) in one multipart body that
is streamed from the files, never held in memory; the webhook path reads them once more to sign them.
Standard library only: this runs in CI images that have nothing but Python.

Exit codes: 0 once the server stored the report (whatever the log shows), 1 when it could not be
reported (one line on stderr saying why), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dispatchlab.core.report_args import ENV_PROJECT, ENV_SECRET, ENV_TOKEN, ENV_URL, add_report_arguments
from dispatchlab.core.upload import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    FINISHED,
    HOOK_MAX_WAIT,
    HOOK_PATH,
    POLL_FIRST,
    POLL_MAX,
    REPORTS_PATH,
    UPLOAD_TIMEOUT,
    CiContext,
    LogFile,
    Multipart,
    ReportFailed,
    UsageError,
    ci_from_env,
    collect_logs,
    signature,
)

__all__ = [
    "CiContext",
    "LogFile",
    "Multipart",
    "ReportFailed",
    "UsageError",
    "add_report_arguments",
    "ci_from_env",
    "collect_logs",
    "run_report",
    "signature",
]


# ---------------------------------------------------------------- HTTP


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: dict[str, Any]
    location: str = ""
    reason: str = ""


def _base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"the server URL must start with http:// or https:// (got {url!r})")
    for suffix in (REPORTS_PATH, HOOK_PATH):
        url = url.removesuffix(suffix)
    return url


def _reach_reason(reason: object) -> str:
    import socket
    import ssl

    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return f"unknown host ({reason.strerror})"
    if isinstance(reason, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(reason, ssl.SSLError):
        return f"TLS failed ({getattr(reason, 'reason', None) or reason})"
    if isinstance(reason, BrokenPipeError | ConnectionResetError | ConnectionAbortedError):
        return "the server closed the connection"
    if isinstance(reason, OSError):
        return reason.strerror or str(reason) or type(reason).__name__
    return str(reason) or type(reason).__name__


def _connection(url: str, timeout: float) -> tuple[Any, str]:
    """An http.client connection for `url` (through the environment's proxy, as urllib would go) and
    the request target to send."""
    import base64
    import http.client
    import ssl
    import urllib.request
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    proxy = urllib.request.getproxies().get(parts.scheme, "")
    if proxy and urllib.request.proxy_bypass(host):
        proxy = ""
    via = urlsplit(proxy if "://" in proxy else f"http://{proxy}") if proxy else None
    proxy_headers: dict[str, str] = {}
    if via is not None and via.username:
        credentials = f"{unquote(via.username)}:{unquote(via.password or '')}"
        proxy_headers["Proxy-Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        context = ssl.create_default_context()
        if via is not None:
            connection = http.client.HTTPSConnection(
                via.hostname or "", via.port or 80, timeout=timeout, context=context
            )
            connection.set_tunnel(host, port or 443, headers=proxy_headers)
        else:
            connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    elif via is not None:
        connection = http.client.HTTPConnection(via.hostname or "", via.port or 80, timeout=timeout)
        target = url  # a plain-HTTP proxy takes the absolute URL
        connection.proxy_headers = proxy_headers  # type: ignore[attr-defined]
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    return connection, target


def http_call(
    method: str,
    url: str,
    *,
    body: Multipart | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = UPLOAD_TIMEOUT,
) -> HttpAnswer:
    """One request; every answer comes back as HttpAnswer, only not reaching the server raises.

    http.client rather than urllib: a server that refuses an upload by its length answers (413) and
    closes before the body is sent, and the answer must still be read. Redirects are not followed
    (a POST turned into a GET would lose the upload)."""
    import http.client
    import select

    origin = url.split("/api/", 1)[0]
    all_headers = {"User-Agent": "dispatchlab-report", "Accept": "application/json", **(headers or {})}
    if body is not None:
        all_headers["Content-Type"] = body.content_type
        all_headers["Content-Length"] = str(len(body))
    try:
        connection, target = _connection(url, timeout)
    except (OSError, ValueError) as failure:
        raise ReportFailed(f"cannot reach {origin}: {_reach_reason(failure)}") from None
    try:
        connection.putrequest(method, target, skip_accept_encoding=True)
        for name, value in {**getattr(connection, "proxy_headers", {}), **all_headers}.items():
            connection.putheader(name, value)
        connection.endheaders()
        interrupted: OSError | None = None
        sent = 0
        plain = not isinstance(connection, http.client.HTTPSConnection)
        if body is not None:
            try:
                for chunk in body.chunks():
                    connection.send(chunk)
                    sent += len(chunk)
                    # an answer before the body is complete is a refusal: stop sending, read it (not
                    # under TLS, where a readable socket may hold only the server's session tickets)
                    if plain and select.select([connection.sock], [], [], 0)[0]:
                        break
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as failure:
                interrupted = failure
        try:
            response = connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as failure:
            if interrupted is not None and body is not None:
                raise ReportFailed(
                    f"{origin} closed the connection after {sent:,} of {len(body):,} bytes without an "
                    "answer (a server refuses an upload over its size limit this way)"
                ) from None
            raise ReportFailed(f"cannot reach {origin}: {_reach_reason(failure)}") from None
        return HttpAnswer(
            response.status,
            _json_object(raw),
            location=response.getheader("Location", ""),
            reason=response.reason,
        )
    except (OSError, http.client.HTTPException) as failure:
        raise ReportFailed(f"cannot reach {origin}: {_reach_reason(failure)}") from None
    finally:
        connection.close()


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def explain(answer: HttpAnswer, *, url: str, signed: bool) -> str:
    """One line for a refused upload: what the server said and what to change."""
    said = str(answer.body.get("error") or answer.reason or "no reason given")
    status = answer.status
    if 300 <= status < 400:
        where = answer.location or "another address"
        return f"the server redirects {url} to {where}; pass the final address as --url ({ENV_URL})"
    if status == 401 and signed:
        return (
            f"the server refused the signature (401): {said}; check {ENV_SECRET} against "
            "`manage.py webhooksecret --project NAME`"
        )
    if status == 401:
        return f"the server refused the token (401): {said}"
    if status == 403:
        return f"the server refused the upload (403): {said}"
    if status == 413:
        return f"413: {said}"
    if status == 404 and not answer.body:
        return f"no dispatchlab API at {url} (404); is {ENV_URL} the dashboard's address?"
    if status >= 500:
        return f"the server failed ({status}): {said}; try again later"
    return f"the server refused the upload ({status}): {said}"


# ---------------------------------------------------------------- the command


@dataclass(frozen=True)
class Options:
    url: str
    paths: list[str]
    token: str = ""
    secret: str = ""
    wait: int = 60
    json: bool = False
    title: str = ""
    project: str = ""
    ci: CiContext = field(default_factory=CiContext)


def options_from(args: argparse.Namespace, env: Mapping[str, str]) -> Options:
    url = args.url or env.get(ENV_URL, "")
    if not url.strip():
        raise UsageError(f"no server: pass --url or set {ENV_URL}")
    token = args.token or env.get(ENV_TOKEN, "")
    secret = args.webhook_secret or env.get(ENV_SECRET, "")
    if not token.strip() and not secret.strip():
        raise UsageError(f"no credentials: pass --token ({ENV_TOKEN}) or --webhook-secret ({ENV_SECRET})")
    if args.wait < 0:
        raise UsageError("--wait must be 0 or more seconds")
    ci = ci_from_env(env)
    overrides = {
        key: value
        for key, value in (
            ("job", args.job),
            ("commit", args.commit),
            ("branch", args.branch),
            ("url", args.ci_url),
        )
        if value is not None
    }
    return Options(
        url=_base_url(url),
        paths=list(args.paths),
        token=token.strip(),
        secret=secret.strip(),
        wait=args.wait,
        json=args.json,
        title=args.title.strip(),
        project=(args.project or env.get(ENV_PROJECT, "")).strip(),
        ci=replace(ci, **overrides),
    )


class Reporter:
    """Deliver, then follow the report until it is finished or the wait is over."""

    def __init__(self, options: Options, logs: list[LogFile]) -> None:
        self.options = options
        fields = {**options.ci.fields()}
        title = options.title or options.ci.title()
        if title:
            fields["title"] = title
        if options.project and not options.secret:
            fields["project"] = options.project
        self.body = Multipart(fields=fields, files=logs)
        self.delivery = ""

    # ---- the two ways in
    def upload(self) -> dict[str, Any]:
        url = self.options.url + REPORTS_PATH
        answer = http_call(
            "POST", url, body=self.body, headers={"Authorization": f"Bearer {self.options.token}"}
        )
        if answer.status != 201:
            raise ReportFailed(explain(answer, url=url, signed=False))
        return answer.body

    def deliver(self, wait: int) -> dict[str, Any]:
        """Sign and post to the webhook; the same delivery id on a repeat returns the same report."""
        query = [f"wait={wait}"] if wait else []
        if self.options.project:
            from urllib.parse import quote

            query.append(f"project={quote(self.options.project)}")
        url = self.options.url + HOOK_PATH + ("?" + "&".join(query) if query else "")
        timestamp = int(time.time())
        signed, content = self.body.sign(self.options.secret, timestamp)
        if not self.delivery:
            ci_id = self.options.ci.delivery or f"cli:{uuid.uuid4()}"
            # the logs' digest keeps two reports from one CI job apart, and a retry of either the same
            self.delivery = f"{ci_id}:{content[:16]}"
        headers = {
            "X-Dispatchlab-Signature": signed,
            "X-Dispatchlab-Timestamp": str(timestamp),
            "X-Dispatchlab-Delivery": self.delivery,
        }
        answer = http_call("POST", url, body=self.body, headers=headers, timeout=UPLOAD_TIMEOUT + wait)
        if answer.status != 201:
            raise ReportFailed(explain(answer, url=url.split("?")[0], signed=True))
        return answer.body

    # ---- following it
    def poll(self, report_id: int, deadline: float) -> dict[str, Any]:
        url = f"{self.options.url}{REPORTS_PATH}/{report_id}"
        pause = POLL_FIRST
        while True:
            answer = http_call(
                "GET", url, headers={"Authorization": f"Bearer {self.options.token}"}, timeout=30
            )
            if answer.status != 200:
                raise ReportFailed(explain(answer, url=url, signed=False))
            latest = answer.body
            if latest.get("status") in FINISHED or time.monotonic() >= deadline:
                return latest
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(POLL_MAX, pause * 2)

    def run(self) -> tuple[dict[str, Any], str]:
        """(the latest answer, a warning when following the report failed after it was stored)."""
        wait = self.options.wait
        deadline = time.monotonic() + wait
        answer = self.deliver(min(wait, HOOK_MAX_WAIT)) if self.options.secret else self.upload()
        duplicate = bool(answer.get("duplicate"))
        warning = ""
        try:
            followed = answer.get("status") in FINISHED and "document" in answer
            if wait and self.options.token and not followed:
                # the upload's answer has no document, even for a log parsed before: read it at least once
                answer = self.poll(int(answer["id"]), deadline)
            while wait and answer.get("status") not in FINISHED and time.monotonic() < deadline:
                # no token, and past the webhook's 60 s: repeat the delivery, which answers from its id
                answer = self.deliver(min(int(deadline - time.monotonic()) + 1, HOOK_MAX_WAIT))
        except ReportFailed as failure:
            warning = f"the report is stored, but following it failed: {failure}"
        return {**answer, "duplicate": duplicate}, warning


def render(answer: dict[str, Any], wait: int) -> str:
    """The diagnosis for people; the report's address alone on the last line."""
    from dispatchlab.core.summary import render_summary

    status = answer.get("status")
    lines: list[str] = []
    again = " (this log or CI delivery was reported before)" if answer.get("duplicate") else ""
    if status == "done" and isinstance(answer.get("document"), dict):
        lines.append(render_summary(answer["document"]).rstrip("\n"))
        lines.append("")
        lines.append(f"report {answer.get('id')}: done{again}")
    elif status == "failed":
        lines.append(
            f"report {answer.get('id')}: the server could not read the log: {answer.get('error')}{again}"
        )
    elif wait and status not in FINISHED:
        lines.append(
            f"report {answer.get('id')}: still {status} after {wait} s{again}; the page will show it"
        )
    else:
        lines.append(f"report {answer.get('id')}: {status}{again}")
    lines.append(str(answer.get("url") or ""))
    return "\n".join(lines) + "\n"


def run_report(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    environ = os.environ if env is None else env
    try:
        options = options_from(args, environ)
        logs = collect_logs(options.paths)
    except UsageError as problem:
        print(f"dispatchlab report: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except ReportFailed as failure:
        print(f"dispatchlab report: {failure}", file=sys.stderr)
        return EXIT_FAILED
    try:
        answer, warning = Reporter(options, logs).run()
    except ReportFailed as failure:
        print(f"dispatchlab report: {failure}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        for log in logs:
            if log.spool is not None:
                log.spool.close()
    if warning:
        print(f"dispatchlab report: {warning}", file=sys.stderr)
    if options.json:
        sys.stdout.write(json.dumps(answer, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(render(answer, options.wait))
    return EXIT_OK

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
import hashlib
import hmac
import json
import mimetypes
import os
import secrets
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

ENV_URL = "DISPATCHLAB_URL"
ENV_TOKEN = "DISPATCHLAB_TOKEN"
ENV_SECRET = "DISPATCHLAB_WEBHOOK_SECRET"

REPORTS_PATH = "/api/v1/reports"
HOOK_PATH = "/api/v1/hooks/ci"
# The webhook waits at most this long per request (the server's own cap).
HOOK_MAX_WAIT = 60
CHUNK_BYTES = 1024 * 1024
UPLOAD_TIMEOUT = 120.0  # per socket operation, not for the whole upload
POLL_FIRST, POLL_MAX = 0.25, 2.0
FINISHED = ("done", "failed")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Something the person must change on the command line (exit 2)."""


class ReportFailed(Exception):
    """The report could not be delivered. str(error) is one line meant for people (exit 1)."""


# ---------------------------------------------------------------- the CI's environment


@dataclass(frozen=True)
class CiContext:
    """Where the logs come from. `delivery` identifies one execution of one CI job ("" outside CI)."""

    provider: str | None = None  # "github" | "gitlab" | None
    job: str = ""
    url: str = ""
    commit: str = ""
    branch: str = ""
    pipeline: str = ""
    delivery: str = ""

    def fields(self) -> dict[str, str]:
        """The webhook's form fields (empty ones left out)."""
        values = {
            "job": self.job,
            "url": self.url,
            "commit": self.commit,
            "branch": self.branch,
            "pipeline": self.pipeline,
        }
        return {key: value for key, value in values.items() if value}

    def title(self) -> str:
        """`job on branch @ commit`, or "" without a job (the server then names the report by its file)."""
        if not self.job:
            return ""
        title = self.job
        if self.branch:
            title += f" on {self.branch}"
        if self.commit:
            title += f" @ {self.commit[:12]}"
        return title


def ci_from_env(env: Mapping[str, str]) -> CiContext:
    """GitHub Actions or GitLab CI, from the variables each sets in every job; an empty context elsewhere."""
    get = env.get
    if get("GITHUB_ACTIONS") == "true":
        server = (get("GITHUB_SERVER_URL") or "https://github.com").rstrip("/")
        repository, run_id = get("GITHUB_REPOSITORY", ""), get("GITHUB_RUN_ID", "")
        attempt, job = get("GITHUB_RUN_ATTEMPT", ""), get("GITHUB_JOB", "")
        url = ""
        if repository and run_id:
            url = f"{server}/{repository}/actions/runs/{run_id}"
            if attempt and attempt != "1":
                url += f"/attempts/{attempt}"
        workflow = get("GITHUB_WORKFLOW", "")
        return CiContext(
            provider="github",
            job=f"{workflow} / {job}" if workflow and job else job or workflow,
            url=url,
            commit=get("GITHUB_SHA", ""),
            # a pull request's own branch, not the "123/merge" ref GitHub checks out
            branch=get("GITHUB_HEAD_REF") or get("GITHUB_REF_NAME", ""),
            pipeline=run_id,
            delivery=f"github:{repository}:{run_id}:{attempt or 1}:{job}" if run_id else "",
        )
    if get("GITLAB_CI") == "true":
        job_id = get("CI_JOB_ID", "")
        url = get("CI_JOB_URL", "")
        if not url and get("CI_PROJECT_URL") and job_id:
            url = f"{get('CI_PROJECT_URL', '').rstrip('/')}/-/jobs/{job_id}"
        host = get("CI_SERVER_HOST", "")
        return CiContext(
            provider="gitlab",
            job=get("CI_JOB_NAME", ""),
            url=url,
            commit=get("CI_COMMIT_SHA", ""),
            branch=get("CI_COMMIT_REF_NAME") or get("CI_MERGE_REQUEST_SOURCE_BRANCH_NAME", ""),
            pipeline=get("CI_PIPELINE_ID", ""),
            delivery=f"gitlab:{host + ':' if host else ''}{job_id}" if job_id else "",
        )
    return CiContext()


# ---------------------------------------------------------------- the multipart body


@dataclass(frozen=True)
class LogFile:
    """One log to send: a path, or an open spool (stdin). `size` is fixed when the file is first seen,
    so a log the server is still appending to is sent as it was then, and signed the same way."""

    name: str
    size: int
    path: Path | None = None
    spool: IO[bytes] | None = None

    def content_type(self) -> str:
        kind, encoding = mimetypes.guess_type(self.name)
        if encoding == "gzip":
            return "application/gzip"
        if kind:
            return kind
        return "application/octet-stream"

    def chunks(self) -> Iterator[bytes]:
        if self.spool is not None:
            self.spool.seek(0)
            yield from _read_exactly(self.spool, self.size, self.name)
            return
        assert self.path is not None
        with self.path.open("rb") as stream:
            yield from _read_exactly(stream, self.size, self.name)


def _read_exactly(stream: IO[bytes], size: int, name: str) -> Iterator[bytes]:
    left = size
    while left:
        chunk = stream.read(min(CHUNK_BYTES, left))
        if not chunk:
            raise ReportFailed(f"{name}: the file shrank from {size:,} bytes while it was being sent")
        left -= len(chunk)
        yield chunk


def _quoted(value: str) -> str:
    # A quoted-string may not hold a quote, a backslash or a line break; browsers replace them the same way.
    return value.replace("\\", "_").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


def _disposition(name: str, filename: str | None = None) -> str:
    header = f'Content-Disposition: form-data; name="{name}"'
    if filename is None:
        return header
    if filename.isascii():
        return header + f'; filename="{_quoted(filename)}"'
    # RFC 5987: an ASCII fallback first, then the UTF-8 name (which Django's parser prefers)
    from urllib.parse import quote

    fallback = _quoted(filename.encode("ascii", "replace").decode().replace("?", "_"))
    return header + f"; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


@dataclass
class Multipart:
    """multipart/form-data: the fields, then each log in the field `file`. Streamed, never joined."""

    fields: dict[str, str]
    files: list[LogFile]
    boundary: str = field(default_factory=lambda: "dispatchlab-" + secrets.token_hex(16))

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def _field_bytes(self, name: str, value: str) -> bytes:
        return f"--{self.boundary}\r\n{_disposition(name)}\r\n\r\n".encode() + value.encode() + b"\r\n"

    def _file_head(self, log: LogFile) -> bytes:
        return (
            f"--{self.boundary}\r\n{_disposition('file', log.name)}\r\n"
            f"Content-Type: {log.content_type()}\r\n\r\n"
        ).encode()

    def _closing(self) -> bytes:
        return f"--{self.boundary}--\r\n".encode()

    def __len__(self) -> int:
        size = sum(len(self._field_bytes(name, value)) for name, value in self.fields.items())
        size += sum(len(self._file_head(log)) + log.size + 2 for log in self.files)
        return size + len(self._closing())

    def _pieces(self) -> Iterator[tuple[bool, bytes]]:
        """The body in order, each piece marked True when it is a log's own bytes."""
        for name, value in self.fields.items():
            yield False, self._field_bytes(name, value)
        for log in self.files:
            yield False, self._file_head(log)
            for chunk in log.chunks():
                yield True, chunk
            yield False, b"\r\n"
        yield False, self._closing()

    def chunks(self) -> Iterator[bytes]:
        for _, chunk in self._pieces():
            yield chunk

    def sign(self, secret: str, timestamp: int) -> tuple[str, str]:
        """(`sha256=<hex>` over `<timestamp>.<body>`, a SHA-256 of the logs' names and bytes) in one pass."""
        mac = hmac.new(secret.encode(), f"{timestamp}.".encode(), hashlib.sha256)
        content = hashlib.sha256()
        for log in self.files:
            content.update(log.name.encode() + b"\0")
        for is_log, chunk in self._pieces():
            mac.update(chunk)
            if is_log:
                content.update(chunk)
        return "sha256=" + mac.hexdigest(), content.hexdigest()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The webhook's `X-Dispatchlab-Signature` for a body held in memory (the server's own formula)."""
    return "sha256=" + hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def _stdin_name(head: bytes) -> str:
    if head.startswith(b"\x1f\x8b"):
        return "stdin.log.gz"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "stdin.zip"
    return "stdin.log"


def collect_logs(paths: Sequence[str], stdin: IO[bytes] | None = None) -> list[LogFile]:
    """Check every path before anything is sent; stdin (`-`) is spooled to a temporary file."""
    logs: list[LogFile] = []
    if sum(1 for path in paths if path == "-") > 1:
        raise UsageError("'-' (stdin) can be given only once")
    for raw in paths:
        if raw == "-":
            source = stdin if stdin is not None else sys.stdin.buffer
            spool = tempfile.TemporaryFile(prefix="dispatchlab-stdin-")  # noqa: SIM115 - lives until exit
            while chunk := source.read(CHUNK_BYTES):
                spool.write(chunk)
            size = spool.tell()
            spool.seek(0)
            logs.append(LogFile(name=_stdin_name(spool.read(4)), size=size, spool=spool))
            continue
        path = Path(raw)
        if not path.exists():
            raise UsageError(f"{raw}: no such file")
        if not path.is_file():
            raise UsageError(f"{raw}: not a file")
        try:
            with path.open("rb"):
                pass
            size = path.stat().st_size
        except OSError as error:
            raise ReportFailed(f"{raw}: cannot read it ({error.strerror or error})") from None
        logs.append(LogFile(name=path.name or "log", size=size, path=path))
    return logs


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


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="log files (.log/.txt/.gz/.zip), or - for stdin; one report"
    )
    parser.add_argument("--url", help=f"the dashboard's address (default: ${ENV_URL})")
    parser.add_argument("--token", help=f"an API token from `manage.py apitoken` (default: ${ENV_TOKEN})")
    parser.add_argument(
        "--webhook-secret",
        metavar="S",
        help=f"sign for the CI webhook with the project's secret instead (default: ${ENV_SECRET})",
    )
    parser.add_argument(
        "--wait",
        type=int,
        default=60,
        metavar="N",
        help="wait up to N seconds for the diagnosis (default 60; 0: print the link at once)",
    )
    parser.add_argument("--json", action="store_true", help="print the API's answer as one JSON object")
    parser.add_argument("--title", default="", help="the report's title (default: job, branch, commit)")
    parser.add_argument("--project", default="", help="project slug, for a caller in several projects")
    ci = parser.add_argument_group("CI fields (read from GitHub Actions or GitLab CI when not given)")
    ci.add_argument("--job", help="the CI job's name")
    ci.add_argument("--commit", help="the commit under test")
    ci.add_argument("--branch", help="the branch under test")
    ci.add_argument("--ci-url", help="the CI job's page")


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
        project=args.project.strip(),
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

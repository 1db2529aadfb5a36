"""What `dispatchlab report` sends: the CI job's context, the logs as one streamed multipart body, and the
webhook signature (HMAC-SHA256 over `<timestamp>.<raw body>`). Standard library only."""

from __future__ import annotations

import hashlib
import hmac
import mimetypes
import secrets
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

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

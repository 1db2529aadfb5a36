"""`dispatchlab report` without a server: the signature the webhook checks, the CI's environment, the
multipart body, and how each answer of a (stand-in) server reaches the person at the terminal."""

from __future__ import annotations

import email.parser
import email.policy
import gzip
import hashlib
import hmac
import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dispatchlab.core.cli import main
from dispatchlab.core.reporter import (
    CiContext,
    LogFile,
    Multipart,
    ReportFailed,
    ci_from_env,
    collect_logs,
    signature,
)

SECRET = "s3cret-of-the-project"

GITHUB = {
    "GITHUB_ACTIONS": "true",
    "GITHUB_WORKFLOW": "nightly",
    "GITHUB_JOB": "serve-h200",
    "GITHUB_RUN_ID": "9958633309",
    "GITHUB_RUN_ATTEMPT": "1",
    "GITHUB_SHA": "0123456789abcdef0123456789abcdef01234567",
    "GITHUB_REF_NAME": "main",
    "GITHUB_SERVER_URL": "https://github.com",
    "GITHUB_REPOSITORY": "acme/serving",
}
GITLAB = {
    "GITLAB_CI": "true",
    "CI_JOB_NAME": "serve:h200",
    "CI_JOB_ID": "8812",
    "CI_JOB_URL": "https://gitlab.example.com/acme/serving/-/jobs/8812",
    "CI_COMMIT_SHA": "fedcba9876543210fedcba9876543210fedcba98",
    "CI_COMMIT_REF_NAME": "release-1.2",
    "CI_PIPELINE_ID": "4501",
    "CI_SERVER_HOST": "gitlab.example.com",
}


@pytest.fixture(autouse=True)
def no_ci_around_us(monkeypatch):
    """Tests that run inside a CI must not pick up that CI's job or a developer's server."""
    import os

    for name in list(os.environ):
        if name.startswith(("GITHUB_", "GITLAB_", "CI_", "DISPATCHLAB_")) or name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)


def body_of(multipart: Multipart) -> bytes:
    return b"".join(multipart.chunks())


def parts_of(multipart: Multipart) -> list[Any]:
    raw = body_of(multipart)
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {multipart.content_type}\r\n\r\n".encode() + raw
    )
    return list(message.iter_parts())


# ---------------------------------------------------------------- the signature


def server_accepts(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What the webhook does (dispatchlab/api/views.py ci_hook and _read_signed): strip `sha256=`,
    HMAC-SHA256 under the secret over `<timestamp>.` then the raw body, compare in constant time."""
    sent = headers["X-Dispatchlab-Signature"].removeprefix("sha256=").strip().lower()
    prefix = f"{int(headers['X-Dispatchlab-Timestamp'].strip())}.".encode()
    mac = hmac.new(secret.encode(), prefix, hashlib.sha256)
    for start in range(0, len(body), 1024 * 1024):
        mac.update(body[start : start + 1024 * 1024])
    return hmac.compare_digest(mac.hexdigest(), sent)


def test_the_streamed_signature_is_the_webhooks_hmac_over_timestamp_dot_body(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"line\n" * 300_000)  # more than one chunk
    multipart = Multipart(fields={"job": "e2e"}, files=collect_logs([str(log)]))
    signed, _ = multipart.sign(SECRET, 1_760_000_000)
    body = body_of(multipart)
    assert signed == signature(SECRET, 1_760_000_000, body)
    headers = {"X-Dispatchlab-Signature": signed, "X-Dispatchlab-Timestamp": "1760000000"}
    assert server_accepts(SECRET, headers, body)
    assert not server_accepts("another-secret", headers, body)
    assert not server_accepts(SECRET, {**headers, "X-Dispatchlab-Timestamp": "1760000001"}, body)


def test_the_servers_own_check_accepts_the_signature(tmp_path):
    pytest.importorskip("django", reason="the web extra is not installed")
    from dispatchlab.api.views import _read_signed

    log = tmp_path / "server.log"
    log.write_bytes(b"[TP0] torch.OutOfMemoryError: CUDA out of memory\n" * 50_000)
    multipart = Multipart(fields={"job": "e2e", "commit": "abc"}, files=collect_logs([str(log)]))
    signed, _ = multipart.sign(SECRET, 1_760_000_000)
    checked = _read_signed(
        io.BytesIO(body_of(multipart)),  # type: ignore[arg-type]  # a request, as far as reading goes
        io.BytesIO(),
        {7: SECRET, 8: "another project's secret"},
        b"1760000000.",
        limit=10**9,
    )
    assert checked.project_signed(signed.removeprefix("sha256=")) == 7


def test_the_servers_own_multipart_parser_reads_the_fields_and_every_file(tmp_path):
    pytest.importorskip("django", reason="the web extra is not installed")
    from django.core.files.uploadhandler import MemoryFileUploadHandler
    from django.http.multipartparser import MultiPartParser

    (tmp_path / "rank0.log").write_bytes(b"plain\n")
    (tmp_path / 'ränk "1".log.gz').write_bytes(gzip.compress(b"packed\n"))
    multipart = Multipart(
        fields={"job": "serve / nightly", "title": "ünïcode title"},
        files=collect_logs([str(tmp_path / "rank0.log"), str(tmp_path / 'ränk "1".log.gz')]),
    )
    raw = body_of(multipart)
    meta = {"CONTENT_TYPE": multipart.content_type, "CONTENT_LENGTH": str(len(raw))}
    post, files = MultiPartParser(meta, io.BytesIO(raw), [MemoryFileUploadHandler()], "utf-8").parse()
    assert post["job"] == "serve / nightly" and post["title"] == "ünïcode title"
    uploads = files.getlist("file")
    assert [upload.name for upload in uploads] == ["rank0.log", 'ränk "1".log.gz']
    assert gzip.decompress(uploads[1].read()) == b"packed\n"


# ---------------------------------------------------------------- the CI's environment


def test_github_actions_gives_the_job_the_run_url_the_commit_and_the_branch():
    ci = ci_from_env(GITHUB)
    assert ci == CiContext(
        provider="github",
        job="nightly / serve-h200",
        url="https://github.com/acme/serving/actions/runs/9958633309",
        commit=GITHUB["GITHUB_SHA"],
        branch="main",
        pipeline="9958633309",
        delivery="github:acme/serving:9958633309:1:serve-h200",
    )
    assert ci.fields() == {
        "job": "nightly / serve-h200",
        "url": "https://github.com/acme/serving/actions/runs/9958633309",
        "commit": GITHUB["GITHUB_SHA"],
        "branch": "main",
        "pipeline": "9958633309",
    }
    assert ci.title() == "nightly / serve-h200 on main @ 0123456789ab"


def test_a_rerun_on_github_points_at_its_attempt_and_is_another_delivery():
    ci = ci_from_env({**GITHUB, "GITHUB_RUN_ATTEMPT": "2", "GITHUB_HEAD_REF": "fix-oom"})
    assert ci.url.endswith("/actions/runs/9958633309/attempts/2")
    assert ci.delivery == "github:acme/serving:9958633309:2:serve-h200"
    assert ci.branch == "fix-oom"  # a pull request's branch, not its "123/merge" ref


def test_gitlab_ci_gives_the_job_its_url_the_commit_the_branch_and_the_pipeline():
    ci = ci_from_env(GITLAB)
    assert (ci.provider, ci.job, ci.url, ci.commit, ci.branch, ci.pipeline) == (
        "gitlab",
        "serve:h200",
        GITLAB["CI_JOB_URL"],
        GITLAB["CI_COMMIT_SHA"],
        "release-1.2",
        "4501",
    )
    assert ci.delivery == "gitlab:gitlab.example.com:8812"
    without_url = ci_from_env(
        {**GITLAB, "CI_JOB_URL": "", "CI_PROJECT_URL": "https://gitlab.example.com/acme/serving"}
    )
    assert without_url.url == "https://gitlab.example.com/acme/serving/-/jobs/8812"


def test_outside_ci_nothing_is_made_up():
    assert ci_from_env({"CI": "true", "HOME": "/root"}) == CiContext()
    assert CiContext().fields() == {} and CiContext().title() == ""


# ---------------------------------------------------------------- the multipart body


def test_the_body_holds_the_fields_then_each_log_untouched_and_its_length_is_exact(tmp_path):
    plain = tmp_path / "server.log"
    plain.write_bytes(b"a\r\nb\n--not-a-boundary\n")
    packed = tmp_path / "rank1.log.gz"
    packed.write_bytes(gzip.compress(b"x\n" * 1000))
    archive = tmp_path / "bundle.zip"
    archive.write_bytes(b"PK\x05\x06" + bytes(18))
    multipart = Multipart(
        fields={"job": "e2e", "commit": "abc"}, files=collect_logs([str(plain), str(packed), str(archive)])
    )
    assert len(multipart) == len(body_of(multipart))
    parts = parts_of(multipart)
    assert [(p.get_param("name", header="content-disposition"), p.get_filename()) for p in parts] == [
        ("job", None),
        ("commit", None),
        ("file", "server.log"),
        ("file", "rank1.log.gz"),
        ("file", "bundle.zip"),
    ]
    assert [p.get_content_type() for p in parts[2:]] == [
        "application/octet-stream",
        "application/gzip",
        "application/zip",
    ]
    assert parts[2].get_payload(decode=True) == plain.read_bytes()
    assert parts[3].get_payload(decode=True) == packed.read_bytes()
    assert body_of(multipart).endswith(f"--{multipart.boundary}--\r\n".encode())


def test_stdin_is_spooled_and_named_by_what_it_holds():
    (log,) = collect_logs(["-"], stdin=io.BytesIO(gzip.compress(b"hello\n")))
    assert (log.name, log.content_type()) == ("stdin.log.gz", "application/gzip")
    multipart = Multipart(fields={}, files=[log])
    assert parts_of(multipart)[0].get_payload(decode=True) == gzip.compress(b"hello\n")
    assert body_of(multipart) == body_of(multipart)  # readable again, for the signature's pass
    (plain,) = collect_logs(["-"], stdin=io.BytesIO(b"text\n"))
    assert plain.name == "stdin.log" and plain.size == 5


def test_a_log_still_being_written_is_sent_as_it_was_when_first_seen(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"first\n")
    multipart = Multipart(fields={}, files=collect_logs([str(log)]))
    with log.open("ab") as growing:
        growing.write(b"second\n")
    assert parts_of(multipart)[0].get_payload(decode=True) == b"first\n"
    assert len(multipart) == len(body_of(multipart))
    log.write_bytes(b"")
    with pytest.raises(ReportFailed, match="shrank"):
        body_of(multipart)


def test_two_different_logs_sign_to_different_content_digests(tmp_path):
    (tmp_path / "a.log").write_bytes(b"one\n")
    (tmp_path / "b.log").write_bytes(b"two\n")
    one = Multipart(fields={}, files=collect_logs([str(tmp_path / "a.log")]), boundary="b")
    two = Multipart(fields={}, files=collect_logs([str(tmp_path / "b.log")]), boundary="b")
    again = Multipart(fields={}, files=collect_logs([str(tmp_path / "a.log")]), boundary="other")
    assert one.sign(SECRET, 1)[1] != two.sign(SECRET, 1)[1]
    assert one.sign(SECRET, 1)[1] == again.sign(SECRET, 2)[1]  # by the logs, not the envelope


def test_a_log_file_has_a_content_type_by_its_name():
    assert LogFile(name="x.log.gz", size=0).content_type() == "application/gzip"
    assert LogFile(name="x.zip", size=0).content_type() == "application/zip"


# ---------------------------------------------------------------- against a stand-in server


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class StandIn:
    """A scripted HTTP server: `answer(seen)` returns (status, JSON-able or raw bytes, headers)."""

    answer: Callable[[Seen], tuple[int, Any, dict[str, str]]]
    read_body: bool = True
    seen: list[Seen] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def stand_in() -> Iterator[Callable[..., StandIn]]:
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Callable[[Seen], tuple[int, Any, dict[str, str]]], read_body: bool = True) -> StandIn:
        state = StandIn(answer=answer, read_body=read_body)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if state.read_body else b""
                seen = Seen(self.command, self.path, dict(self.headers.items()), body)
                state.seen.append(seen)
                status, payload, headers = state.answer(seen)
                raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(raw)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(raw)
                self.close_connection = True

            do_GET = do_POST = handle_one

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        state.url = f"http://127.0.0.1:{server.server_address[1]}"
        return state

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


DOCUMENT = {
    "server": "sglang",
    "gpu": {"name": "NVIDIA H200", "arch": "sm_90", "count": 8},
    "model": "Qwen/Qwen3-30B-A3B",
    "outcome": "crashed",
    "crash": {
        "line": 11,
        "phase": "cuda_graph_capture",
        "exception": "torch.OutOfMemoryError",
        "message": "boom",
    },
    "matches": [{"id": "cuda-out-of-memory", "title": "CUDA out of memory", "confidence": 0.75}],
    "failure_class": "oom",
    "fingerprint": "1cfa9fd4099e85bd",
}


def detail(status: str, **extra: Any) -> dict[str, Any]:
    return {"id": 5, "url": "http://dash/reports/5/", "status": status, "document": None, **extra}


def run(tmp_path: Path, *args: str) -> int:
    log = tmp_path / "server.log"
    if not log.exists():
        log.write_bytes(b"[TP0] torch.OutOfMemoryError: CUDA out of memory\n")
    return main(["report", str(log), *args])


def test_a_token_upload_polls_until_done_and_ends_with_the_link(stand_in, tmp_path, capsys):
    answers = iter([detail("queued"), detail("parsing"), detail("done", document=DOCUMENT)])

    def answer(seen: Seen) -> tuple[int, Any, dict[str, str]]:
        if seen.method == "POST":
            return 201, {"id": 5, "url": "http://dash/reports/5/", "status": "queued", "duplicate": False}, {}
        return 200, next(answers), {}

    server = stand_in(answer)
    assert run(tmp_path, "--url", server.url + "/", "--token", "dl_t", "--title", "nightly") == 0
    out = capsys.readouterr().out
    assert "failure class  oom" in out and "CRASH    line 11 in cuda_graph_capture" in out
    assert out.splitlines()[-2:] == ["report 5: done", "http://dash/reports/5/"]
    upload, *polls = server.seen
    assert (upload.path, upload.headers["Authorization"]) == ("/api/v1/reports", "Bearer dl_t")
    assert b'name="title"\r\n\r\nnightly\r\n' in upload.body
    assert [poll.path for poll in polls] == ["/api/v1/reports/5"] * 3


def test_a_signed_delivery_waits_on_the_webhook_and_repeats_it_past_sixty_seconds(
    stand_in, tmp_path, capsys, monkeypatch
):
    for name, value in GITLAB.items():
        monkeypatch.setenv(name, value)
    answers = iter([detail("parsing", duplicate=False), detail("done", document=DOCUMENT, duplicate=True)])
    server = stand_in(lambda seen: (201, next(answers), {}))
    assert run(tmp_path, "--url", server.url, "--webhook-secret", SECRET, "--wait", "90") == 0
    assert capsys.readouterr().out.endswith("report 5: done\nhttp://dash/reports/5/\n")
    first, again = server.seen
    assert first.path == "/api/v1/hooks/ci?wait=60" and again.path.startswith("/api/v1/hooks/ci?wait=")
    for seen in (first, again):
        assert server_accepts(SECRET, seen.headers, seen.body)
        assert abs(int(seen.headers["X-Dispatchlab-Timestamp"]) - time.time()) < 60
    assert first.headers["X-Dispatchlab-Delivery"] == again.headers["X-Dispatchlab-Delivery"]
    assert first.headers["X-Dispatchlab-Delivery"].startswith("gitlab:gitlab.example.com:8812:")
    assert b'name="job"\r\n\r\nserve:h200\r\n' in first.body
    assert b'name="title"\r\n\r\nserve:h200 on release-1.2 @ fedcba987654\r\n' in first.body


def test_flags_override_what_the_ci_says(stand_in, tmp_path, capsys, monkeypatch):
    for name, value in GITHUB.items():
        monkeypatch.setenv(name, value)
    server = stand_in(lambda seen: (201, detail("queued"), {}))
    code = run(
        tmp_path,
        *("--url", server.url, "--webhook-secret", SECRET, "--wait", "0"),
        *("--job", "bench", "--commit", "c0ffee", "--branch", "exp", "--ci-url", "https://ci/1"),
    )
    assert code == 0
    (seen,) = server.seen
    assert seen.path == "/api/v1/hooks/ci"
    for name, value in (("job", "bench"), ("commit", "c0ffee"), ("branch", "exp"), ("url", "https://ci/1")):
        assert f'name="{name}"\r\n\r\n{value}\r\n'.encode() in seen.body
    assert seen.headers["X-Dispatchlab-Delivery"].startswith("github:acme/serving:9958633309:1:serve-h200:")
    assert capsys.readouterr().out == "report 5: queued\nhttp://dash/reports/5/\n"


def test_a_delivery_names_the_project_from_dispatchlab_project(stand_in, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DISPATCHLAB_PROJECT", "serving")
    server = stand_in(lambda seen: (201, detail("queued"), {}))
    assert run(tmp_path, "--url", server.url, "--webhook-secret", SECRET, "--wait", "0") == 0
    (seen,) = server.seen
    assert seen.path == "/api/v1/hooks/ci?project=serving"
    assert server_accepts(SECRET, seen.headers, seen.body)


def test_json_prints_the_apis_answer(stand_in, tmp_path, capsys):
    server = stand_in(lambda seen: (201, detail("done", document=DOCUMENT, duplicate=False), {}))
    assert run(tmp_path, "--url", server.url, "--webhook-secret", SECRET, "--json") == 0
    assert json.loads(capsys.readouterr().out)["document"]["failure_class"] == "oom"


@pytest.mark.parametrize(
    ("status", "payload", "headers", "message"),
    [
        (
            401,
            {"error": "invalid or revoked token"},
            {},
            "the server refused the token (401): invalid or revoked token",
        ),
        (
            403,
            {"error": "this token is read-only"},
            {},
            "the server refused the upload (403): this token is read-only",
        ),
        (
            413,
            {"error": "the upload is 3,000,000,000 bytes; the limit is 2,147,483,648 bytes"},
            {},
            "413: the upload is 3,000,000,000 bytes; the limit is 2,147,483,648 bytes",
        ),
        (502, b"<html>Bad Gateway</html>", {}, "the server failed (502): Bad Gateway; try again later"),
        (404, b"<html>not found</html>", {}, "no dispatchlab API at {url}/api/v1/reports (404)"),
        (
            301,
            b"",
            {"Location": "https://dash/api/v1/reports"},
            "the server redirects {url}/api/v1/reports to https://dash/api/v1/reports",
        ),
    ],
)
def test_a_refused_upload_exits_1_with_one_line_saying_why(
    stand_in, tmp_path, capsys, status, payload, headers, message
):
    server = stand_in(lambda seen: (status, payload, headers))
    assert run(tmp_path, "--url", server.url, "--token", "dl_t") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("dispatchlab report: " + message.format(url=server.url))
    assert captured.err.count("\n") == 1


def test_a_refusal_before_the_body_is_read_still_reaches_the_person(stand_in, tmp_path, capsys):
    big = tmp_path / "server.log"
    big.write_bytes(b"x" * (64 * 1024 * 1024))
    refusal = {"error": "the upload is 67,109,185 bytes; the limit is 1,024 bytes"}
    server = stand_in(lambda seen: (413, refusal, {}), read_body=False)
    assert run(tmp_path, "--url", server.url, "--token", "dl_t") == 1
    assert capsys.readouterr().err == f"dispatchlab report: 413: {refusal['error']}\n"


def test_following_a_stored_report_that_fails_still_exits_0(stand_in, tmp_path, capsys):
    def answer(seen: Seen) -> tuple[int, Any, dict[str, str]]:
        if seen.method == "POST":
            return 201, detail("queued"), {}
        return 500, b"oops", {}

    server = stand_in(answer)
    assert run(tmp_path, "--url", server.url, "--token", "dl_t") == 0
    captured = capsys.readouterr()
    assert captured.out.endswith("http://dash/reports/5/\n")
    assert "the report is stored, but following it failed" in captured.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--token", "t"], "no server: pass --url or set DISPATCHLAB_URL"),
        (["--url", "http://x"], "no credentials: pass --token (DISPATCHLAB_TOKEN) or --webhook-secret"),
        (["--url", "dash.example.com", "--token", "t"], "the server URL must start with http:// or https://"),
        (["--url", "http://x", "--token", "t", "--wait", "-1"], "--wait must be 0 or more seconds"),
    ],
)
def test_usage_errors_exit_2(tmp_path, capsys, args, message):
    assert run(tmp_path, *args) == 2
    assert capsys.readouterr().err.startswith(f"dispatchlab report: {message}")


def test_a_missing_file_or_a_directory_is_a_usage_error(tmp_path, capsys):
    for path, reason in ((tmp_path / "nope.log", "no such file"), (tmp_path, "not a file")):
        assert main(["report", str(path), "--url", "http://x", "--token", "t"]) == 2
        assert capsys.readouterr().err == f"dispatchlab report: {path}: {reason}\n"


def test_a_log_reported_and_parsed_before_still_prints_its_diagnosis(stand_in, tmp_path, capsys):
    def answer(seen: Seen) -> tuple[int, Any, dict[str, str]]:
        if seen.method == "POST":  # the upload's answer: status, but never the document
            return 201, {"id": 5, "url": "http://dash/reports/5/", "status": "done", "duplicate": True}, {}
        return 200, detail("done", document=DOCUMENT), {}

    server = stand_in(answer)
    assert run(tmp_path, "--url", server.url, "--token", "dl_t") == 0
    out = capsys.readouterr().out
    assert "failure class  oom" in out
    assert out.endswith(
        "report 5: done (this log or CI delivery was reported before)\nhttp://dash/reports/5/\n"
    )

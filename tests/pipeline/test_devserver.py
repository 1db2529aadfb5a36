"""The README's run command on embedded defaults: SQLite, the filesystem broker, a real worker."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(check, what: str, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout}s\n{log.read_text(errors='replace')[-3000:]}")


def test_the_run_command_serves_the_dashboard_and_parses_with_a_real_worker(tmp_path):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("DISPATCHLAB_")}
    env.update({"DISPATCHLAB_DATA_DIR": str(tmp_path / "var"), "PYTHONUNBUFFERED": "1"})
    log = tmp_path / "devserver.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "dispatchlab.devserver", "--addr", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: "Ctrl-C stops" in log.read_text(errors="replace"), "no banner", log)
        text = log.read_text(errors="replace")
        username = re.search(r"login:\s+(\S+)", text).group(1)
        password = re.search(r"password:\s+(\S+)", text).group(1)
        assert (tmp_path / "var" / "dispatchlab.sqlite3").exists()

        # log in with the printed credentials, like the first user would
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

        def up() -> bool:
            try:
                browser.open(f"{base}/accounts/login/", timeout=2).read()
                return True
            except OSError:
                return False

        _wait_for(up, "the web server did not answer", log)
        csrf = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
        form = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": csrf}
        ).encode()
        browser.open(urllib.request.Request(f"{base}/accounts/login/", data=form, headers={"Referer": base}))
        assert any(cookie.name == "sessionid" for cookie in jar), "login failed"

        # upload through the API with the session, as the pages' JavaScript would
        csrf = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
        boundary = "devserver-test"
        body = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="server.log"\r\n\r\n'.encode()
            + (DATA / "sglang_oom.log").read_bytes()
            + f"\r\n--{boundary}--\r\n".encode()
        )
        request = urllib.request.Request(
            f"{base}/api/v1/reports",
            data=body,
            headers={
                "Content-Type": f"multipart/form-data; boundary={boundary}",
                "X-CSRFToken": csrf,
                "Referer": base,
            },
        )
        created = json.loads(browser.open(request).read())
        answer: dict = {}

        def finished() -> bool:
            nonlocal answer
            answer = json.loads(browser.open(f"{base}/api/v1/reports/{created['id']}").read())
            return answer["status"] in ("done", "failed")

        _wait_for(finished, "the report was not parsed", log)
        assert answer["status"] == "done", answer["error"]
        assert answer["document"]["failure_class"] == "oom"
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            returncode = server.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            raise
    assert returncode == 0
    assert "stopping the web server and the worker" in log.read_text(errors="replace")
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "the web server still listens after Ctrl-C"
    leftovers = subprocess.run(
        ["pgrep", "-f", f"127.0.0.1:{port}"], capture_output=True, text=True, check=False
    ).stdout.split()
    assert not leftovers

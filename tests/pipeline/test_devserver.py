"""The README's run command on embedded defaults: SQLite, the filesystem broker, a real worker.

The devserver is started as a script's `cmd &` starts it, with SIGINT ignored; it must still stop on
Ctrl-C (SIGINT) and on SIGTERM and leave no process behind. Whatever happens, the fixture kills every
process that carries this test's data folder in its environment, so a failing test leaves no orphans.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dispatchlab.stack import free_port

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
STOP_SECONDS = 40


def _wait_for(check: Callable[[], bool], what: str, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout}s\n{log.read_text(errors='replace')[-3000:]}")


def _processes_with(marker: str) -> list[int]:
    """Processes whose environment holds `marker` (this test's data folder): the devserver's children."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
    return found


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `cmd &` in a non-interactive shell does


@dataclass
class Devserver:
    process: subprocess.Popen[bytes]
    base: str
    port: int
    log: Path
    data_dir: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_banner(self) -> None:
        _wait_for(lambda: "Ctrl-C stops" in self.text(), "no banner", self.log)

    def stop_with(self, signum: signal.Signals) -> int:
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running {STOP_SECONDS}s after {signum.name}\n{self.text()[-3000:]}"
            ) from None

    def leftovers(self) -> list[int]:
        deadline = time.monotonic() + 10
        while (found := _processes_with(str(self.data_dir))) and time.monotonic() < deadline:
            time.sleep(0.2)
        return found


@pytest.fixture
def devserver(tmp_path: Path) -> Iterator[Devserver]:
    port = free_port()
    data_dir = tmp_path / "var"
    env = {key: value for key, value in os.environ.items() if not key.startswith("DISPATCHLAB_")}
    env.update({"DISPATCHLAB_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"})
    log = tmp_path / "devserver.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "dispatchlab.devserver", "--addr", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_ignore_sigint,
    )
    server = Devserver(process, f"http://127.0.0.1:{port}", port, log, data_dir)
    try:
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for pid in _processes_with(str(data_dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _log_in(server: Devserver) -> urllib.request.OpenerDirector:
    text = server.text()
    username = re.search(r"login:\s+(\S+)", text).group(1)
    password = re.search(r"password:\s+(\S+)", text).group(1)
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    browser.open(f"{server.base}/accounts/login/", timeout=10).read()
    csrf = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    form = urllib.parse.urlencode(
        {"username": username, "password": password, "csrfmiddlewaretoken": csrf}
    ).encode()
    browser.open(
        urllib.request.Request(f"{server.base}/accounts/login/", data=form, headers={"Referer": server.base}),
        timeout=10,
    )
    assert any(cookie.name == "sessionid" for cookie in jar), "login failed"
    browser.csrf = next(cookie.value for cookie in jar if cookie.name == "csrftoken")  # type: ignore[attr-defined]
    return browser


def _upload(server: Devserver, browser: urllib.request.OpenerDirector, content: bytes) -> dict:
    boundary = "devserver-test"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="server.log"\r\n\r\n'.encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        f"{server.base}/api/v1/reports",
        data=body,
        headers={
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "X-CSRFToken": browser.csrf,  # type: ignore[attr-defined]
            "Referer": server.base,
        },
    )
    return json.loads(browser.open(request, timeout=30).read())


def test_the_run_command_serves_the_dashboard_and_parses_with_a_real_worker(devserver: Devserver):
    devserver.wait_banner()
    assert (devserver.data_dir / "dispatchlab.sqlite3").exists()
    browser = _log_in(devserver)

    created = _upload(devserver, browser, (DATA / "sglang_oom.log").read_bytes())
    answer: dict = {}

    def finished() -> bool:
        nonlocal answer
        answer = json.loads(
            browser.open(f"{devserver.base}/api/v1/reports/{created['id']}", timeout=10).read()
        )
        return answer["status"] in ("done", "failed")

    _wait_for(finished, "the report was not parsed", devserver.log)
    assert answer["status"] == "done", answer["error"]
    assert answer["document"]["failure_class"] == "oom"

    # DEBUG is off: a missing page is a plain 404 without the URL patterns; static files still load.
    with pytest.raises(urllib.error.HTTPError) as missing:
        browser.open(f"{devserver.base}/no-such-page/", timeout=10)
    page = missing.value.read().decode()
    assert missing.value.code == 404
    assert "URLconf" not in page and "api/v1/" not in page
    with browser.open(f"{devserver.base}/static/css/app.css", timeout=10) as stylesheet:
        assert stylesheet.status == 200 and stylesheet.read()

    assert devserver.stop_with(signal.SIGINT) == 0  # Ctrl-C, although started with SIGINT ignored
    assert "stopping the web server and the worker" in devserver.text()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", devserver.port)) != 0, (
            "the web server still listens after Ctrl-C"
        )
    assert devserver.leftovers() == [], "processes left behind after Ctrl-C"


def test_sigterm_stops_the_devserver_and_everything_it_started(devserver: Devserver):
    devserver.wait_banner()
    assert _processes_with(str(devserver.data_dir)), "the devserver started no process"
    assert devserver.stop_with(signal.SIGTERM) == 0
    assert devserver.leftovers() == [], "processes left behind after SIGTERM"

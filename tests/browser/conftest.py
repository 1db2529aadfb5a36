"""Headless Chromium (Debian's /usr/bin/chromium; Playwright's own download is not available here)
driven by Playwright against pytest-django's live server. Screenshots go to test-artifacts/."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import require_chromium
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client

from dispatchlab.reports.models import Membership, Project

# Playwright's sync API keeps an event loop running in the test thread; the ORM calls the tests make
# between browser steps are ordinary synchronous code all the same.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    executable = require_chromium()  # a skip on a developer's machine, a failure in CI
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def lab(transactional_db: None, settings: Any, tmp_path: Path) -> Project:
    settings.MEDIA_ROOT = tmp_path / "media"
    return Project.objects.create(name="GPU lab", slug="gpu-lab")


@pytest.fixture
def alice(lab: Project) -> User:
    user = User.objects.create_user("alice", password="password")
    Membership.objects.create(user=user, project=lab, role=Membership.Role.MEMBER)
    return user


@pytest.fixture
def page(browser: Any, live_server: Any, alice: User) -> Iterator[Any]:
    """A page logged in as alice. Any JavaScript dialog (alert) fails the test."""
    client = Client()
    client.force_login(alice)
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, base_url=live_server.url)
    host = live_server.url.split("//", 1)[1].split(":")[0]
    context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "domain": host, "path": "/"}]
    )
    page = context.new_page()
    page.dialogs = []  # type: ignore[attr-defined]
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))  # type: ignore[attr-defined]
    page.set_default_timeout(20_000)
    yield page
    context.close()


class _BackgroundAnalysis:
    """Stands in for the Celery worker: the analysis runs in a thread after a short delay, so the page
    shows the queued and parsing states the way it does with a real worker."""

    def __init__(self, delay: float) -> None:
        self.delay_seconds = delay
        self.threads: list[threading.Thread] = []

    def delay(self, report_id: int) -> None:
        def run() -> None:
            from dispatchlab.reports.analysis import report_analyze

            time.sleep(self.delay_seconds)
            try:
                report_analyze(report_id=report_id)
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()


@pytest.fixture
def background_analysis(monkeypatch: pytest.MonkeyPatch) -> Iterator[_BackgroundAnalysis]:
    from dispatchlab.reports import tasks

    worker = _BackgroundAnalysis(delay=1.5)
    monkeypatch.setattr(tasks, "report_analyze_task", worker)
    yield worker
    for thread in worker.threads:
        thread.join(timeout=30)

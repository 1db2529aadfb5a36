"""A newcomer's first hour in the browser (issue 21): the API quick start's printed link opens, another
project's report says whose it is, a pasted traceback becomes a report, an empty upload is refused with
its reason and the form kept, and the hosts page says how to start a GPU worker. Screenshots of each
page go to test-artifacts/."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from dispatchlab.core.cli import main as dispatchlab_cli
from dispatchlab.reports.models import Report

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CRASH_LOG = ROOT / "tests" / "pipeline" / "data" / "sglang_oom.log"
REPORT_URL = re.compile(r"/reports/(\d+)/$")


def _page_as(browser: Any, live_server: Any, user: User) -> Any:
    client = Client()
    client.force_login(user)
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, base_url=live_server.url)
    host = live_server.url.split("//", 1)[1].split(":")[0]
    context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "domain": host, "path": "/"}]
    )
    page = context.new_page()
    page.set_default_timeout(20_000)
    return page


def test_the_quick_starts_printed_link_opens_for_the_run_commands_login(
    browser,
    live_server,
    transactional_db,
    background_analysis,
    settings,
    tmp_path,
    monkeypatch,
    capsys,
    artifacts,
):
    settings.MEDIA_ROOT = tmp_path / "media"
    call_command("bootstrap", username="admin", stdout=StringIO())  # what the run command does first
    readme = (ROOT / "README.md").read_text()
    project = re.search(r"apitoken --user ci --project (\S+) --create", readme).group(1)
    out = StringIO()
    call_command("apitoken", user="ci", project=project, create=True, stdout=out, stderr=StringIO())
    monkeypatch.setenv("DISPATCHLAB_URL", live_server.url)
    monkeypatch.setenv("DISPATCHLAB_TOKEN", out.getvalue().strip().splitlines()[-1])
    capsys.readouterr()
    assert dispatchlab_cli(["report", str(CRASH_LOG), "--wait", "30"]) == 0
    link = capsys.readouterr().out.strip().splitlines()[-1]
    assert REPORT_URL.search(link), link

    page = _page_as(browser, live_server, User.objects.get(username="admin"))
    response = page.goto(link)
    assert response.status == 200
    assert "out of memory" in page.locator("#diagnosis").inner_text().lower()
    page.screenshot(path=str(artifacts / "first-hour-quick-start-report.png"), full_page=True)

    # a token for a project the login is not in: its link says so, and shows nothing of the report
    out = StringIO()
    call_command("apitoken", user="ci", project="serving", create=True, stdout=out, stderr=StringIO())
    monkeypatch.setenv("DISPATCHLAB_TOKEN", out.getvalue().strip().splitlines()[-1])
    capsys.readouterr()
    other = CRASH_LOG.read_bytes() + b"\n[2026-05-01] one more line, another report\n"
    (tmp_path / "other.log").write_bytes(other)
    assert dispatchlab_cli(["report", str(tmp_path / "other.log"), "--wait", "0"]) == 0
    link = capsys.readouterr().out.strip().splitlines()[-1]
    response = page.goto(link)
    assert response.status == 404
    assert "You are not a member of project serving" in page.locator("#not-member").inner_text()
    assert "out of memory" not in page.content().lower()
    page.screenshot(path=str(artifacts / "first-hour-not-a-member.png"), full_page=True)
    page.context.close()


def test_a_pasted_traceback_becomes_a_report(page, background_analysis, lab, artifacts):
    page.goto("/upload/")
    page.fill("#paste-input", CRASH_LOG.read_text())
    page.fill("input[name=title]", "pasted from a chat")
    page.screenshot(path=str(artifacts / "first-hour-upload-paste.png"), full_page=True)
    page.click("#upload-button")
    page.wait_for_url(REPORT_URL, timeout=30_000)
    report = Report.objects.get(pk=int(REPORT_URL.search(page.url).group(1)))
    assert report.project == lab and report.title == "pasted from a chat"
    assert [f.original_name for f in report.files.all()] == ["pasted.log"]
    page.wait_for_selector("#diagnosis", timeout=30_000)
    page.screenshot(path=str(artifacts / "first-hour-pasted-report.png"), full_page=True)


def test_an_empty_upload_is_refused_with_its_reason_and_the_form_is_ready_again(page, lab, artifacts):
    page.goto("/upload/")
    page.fill("#paste-input", "kept for the next try")
    page.set_input_files(
        "#file-input", files=[{"name": "empty.log", "mimeType": "text/plain", "buffer": b""}]
    )
    with page.expect_response(lambda response: response.request.method == "POST") as answer:
        page.click("#upload-button")
    assert answer.value.status == 400
    error = page.locator("#upload-error")
    error.wait_for(state="visible")
    assert "empty.log: empty file, nothing to parse" in error.inner_text()
    assert page.input_value("#paste-input") == "kept for the next try"
    assert page.locator("#upload-button").is_enabled()
    assert not Report.objects.exists()
    page.screenshot(path=str(artifacts / "first-hour-empty-upload.png"), full_page=True)

    # without JavaScript's help (the form posted as is), the page answers the same, text kept
    page.set_input_files("#file-input", files=[])
    page.fill("#paste-input", "   ")
    page.evaluate("document.getElementById('upload-form').submit()")
    page.wait_for_load_state()
    assert "The pasted text is empty" in page.locator("#upload-errors").inner_text()
    assert not Report.objects.filter(project=lab).exists()


def test_the_hosts_page_says_how_to_start_a_gpu_worker(page, artifacts):
    page.goto("/hosts/")
    commands = page.locator("#start-worker pre.command").all_inner_texts()
    assert commands[0].endswith("python -m worker serve")  # beside the dashboard, on its broker folder
    assert any("DISPATCHLAB_BROKER_URL=redis://" in command for command in commands)
    page.screenshot(path=str(artifacts / "first-hour-hosts.png"), full_page=True)

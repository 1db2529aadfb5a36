"""What a newcomer meets in the first hour (issue 21): the quick start's links open, another project's
report says whose it is, a pasted log is a report, a file that cannot be a log is refused at once, and
the hosts page and the README say the same about starting a GPU worker."""

from __future__ import annotations

import gzip
import re
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.urls import reverse

from dispatchlab.messaging.broker import default_data_dir
from dispatchlab.reports.accounts import apitoken_create
from dispatchlab.reports.models import Membership, Project, Report

ROOT = Path(__file__).resolve().parents[2]
REPORTS = "/api/v1/reports"
CRASH = (ROOT / "tests" / "pipeline" / "data" / "sglang_oom.log").read_bytes()


def bearer(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def quick_start_project(readme: str) -> str:
    return re.search(r"apitoken --user ci --project (\S+) --create", readme).group(1)


# ---- item 1: the quick start's project, and another project's report


def test_the_quick_start_token_goes_to_the_project_the_run_commands_login_belongs_to(db):
    for doc in ("README.md", "docs/api-quickstart.md"):
        text = (ROOT / doc).read_text()
        project = quick_start_project(text)
        assert f"webhooksecret --project {project}" in text and f"DISPATCHLAB_PROJECT={project}" in text, doc
    call_command("bootstrap", username="admin", stdout=StringIO())  # what the run command does
    call_command("apitoken", user="ci", project=project, create=True, stdout=StringIO(), stderr=StringIO())
    admin = User.objects.get(username="admin")
    ci_project = Project.objects.get(api_tokens__user__username="ci")
    assert Membership.objects.filter(user=admin, project=ci_project).exists()


def test_a_token_for_a_new_project_says_who_will_see_its_reports(db):
    err = StringIO()
    call_command("apitoken", user="ci", project="serving", create=True, stdout=StringIO(), stderr=err)
    assert "only its members open its reports on the dashboard" in err.getvalue()


def test_another_projects_report_page_says_whose_it_is_and_nothing_of_it(charlie_client, acme, make_report):
    report = make_report(acme, title="secret launch of acme")
    for url in (reverse("front:report", args=[report.pk]), reverse("front:log", args=[report.pk])):
        response = charlie_client.get(url)
        html = response.content.decode()
        assert response.status_code == 404, url
        assert "You are not a member of project Acme" in html
        assert "secret launch of acme" not in html and "CUDA out of memory" not in html
        assert 'href="/"' in html  # a page of the dashboard, with its navigation


def test_a_missing_report_is_still_no_such_report(charlie_client, acme):
    response = charlie_client.get(reverse("front:report", args=[987654]))
    assert response.status_code == 404 and b"not a member" not in response.content
    assert charlie_client.get(f"{REPORTS}/987654").json() == {"error": "no such report"}


def test_the_api_names_the_project_of_a_report_the_caller_cannot_see(
    client, charlie, umbrella, acme, make_report
):
    report = make_report(acme, title="secret launch of acme")
    _, key = apitoken_create(user=charlie, project=umbrella)
    response = client.get(f"{REPORTS}/{report.pk}", **bearer(key))
    assert response.status_code == 404
    assert response.json() == {"error": "you are not a member of project Acme"}


def test_a_token_of_another_of_the_users_projects_says_which_project_it_is_for(
    client, alice, acme, umbrella, make_report
):
    Membership.objects.create(user=alice, project=umbrella)
    _, key = apitoken_create(user=alice, project=acme)
    theirs = make_report(umbrella)
    answer = client.get(f"{REPORTS}/{theirs.pk}", **bearer(key)).json()
    assert answer == {"error": f"report {theirs.pk} is in project Umbrella; this token is for project Acme"}


# ---- item 4: paste, and uploads that cannot be a log


def test_a_pasted_traceback_becomes_a_report(alice_client, acme):
    text = CRASH.decode()
    response = alice_client.post(reverse("front:upload"), {"project": "acme", "text": text})
    report = Report.objects.get(project=acme)
    assert response.status_code == 302 and response.url == reverse("front:report", args=[report.pk])
    assert [f.original_name for f in report.files.all()] == ["pasted.log"]


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("server.log", b"", "server.log: empty file, nothing to parse"),
        ("core.bin", bytes(range(256)) * 64, "core.bin: binary data, not a text log"),
        ("rank1.log.gz", b"\x1f\x8b\x08\x00broken", "rank1.log.gz: not a readable .gz file"),
        ("empty.log.gz", gzip.compress(b""), "empty.log.gz: empty file, nothing to parse"),
    ],
)
def test_a_file_that_cannot_be_a_log_is_refused_with_its_reason_everywhere(
    alice_client, client, alice, acme, name, content, reason
):
    page = alice_client.post(
        reverse("front:upload"),
        {"project": "acme", "file": SimpleUploadedFile(name, content), "title": "try one"},
    )
    assert page.status_code == 400 and reason in page.content.decode()
    assert 'value="try one"' in page.content.decode()  # the form is ready for the next try
    _, key = apitoken_create(user=alice, project=acme)
    api = client.post(REPORTS, {"file": SimpleUploadedFile(name, content)}, **bearer(key))
    assert api.status_code == 400 and reason in api.json()["error"]
    assert not Report.objects.exists()


def test_an_empty_paste_is_refused_and_kept_for_the_next_try(alice_client, acme):
    response = alice_client.post(reverse("front:upload"), {"project": "acme", "text": "  \n\t\n"})
    html = response.content.decode()
    assert response.status_code == 400 and "The pasted text is empty" in html
    assert not Report.objects.exists()
    pasted = 'Traceback (most recent call last):\n  File "x.py"\x00'
    response = alice_client.post(reverse("front:upload"), {"project": "acme", "text": pasted})
    assert (
        response.status_code == 400 and "pasted.log: binary data, not a text log" in response.content.decode()
    )
    assert "Traceback (most recent call last):" in response.content.decode()


def test_the_upload_page_offers_a_box_for_pasted_text(alice_client, acme):
    html = alice_client.get(reverse("front:upload")).content.decode()
    assert 'name="text"' in html and 'id="paste-input"' in html
    assert 'name="file" multiple required' not in html  # a paste alone is enough


# ---- item 9: the GPU worker from the README's setup


def gpu_worker_section(readme: str) -> str:
    return readme.split("## Confirm a fix on a GPU", 1)[1].split("\n## ", 1)[0]


def test_the_hosts_page_and_the_readme_name_the_same_worker_commands(alice_client, settings):
    settings.CELERY_BROKER_URL = "filesystem://localhost/"  # the run command's broker
    settings.DATA_DIR = default_data_dir()
    html = alice_client.get(reverse("front:hosts")).content.decode()
    commands = re.findall(r'<pre class="command"><code>(.*?)</code></pre>', html)
    assert commands[0] == "python -m worker serve"
    assert any("DISPATCHLAB_BROKER_URL=redis://" in command for command in commands)
    section = gpu_worker_section((ROOT / "README.md").read_text())
    for command in commands:
        assert command in section, command


def test_the_hosts_page_names_the_data_dir_and_hides_a_redis_password(alice_client, settings, tmp_path):
    settings.CELERY_BROKER_URL = "filesystem://localhost/"
    settings.DATA_DIR = tmp_path
    html = alice_client.get(reverse("front:hosts")).content.decode()
    assert f"DISPATCHLAB_DATA_DIR={tmp_path} python -m worker serve" in html
    settings.CELERY_BROKER_URL = "redis://:hunter2@10.0.0.5:6379/3"
    html = alice_client.get(reverse("front:hosts")).content.decode()
    assert "DISPATCHLAB_BROKER_URL=redis://:PASSWORD@10.0.0.5:6379/3 python -m worker serve" in html
    assert "hunter2" not in html

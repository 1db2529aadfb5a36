"""Redacting a report's log: the stored files are replaced, the parse runs again on the copy, and only
members with write access may do it."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from django.core.files.storage import default_storage
from django.test import Client

from dispatchlab.reports.models import Report
from dispatchlab.reports.services import apitoken_create, report_submit

SECRET = "hf_SeCrEtToKeN1234567890"


@pytest.fixture
def parsed(alice, acme, oom_log, make_upload, django_capture_on_commit_callbacks) -> Report:
    log = oom_log.replace(b"\n", f"\nHF_TOKEN={SECRET}\n".encode(), 1)
    with django_capture_on_commit_callbacks(execute=True):
        report, _ = report_submit(
            project=acme, user=alice, files=[make_upload("server.log.gz", gzip.compress(log))]
        )
    report.refresh_from_db()
    assert report.status == Report.Status.DONE
    return report


def stored_text(report: Report) -> bytes:
    report.refresh_from_db()
    data = b"".join(default_storage.open(item.file.name).read() for item in report.files.all())
    return gzip.decompress(data) if data.startswith(b"\x1f\x8b") else data


def test_a_member_redacts_a_pattern_from_the_api_and_the_parse_runs_again(
    parsed, alice, acme, django_capture_on_commit_callbacks
):
    old_names = [item.file.name for item in parsed.files.all()]
    old_text = Path(parsed.text_path).read_bytes()
    assert SECRET.encode() in old_text
    _, key = apitoken_create(user=alice, project=acme)
    with django_capture_on_commit_callbacks(execute=True):
        response = Client().post(
            f"/api/v1/reports/{parsed.id}/redact",
            {"pattern": r"hf_\w+"},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {key}",
        )
    assert response.status_code == 202, response.content
    assert response.json()["redacted_lines"] == 1
    parsed.refresh_from_db()
    assert parsed.status == Report.Status.DONE and parsed.document["failure_class"] == "oom"
    assert SECRET.encode() not in stored_text(parsed) and b"HF_TOKEN=[REDACTED]" in stored_text(parsed)
    assert SECRET.encode() not in Path(parsed.text_path).read_bytes()
    assert SECRET not in str(parsed.document)
    assert not any(default_storage.exists(name) for name in old_names)


def test_a_line_range_is_redacted_from_the_report_page(
    parsed, alice_client, django_capture_on_commit_callbacks
):
    page = alice_client.get(f"/reports/{parsed.id}/")
    assert f"/reports/{parsed.id}/redact/" in page.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(
            f"/reports/{parsed.id}/redact/", {"mode": "lines", "first_line": "2", "last_line": "2"}
        )
    assert response.status_code == 302
    lines = stored_text(parsed).decode().splitlines()
    assert lines[1] == "[REDACTED]" and SECRET not in "\n".join(lines)
    parsed.refresh_from_db()
    assert parsed.status == Report.Status.DONE


def test_a_viewer_or_a_read_only_token_cannot_redact(parsed, bob_client, alice, acme):
    assert (
        bob_client.post(f"/reports/{parsed.id}/redact/", {"mode": "lines", "first_line": "1"}).status_code
        == 403
    )
    _, key = apitoken_create(user=alice, project=acme, read_only=True)
    response = Client().post(
        f"/api/v1/reports/{parsed.id}/redact",
        {"first_line": 1},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 403
    assert SECRET.encode() in stored_text(parsed)


def test_an_outsider_sees_no_such_report(parsed, charlie_client):
    assert (
        charlie_client.post(f"/reports/{parsed.id}/redact/", {"mode": "lines", "first_line": "1"}).status_code
        == 404
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"pattern": "("}, "not a regular expression"),
        ({"pattern": "x*"}, "matches empty text"),
        ({"first_line": 3, "last_line": 2}, "first_line <= last_line"),
        ({}, "send a pattern"),
        ({"pattern": "a", "first_line": 1}, "not both"),
    ],
)
def test_a_bad_redaction_is_a_400_naming_the_problem(parsed, alice, acme, body, message):
    _, key = apitoken_create(user=alice, project=acme)
    response = Client().post(
        f"/api/v1/reports/{parsed.id}/redact",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 400 and message in response.json()["error"]
    assert SECRET.encode() in stored_text(parsed)


def test_a_report_being_parsed_is_not_redacted(parsed, alice_client):
    Report.objects.filter(id=parsed.id).update(status=Report.Status.PARSING)
    response = alice_client.post(f"/reports/{parsed.id}/redact/", {"mode": "pattern", "pattern": "hf_"})
    assert response.status_code == 409 and "being parsed" in response.content.decode()

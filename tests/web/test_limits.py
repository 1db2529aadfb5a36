"""Limits by configuration, enforced before anything is stored: body size per endpoint (by the declared
length), expanded size per compressed file (while it expands), a disk quota per project."""

from __future__ import annotations

import gzip
import io
import zipfile
from pathlib import Path

import pytest
from django.test import Client

from dispatchlab.core import LogReadError
from dispatchlab.core.reading import expansion_limit, iter_lines
from dispatchlab.reports.accounts import apitoken_create
from dispatchlab.reports.models import Project, Report
from dispatchlab.reports.submit import report_submit

LINE = b"[2026-05-24 00:51:02 TP0] Decode batch. #running-req: 1, #token: 811, token usage: 0.01\n"


def gz_bomb(expanded: int) -> bytes:
    """One repeated line, as issue 11's 40 MB .gz: far under the 1000x ratio guard, streamed out."""
    out = io.BytesIO()
    block = LINE * (1024 * 1024 // len(LINE))
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6) as gz:
        for _ in range(expanded // len(block) + 1):
            gz.write(block)
    return out.getvalue()


def test_a_compressed_file_over_the_absolute_cap_fails_while_it_expands(tmp_path):
    bomb = tmp_path / "server.log.gz"
    bomb.write_bytes(gz_bomb(64 * 1024 * 1024))
    expanded_ratio = 64 * 1024 * 1024 / bomb.stat().st_size
    assert expanded_ratio < 1000, "the bomb must pass the ratio guard: only the absolute cap stops it"
    read = 0
    with expansion_limit(8 * 1024 * 1024), pytest.raises(LogReadError) as refused:
        for line in iter_lines([bomb]):
            read += len(line) + 1
    assert "DISPATCHLAB_MAX_EXPANDED_BYTES" in str(refused.value) and "8,388,608 bytes" in str(refused.value)
    assert read <= 8 * 1024 * 1024  # stopped at the cap, not after expanding it all
    assert sum(len(line) + 1 for line in iter_lines([bomb])) > 60 * 1024 * 1024  # no cap: all of it


def test_an_upload_over_the_expanded_cap_is_a_failed_report_naming_the_limit(
    alice, acme, make_upload, settings, django_capture_on_commit_callbacks
):
    settings.DISPATCHLAB_MAX_EXPANDED_BYTES = 4 * 1024 * 1024
    with django_capture_on_commit_callbacks(execute=True):
        report, _ = report_submit(
            project=acme, user=alice, files=[make_upload("crash.log.gz", gz_bomb(32 * 1024 * 1024))]
        )
    report.refresh_from_db()
    assert report.status == Report.Status.FAILED
    assert "4,194,304 bytes" in report.error and "DISPATCHLAB_MAX_EXPANDED_BYTES" in report.error
    assert not report.text_path
    text_copies = list(Path(settings.MEDIA_ROOT).rglob("text.log*"))
    assert all(path.stat().st_size <= 4 * 1024 * 1024 for path in text_copies)


def leftovers(folder: Path) -> list[str]:
    """What a parse may leave behind under the data folder: temporary copies and scan workers' parts."""
    return sorted(
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.name.endswith(".tmp") or path.name.startswith(".parts-")
    )


def test_a_refused_bomb_leaves_no_temporary_text_copy_behind(
    alice, acme, make_upload, settings, django_capture_on_commit_callbacks
):
    settings.DISPATCHLAB_MAX_EXPANDED_BYTES = 4 * 1024 * 1024
    with django_capture_on_commit_callbacks(execute=True):
        report, _ = report_submit(
            project=acme, user=alice, files=[make_upload("crash.log.gz", gz_bomb(32 * 1024 * 1024))]
        )
    report.refresh_from_db()
    assert report.status == Report.Status.FAILED and "DISPATCHLAB_MAX_EXPANDED_BYTES" in report.error
    assert leftovers(Path(settings.MEDIA_ROOT)) == []


def test_many_small_gz_files_that_together_pass_the_report_cap_are_refused_naming_it(
    alice, acme, make_upload, settings, django_capture_on_commit_callbacks
):
    # each of the twenty is under the per-file cap; together they would make a text copy 20x its size
    settings.DISPATCHLAB_MAX_EXPANDED_BYTES = 4 * 1024 * 1024
    settings.DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES = 8 * 1024 * 1024
    files = [make_upload(f"rank{n}.log.gz", gz_bomb(1024 * 1024 + n)) for n in range(20)]
    with django_capture_on_commit_callbacks(execute=True):
        report, _ = report_submit(project=acme, user=alice, files=files)
    report.refresh_from_db()
    assert report.status == Report.Status.FAILED
    assert "8,388,608 bytes" in report.error and "DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES" in report.error
    assert not report.text_path and leftovers(Path(settings.MEDIA_ROOT)) == []


def test_a_zip_with_more_members_than_the_limit_is_a_failed_report_naming_it(
    alice, acme, make_upload, settings, django_capture_on_commit_callbacks
):
    settings.DISPATCHLAB_MAX_ZIP_MEMBERS = 10
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        for n in range(11):
            zf.writestr(f"rank{n}.log", LINE)
    with django_capture_on_commit_callbacks(execute=True):
        report, _ = report_submit(
            project=acme, user=alice, files=[make_upload("ranks.zip", archive.getvalue())]
        )
    report.refresh_from_db()
    assert report.status == Report.Status.FAILED
    assert "11 members" in report.error and "DISPATCHLAB_MAX_ZIP_MEMBERS" in report.error


def test_a_body_over_an_endpoints_limit_is_refused_by_its_declared_length(alice, acme, settings):
    settings.DISPATCHLAB_BODY_LIMITS = {**settings.DISPATCHLAB_BODY_LIMITS, "/api/v1/reports": 1000}
    _, key = apitoken_create(user=alice, project=acme)
    response = Client().post(
        "/api/v1/reports",
        b"x",
        content_type="text/plain",
        CONTENT_LENGTH="5000000",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 413
    assert response.json()["error"] == "the upload is 5,000,000 bytes; the limit is 1,000 bytes"


def test_a_login_form_with_a_large_body_is_refused_before_reading(client):
    response = client.post(
        "/accounts/login/", b"x", content_type="application/x-www-form-urlencoded", CONTENT_LENGTH="10000000"
    )
    assert response.status_code == 413 and "65,536 bytes" in response.json()["error"]


def test_a_chunked_upload_gets_a_411_saying_to_send_a_length(alice, acme):
    _, key = apitoken_create(user=alice, project=acme)
    response = Client().post(
        "/api/v1/reports",
        b"",
        content_type="multipart/form-data; boundary=x",
        CONTENT_LENGTH="",
        HTTP_TRANSFER_ENCODING="chunked",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 411
    assert "Content-Length" in response.json()["error"] and "chunked" in response.json()["error"]
    assert not Report.objects.exists()


def test_an_upload_past_the_projects_quota_is_a_507_naming_usage_and_quota(
    alice, acme, make_upload, make_report, settings
):
    settings.DISPATCHLAB_PROJECT_QUOTA_BYTES = 10_000
    make_report(acme, total_bytes=9_000)
    _, key = apitoken_create(user=alice, project=acme)
    response = Client().post(
        "/api/v1/reports",
        {"file": make_upload(content=b"x" * 2_000 + b"\n")},
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 507
    assert response.json()["error"].startswith(
        "project acme stores 9,000 bytes of uploads; this upload of 2,001 bytes would pass its quota of 10,000 bytes"
    )
    assert Report.objects.count() == 1
    # A project's own quota overrides the default.
    Project.objects.filter(id=acme.id).update(quota_bytes=0)
    response = Client().post(
        "/api/v1/reports",
        {"file": make_upload(content=b"x" * 2_000 + b"\n")},
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 201

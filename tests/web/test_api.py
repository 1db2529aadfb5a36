from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest
from django.core.files.base import ContentFile
from django.test import Client

from dispatchlab.reports.accounts import apitoken_create
from dispatchlab.reports.models import Report

REPORTS = "/api/v1/reports"
HOOK = "/api/v1/hooks/ci"


def bearer(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def alice_key(acme, alice) -> str:
    return apitoken_create(user=alice, project=acme)[1]


@pytest.fixture
def charlie_key(umbrella, charlie) -> str:
    return apitoken_create(user=charlie, project=umbrella)[1]


# ---------------------------------------------------------------- POST /api/v1/reports


def test_it_accepts_an_upload_and_answers_at_once(
    client, alice_key, make_upload, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(REPORTS, {"file": make_upload(), "title": "nightly"}, **bearer(alice_key))
    assert response.status_code == 201
    body = response.json()
    assert set(body) >= {"id", "url", "status"}
    assert body["status"] == "queued" and body["url"].endswith(f"/reports/{body['id']}/")
    assert len(callbacks) == 1
    report = Report.objects.get(id=body["id"])
    assert report.title == "nightly" and report.project.slug == "acme"


def test_the_same_upload_returns_the_same_report(client, alice_key, make_upload):
    first = client.post(REPORTS, {"file": make_upload()}, **bearer(alice_key)).json()
    again = client.post(REPORTS, {"file": make_upload("other-name.log")}, **bearer(alice_key))
    assert again.status_code == 201
    assert again.json()["id"] == first["id"] and again.json()["duplicate"] is True


def test_several_files_in_the_field_make_one_report(client, alice_key, make_upload):
    response = client.post(
        REPORTS, {"file": [make_upload("a.log", b"a\n"), make_upload("b.log", b"b\n")]}, **bearer(alice_key)
    )
    report = Report.objects.get(id=response.json()["id"])
    assert [f.original_name for f in report.files.all()] == ["a.log", "b.log"]


def test_a_session_upload_works_for_a_member(alice_client, make_upload):
    response = alice_client.post(REPORTS, {"file": make_upload()})
    assert response.status_code == 201


def test_a_session_upload_needs_the_csrf_token(alice, make_upload):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post(REPORTS, {"file": make_upload()})
    assert response.status_code == 403 and "CSRF" in response.json()["error"]


def test_a_read_only_token_cannot_upload(client, acme, alice, make_upload):
    _, key = apitoken_create(user=alice, project=acme, read_only=True)
    response = client.post(REPORTS, {"file": make_upload()}, **bearer(key))
    assert response.status_code == 403 and response.json() == {"error": "this token is read-only"}
    assert not Report.objects.exists()


def test_a_viewer_cannot_upload(bob_client, make_upload):
    response = bob_client.post(REPORTS, {"file": make_upload()})
    assert response.status_code == 403
    assert not Report.objects.exists()


def test_charlie_cannot_upload_into_acme(charlie_client, acme, make_upload):
    response = charlie_client.post(REPORTS, {"file": make_upload(), "project": "acme"})
    assert response.status_code == 404
    assert not Report.objects.exists()


def test_an_anonymous_upload_is_refused(client, make_upload):
    response = client.post(REPORTS, {"file": make_upload()})
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Bearer"


def test_an_unknown_token_is_refused(client, alice_key, make_upload):
    response = client.post(REPORTS, {"file": make_upload()}, **bearer(alice_key + "x"))
    assert response.status_code == 401


def test_an_upload_without_a_file_is_refused(client, alice_key):
    response = client.post(REPORTS, {"title": "x"}, **bearer(alice_key))
    assert response.status_code == 400 and "'file'" in response.json()["error"]


def test_an_upload_over_the_limit_is_refused_before_it_is_read(client, alice_key, make_upload, settings):
    settings.DISPATCHLAB_MAX_UPLOAD_BYTES = 10
    response = client.post(
        REPORTS, {"file": make_upload()}, CONTENT_LENGTH=str(50 * 1024 * 1024), **bearer(alice_key)
    )
    assert response.status_code == 413
    response = client.post(REPORTS, {"file": make_upload()}, **bearer(alice_key))
    assert response.status_code == 413 and "the limit is 10 bytes" in response.json()["error"]


def test_a_member_of_several_projects_names_one(client, alice, acme, umbrella, make_upload):
    from dispatchlab.reports.models import Membership

    Membership.objects.create(user=alice, project=umbrella)
    client.force_login(alice)
    assert client.post(REPORTS, {"file": make_upload()}).status_code == 400
    response = client.post(REPORTS, {"file": make_upload(), "project": "umbrella"})
    assert response.status_code == 201
    assert Report.objects.get().project == umbrella


# ---------------------------------------------------------------- GET /api/v1/reports[/<id>]


def test_a_member_reads_a_report_and_its_document(client, alice_key, acme, make_report, make_document):
    report = make_report(acme)
    response = client.get(f"{REPORTS}/{report.id}", **bearer(alice_key))
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == report.id and body["status"] == "done" and body["error"] is None
    # the stored document, with the similar incidents as of this read
    similar = body["document"].pop("similar")
    assert body["document"] == make_document()
    assert similar["groups"] == [] and all(case["url"] for case in similar["cases"])


def test_a_failed_report_says_why(bob_client, acme, make_report):
    report = make_report(acme, status=Report.Status.FAILED, error="server.log: empty file, nothing to parse")
    body = bob_client.get(f"{REPORTS}/{report.id}").json()
    assert body["status"] == "failed" and body["error"] == "server.log: empty file, nothing to parse"
    assert body["document"] is None


def test_charlie_cannot_read_acme_reports(charlie_client, client, charlie_key, acme, make_report):
    report = make_report(acme)
    assert charlie_client.get(f"{REPORTS}/{report.id}").status_code == 404
    assert client.get(f"{REPORTS}/{report.id}", **bearer(charlie_key)).status_code == 404
    listed = charlie_client.get(REPORTS).json()
    assert listed["reports"] == listed["results"] == [] and listed["count"] == 0


def test_an_anonymous_read_is_refused(client, acme, make_report):
    assert client.get(f"{REPORTS}/{make_report(acme).id}").status_code == 401


def test_a_token_sees_only_its_own_project(client, alice, acme, umbrella, make_report):
    from dispatchlab.reports.models import Membership

    Membership.objects.create(user=alice, project=umbrella)
    _, key = apitoken_create(user=alice, project=acme)
    theirs = make_report(umbrella)
    assert client.get(f"{REPORTS}/{theirs.id}", **bearer(key)).status_code == 404


def test_the_list_shows_the_newest_reports_with_filters(alice_client, acme, umbrella, make_report):
    oom = make_report(acme)
    failed = make_report(acme, status=Report.Status.FAILED)
    make_report(umbrella)
    listed = alice_client.get(REPORTS).json()["reports"]
    assert [item["id"] for item in listed] == [failed.id, oom.id]
    listed = alice_client.get(REPORTS, {"failure_class": "oom"}).json()["reports"]
    assert [item["id"] for item in listed] == [oom.id]
    assert alice_client.get(REPORTS, {"limit": "x"}).status_code == 400


# ---------------------------------------------------------------- POST /api/v1/hooks/ci


def sign(secret: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    signed = body if timestamp is None else f"{timestamp}.".encode() + body
    headers = {
        "HTTP_X_DISPATCHLAB_SIGNATURE": "sha256="
        + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    }
    if timestamp is not None:
        headers["HTTP_X_DISPATCHLAB_TIMESTAMP"] = str(timestamp)
    return headers


def hook_body(oom_log: bytes, **extra: str) -> bytes:
    payload = {
        "log": oom_log.decode(),
        "job": "e2e-h100",
        "url": "https://ci.example/run/7",
        "commit": "abc123",
    }
    payload.update(extra)
    return json.dumps(payload).encode()


def test_a_signed_ci_delivery_makes_a_report(client, acme, oom_log, django_capture_on_commit_callbacks):
    body = hook_body(oom_log)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(HOOK, body, content_type="application/json", **sign(acme.webhook_secret, body))
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "queued" and len(callbacks) == 1
    report = Report.objects.get(id=response.json()["id"])
    assert report.project == acme
    assert (report.ci_job, report.ci_url, report.ci_commit) == (
        "e2e-h100",
        "https://ci.example/run/7",
        "abc123",
    )
    assert report.files.get().original_name == "e2e-h100.log"
    with report.files.get().file.open("rb") as handle:
        assert handle.read() == oom_log


def test_a_delivery_with_a_fresh_timestamp_is_signed_over_timestamp_and_body(client, acme, oom_log):
    body, now = hook_body(oom_log), int(time.time())
    response = client.post(
        HOOK, body, content_type="application/json", **sign(acme.webhook_secret, body, now)
    )
    assert response.status_code == 201
    # the same signature without the timestamp in it does not verify
    headers = {**sign(acme.webhook_secret, body), "HTTP_X_DISPATCHLAB_TIMESTAMP": str(now)}
    assert client.post(HOOK, body, content_type="application/json", **headers).status_code == 401


def test_a_delivery_older_than_five_minutes_is_refused(client, acme, oom_log):
    body, old = hook_body(oom_log), int(time.time()) - 301
    response = client.post(
        HOOK, body, content_type="application/json", **sign(acme.webhook_secret, body, old)
    )
    assert response.status_code == 401 and "older than 300 seconds" in response.json()["error"]
    assert not Report.objects.exists()


def test_a_badly_signed_delivery_is_refused(client, acme, oom_log):
    body = hook_body(oom_log)
    response = client.post(HOOK, body, content_type="application/json", **sign("not-the-secret", body))
    assert response.status_code == 401 and response.json() == {"error": "bad signature"}
    assert client.post(HOOK, body, content_type="application/json").status_code == 401
    assert not Report.objects.exists()


def test_charlie_signing_with_his_secret_cannot_deliver_into_acme(client, acme, umbrella, oom_log):
    body = hook_body(oom_log)
    response = client.post(
        f"{HOOK}?project=acme", body, content_type="application/json", **sign(umbrella.webhook_secret, body)
    )
    assert response.status_code == 401
    # without the project named, his secret puts the report in his own project
    response = client.post(HOOK, body, content_type="application/json", **sign(umbrella.webhook_secret, body))
    assert Report.objects.get(id=response.json()["id"]).project == umbrella
    assert not Report.objects.filter(project=acme).exists()


def test_a_repeated_delivery_returns_the_first_report(client, acme, oom_log):
    first_body = hook_body(oom_log)
    headers = {**sign(acme.webhook_secret, first_body), "HTTP_X_DISPATCHLAB_DELIVERY": "gh-123"}
    first = client.post(HOOK, first_body, content_type="application/json", **headers).json()
    # a retry may carry a different body (another timestamp in the log); the delivery id decides
    retry_body = hook_body(oom_log + b"retried\n")
    headers = {**sign(acme.webhook_secret, retry_body), "HTTP_X_DISPATCHLAB_DELIVERY": "gh-123"}
    again = client.post(HOOK, retry_body, content_type="application/json", **headers)
    assert again.status_code == 201 and again.json()["id"] == first["id"]
    assert Report.objects.count() == 1


def test_a_multipart_delivery_is_signed_over_its_raw_body(client, acme, oom_log):
    from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart

    body = encode_multipart(
        BOUNDARY, {"file": _named(oom_log, "job.log"), "job": "nightly", "commit": "def456"}
    )
    response = client.generic(
        "POST", HOOK, body, content_type=MULTIPART_CONTENT, **sign(acme.webhook_secret, body)
    )
    assert response.status_code == 201, response.content
    report = Report.objects.get(id=response.json()["id"])
    assert report.ci_job == "nightly" and report.files.get().original_name == "job.log"


def _named(content: bytes, name: str):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, content)


def test_a_json_delivery_without_a_log_is_refused(client, acme):
    body = json.dumps({"job": "x"}).encode()
    response = client.post(HOOK, body, content_type="application/json", **sign(acme.webhook_secret, body))
    assert response.status_code == 400 and "'log'" in response.json()["error"]


def test_waiting_answers_like_get_once_the_wait_ends(client, acme, oom_log):
    body = hook_body(oom_log)
    started = time.monotonic()
    response = client.post(
        f"{HOOK}?wait=1", body, content_type="application/json", **sign(acme.webhook_secret, body)
    )
    assert 1 <= time.monotonic() - started < 5
    assert response.status_code == 201
    assert set(response.json()) >= {"id", "status", "error", "document"}


def test_waiting_returns_the_diagnosis_of_a_parsed_report(
    client, acme, oom_log, django_capture_on_commit_callbacks
):
    body = hook_body(oom_log)
    headers = {**sign(acme.webhook_secret, body), "HTTP_X_DISPATCHLAB_DELIVERY": "run-1"}
    with django_capture_on_commit_callbacks(execute=True):
        client.post(HOOK, body, content_type="application/json", **headers)  # parsed eagerly
    response = client.post(f"{HOOK}?wait=5", body, content_type="application/json", **headers)
    answer = response.json()
    assert answer["status"] == "done" and answer["document"]["failure_class"] == "oom"


# ---------------------------------------------------------------- /api/schema/


def test_the_schema_describes_the_contract(client, charlie_client):
    schema = client.get("/api/schema/").json()
    assert schema["openapi"].startswith("3.")
    assert {"/api/v1/reports", "/api/v1/reports/{id}", "/api/v1/hooks/ci"} <= set(schema["paths"])
    assert {"/api/v1/hosts", "/api/v1/reports/{id}/confirm", "/api/v1/confirms/{id}"} <= set(schema["paths"])
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    # public: it holds no data, so an outsider gets the same document
    assert charlie_client.get("/api/schema/").json() == schema


def test_a_delivery_among_many_projects_lands_in_the_one_it_names(client, acme, umbrella, oom_log):
    from dispatchlab.reports.models import Project

    for n in range(60):
        Project.objects.create(name=f"p{n}", slug=f"p{n}")
    body = hook_body(oom_log)
    # unnamed, its body would be hashed under 62 secrets (more than 8): the sender must name the project
    response = client.post(HOOK, body, content_type="application/json", **sign(acme.webhook_secret, body))
    assert response.status_code == 400 and "X-Dispatchlab-Project" in response.json()["error"]
    response = client.post(
        f"{HOOK}?project=acme", body, content_type="application/json", **sign(acme.webhook_secret, body)
    )
    assert response.status_code == 201, response.content
    assert Report.objects.get(id=response.json()["id"]).project == acme
    # charlie's secret does not sign for acme
    body = hook_body(oom_log, job="again")
    response = client.post(
        f"{HOOK}?project=acme", body, content_type="application/json", **sign(umbrella.webhook_secret, body)
    )
    assert response.status_code == 401
    response = client.post(
        HOOK,
        body,
        content_type="application/json",
        HTTP_X_DISPATCHLAB_PROJECT="umbrella",
        **sign(umbrella.webhook_secret, body),
    )
    assert response.status_code == 201 and Report.objects.get(id=response.json()["id"]).project == umbrella


def test_a_json_delivery_over_the_json_limit_is_refused_before_it_is_read(client, acme, oom_log, settings):
    settings.DISPATCHLAB_MAX_JSON_BYTES = 1000
    body = hook_body(oom_log)
    assert len(body) > 1000
    response = client.post(HOOK, body, content_type="application/json", **sign(acme.webhook_secret, body))
    assert response.status_code == 413 and "1,000 bytes" in response.json()["error"]
    # the declared length alone refuses it: reading the body would fail the test client
    response = client.post(
        HOOK,
        b"{}",
        content_type="application/json",
        CONTENT_LENGTH=str(10 * 1024 * 1024),
        **sign(acme.webhook_secret, b"{}"),
    )
    assert response.status_code == 413
    assert not Report.objects.exists()


def test_a_multipart_delivery_is_not_held_to_the_json_limit(client, acme, oom_log, settings):
    settings.DISPATCHLAB_MAX_JSON_BYTES = 1000
    from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart

    body = encode_multipart(BOUNDARY, {"job": "nightly", "file": ContentFile(oom_log, name="server.log")})
    response = client.generic(
        "POST", HOOK, body, content_type=MULTIPART_CONTENT, **sign(acme.webhook_secret, body)
    )
    assert response.status_code == 201, response.content


def test_a_session_upload_goes_to_the_one_project_the_user_can_upload_to(
    client, alice, acme, umbrella, make_upload
):
    from dispatchlab.reports.models import Membership

    Membership.objects.create(user=alice, project=umbrella, role=Membership.Role.VIEWER)
    client.force_login(alice)
    response = client.post(REPORTS, {"file": make_upload()})
    assert response.status_code == 201, response.content
    assert Report.objects.get().project == acme


def test_a_viewer_of_several_projects_is_told_it_cannot_upload(client, bob, acme, umbrella, make_upload):
    from dispatchlab.reports.models import Membership

    Membership.objects.create(user=bob, project=umbrella, role=Membership.Role.VIEWER)
    client.force_login(bob)
    response = client.post(REPORTS, {"file": make_upload()})
    assert response.status_code == 403 and not Report.objects.exists()


def test_a_project_named_with_unicode_digits_is_not_found(alice_client, acme, make_upload):
    response = alice_client.post(REPORTS, {"file": make_upload(), "project": "²"})
    assert response.status_code == 404

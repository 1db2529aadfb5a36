from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone

import dispatchlab.core
from dispatchlab.core.lineindex import write_line_index
from dispatchlab.reports import selectors
from dispatchlab.reports.accounts import apitoken_authenticate, apitoken_create, user_bootstrap
from dispatchlab.reports.analysis import Outcome, report_analyze, report_claim
from dispatchlab.reports.models import ApiToken, FailureGroup, Membership, Report, ReportFile
from dispatchlab.reports.submit import (
    UploadRejected,
    report_create,
    report_rematch,
    report_submit,
    reports_rematch,
    reports_requeue_stale,
)

# ---------------------------------------------------------------- uploads


def test_it_stores_an_upload_and_enqueues_the_analysis_after_commit(
    acme, alice, make_upload, oom_log, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        report = report_create(project=acme, user=alice, files=[make_upload("server.log")])
    assert len(callbacks) == 1
    assert report.status == Report.Status.QUEUED
    assert report.title == "server.log" and report.created_by == alice
    assert report.total_bytes == len(oom_log)
    stored = report.files.get()
    assert stored.original_name == "server.log" and stored.size == len(oom_log)
    with stored.file.open("rb") as handle:
        assert handle.read() == oom_log


def test_it_returns_the_existing_report_when_the_same_bytes_come_again(acme, alice, make_upload):
    first, created = report_submit(project=acme, user=alice, files=[make_upload("a.log")])
    again, created_again = report_submit(project=acme, user=alice, files=[make_upload("renamed.log")])
    assert created and not created_again
    assert again.id == first.id
    assert Report.objects.count() == 1 and ReportFile.objects.count() == 1


def test_it_keeps_the_same_log_apart_in_two_projects(acme, umbrella, alice, charlie, make_upload):
    mine = report_create(project=acme, user=alice, files=[make_upload()])
    theirs = report_create(project=umbrella, user=charlie, files=[make_upload()])
    assert mine.id != theirs.id


def test_several_files_make_one_report_in_their_order(acme, alice, make_upload):
    report = report_create(
        project=acme, user=alice, files=[make_upload("rank0.log", b"a\n"), make_upload("rank1.log", b"b\n")]
    )
    assert [f.original_name for f in report.files.all()] == ["rank0.log", "rank1.log"]
    swapped = report_create(
        project=acme, user=alice, files=[make_upload("rank1.log", b"b\n"), make_upload("rank0.log", b"a\n")]
    )
    assert swapped.id != report.id


def test_it_refuses_an_upload_over_the_size_limit(acme, alice, make_upload, settings):
    settings.DISPATCHLAB_MAX_UPLOAD_BYTES = 100
    with pytest.raises(UploadRejected, match="the limit is 100 bytes"):
        report_create(project=acme, user=alice, files=[make_upload()])
    assert not Report.objects.exists()


def test_it_refuses_an_upload_without_files(acme, alice):
    with pytest.raises(UploadRejected, match="no file"):
        report_create(project=acme, user=alice, files=[])


def test_it_keeps_only_the_base_name_of_an_uploaded_file(acme, alice, make_upload, settings):
    report = report_create(project=acme, user=alice, files=[make_upload("../../etc/passwd.log")])
    stored = report.files.get()
    assert stored.original_name == "passwd.log"
    assert stored.file.name.startswith("uploads/acme/")
    assert ".." not in stored.file.name


# ---------------------------------------------------------------- the claim


def _queued(make_report, project, **fields: Any) -> Report:
    return make_report(project, status=Report.Status.QUEUED, **fields)


def test_a_report_is_claimed_once(acme, make_report):
    report = _queued(make_report, acme)
    assert report_claim(report_id=report.id, token="a") is True
    assert report_claim(report_id=report.id, token="b") is False
    report.refresh_from_db()
    assert report.status == Report.Status.PARSING and report.claim_token == "a" and report.attempts == 1


def test_a_stale_claim_is_taken_over(acme, make_report, settings):
    stale = timezone.now() - timedelta(seconds=settings.DISPATCHLAB_STALE_CLAIM_SECONDS + 5)
    report = make_report(acme, status=Report.Status.PARSING, claimed_at=stale, claim_token="dead", attempts=1)
    assert report_claim(report_id=report.id, token="alive") is True
    report.refresh_from_db()
    assert report.claim_token == "alive" and report.attempts == 2


def test_a_fresh_claim_is_not_taken_over(acme, make_report):
    report = make_report(acme, status=Report.Status.PARSING, claimed_at=timezone.now(), claim_token="busy")
    assert report_claim(report_id=report.id, token="other") is False


def test_a_finished_report_is_not_claimed(acme, make_report):
    assert report_claim(report_id=make_report(acme).id, token="x") is False
    assert report_claim(report_id=make_report(acme, status=Report.Status.FAILED).id, token="x") is False


# ---------------------------------------------------------------- analysis (with the core's answer fixed)


@pytest.fixture
def fake_core(monkeypatch, make_document):
    """Replace analyze_paths with one returning a fixed document (progress reported as it goes)."""
    calls: list[list[str]] = []
    answer: dict[str, Any] = {"document": make_document(), "error": None}

    def analyze_paths(paths, *, progress=None, line_index=None):
        calls.append([str(p) for p in paths])
        if progress is not None:
            for done in range(0, 101, 10):
                progress(done, 100)
        if answer["error"] is not None:
            raise answer["error"]
        document = json.loads(json.dumps(answer["document"]))
        if line_index is not None:  # the real parse writes the viewer's copy in the same read
            document["line_count"] = write_line_index(paths, *line_index)
        return document

    monkeypatch.setattr(dispatchlab.core, "analyze_paths", analyze_paths)
    return type("FakeCore", (), {"calls": calls, "answer": answer})


def _submitted(acme, alice, make_upload, content: bytes | None = None, name: str = "server.log") -> Report:
    report, _ = report_submit(project=acme, user=alice, files=[make_upload(name, content)])
    return report


def test_it_stores_the_document_and_its_columns(acme, alice, make_upload, fake_core):
    report = _submitted(acme, alice, make_upload)
    assert report_analyze(report_id=report.id) == Outcome.DONE
    report.refresh_from_db()
    assert report.status == Report.Status.DONE and report.progress == 100.0 and report.error == ""
    assert report.document["failure_class"] == "oom"
    assert report.failure_class == "oom" and report.top_match_id == "cuda-out-of-memory"
    assert report.server == "sglang" and report.arch == "sm_90" and report.model_name == "Qwen/Qwen3-30B-A3B"
    assert report.backend_values == {
        "attention_backend": "fa3",
        "moe_runner_backend": "triton",
        "draft_attention_backend": "triton",
    }
    assert report.finished_at is not None and report.parse_seconds is not None
    # the core read the upload under the name it was uploaded with
    assert fake_core.calls[0][0].endswith("/server.log")


def test_a_backend_filter_finds_the_report(acme, alice, make_upload, fake_core):
    report = _submitted(acme, alice, make_upload)
    report_analyze(report_id=report.id)
    assert list(Report.objects.filter(backend_values__attention_backend="fa3")) == [report]
    assert not Report.objects.filter(backend_values__attention_backend="triton").exists()


def test_it_writes_a_line_index_pages_can_read(acme, alice, make_upload, fake_core, oom_log):
    report = _submitted(acme, alice, make_upload)
    report_analyze(report_id=report.id)
    report.refresh_from_db()
    index = selectors.report_line_index(report)
    assert index is not None
    lines = oom_log.decode().splitlines()
    assert report.line_count == len(lines)
    assert [text for text, _ in index.read_lines(1, 2)] == lines[:2]
    assert (
        index.search("OutOfMemoryError").hits[0][0]
        == lines.index(next(x for x in lines if "OutOfMemoryError" in x)) + 1
    )


def test_a_crash_joins_the_group_of_its_fingerprint(acme, alice, make_upload, fake_core):
    first = _submitted(acme, alice, make_upload, b"one\n", "a.log")
    second = _submitted(acme, alice, make_upload, b"two\n", "b.log")
    report_analyze(report_id=first.id)
    report_analyze(report_id=second.id)
    group = FailureGroup.objects.get()
    assert group.count == 2 and group.failure_class == "oom" and group.title == "CUDA out of memory"
    assert set(group.reports.values_list("id", flat=True)) == {first.id, second.id}


def test_a_healthy_log_joins_no_group(acme, alice, make_upload, fake_core, make_document):
    fake_core.answer["document"] = make_document(
        matches=[], failure_class="none", crash=None, outcome="serving"
    )
    report = _submitted(acme, alice, make_upload)
    report_analyze(report_id=report.id)
    report.refresh_from_db()
    assert report.group is None and report.failure_class == "none"
    assert not FailureGroup.objects.exists()


def test_it_fails_with_the_readers_reason_for_a_binary_file(acme, alice, make_upload):
    report = _submitted(acme, alice, make_upload, b"\x7fELF\x02\x01\x01\x00\x00\x00" * 200, "core.log")
    assert report_analyze(report_id=report.id) == Outcome.FAILED
    report.refresh_from_db()
    assert report.status == Report.Status.FAILED
    assert report.error == "core.log: binary data, not a text log"


def test_an_unexpected_error_fails_the_report_with_its_type(acme, alice, make_upload, fake_core, caplog):
    fake_core.answer["error"] = ValueError("boom")
    report = _submitted(acme, alice, make_upload)
    assert report_analyze(report_id=report.id) == Outcome.FAILED
    report.refresh_from_db()
    assert report.error == "internal error while parsing: ValueError: boom"
    assert "Traceback" in caplog.text


def test_a_parse_refreshes_the_claim_while_it_runs(acme, alice, make_upload, monkeypatch):
    report = _submitted(acme, alice, make_upload)
    seen: list[tuple[str, float]] = []

    def analyze_paths(paths, *, progress=None, line_index=None):
        progress(50, 100)
        row = Report.objects.get(id=report.id)
        seen.append((row.status, row.progress))
        raise dispatchlab.core.LogReadError("stop here")

    monkeypatch.setattr(dispatchlab.core, "analyze_paths", analyze_paths)
    report_analyze(report_id=report.id)
    assert seen == [("parsing", 45.0)]  # half of the parsing share of the bar


def test_a_worker_that_lost_its_claim_stores_nothing(acme, alice, make_upload, monkeypatch):
    report = _submitted(acme, alice, make_upload)

    def analyze_paths(paths, *, progress=None, line_index=None):
        # meanwhile another worker took the report over
        Report.objects.filter(id=report.id).update(claim_token="someone-else")
        progress(100, 100)
        return {}

    monkeypatch.setattr(dispatchlab.core, "analyze_paths", analyze_paths)
    assert report_analyze(report_id=report.id) == Outcome.LOST
    report.refresh_from_db()
    assert report.status == Report.Status.PARSING and report.document is None


def test_it_gives_up_on_a_report_that_killed_its_workers(acme, make_report, settings, fake_core):
    stale = timezone.now() - timedelta(seconds=settings.DISPATCHLAB_STALE_CLAIM_SECONDS + 5)
    report = make_report(
        acme, status=Report.Status.PARSING, claimed_at=stale, attempts=settings.DISPATCHLAB_MAX_ATTEMPTS
    )
    assert report_analyze(report_id=report.id) == Outcome.FAILED
    report.refresh_from_db()
    assert report.error.startswith(f"gave up after {settings.DISPATCHLAB_MAX_ATTEMPTS} attempts")
    assert fake_core.calls == []


def test_analysing_a_deleted_or_finished_report_does_nothing(acme, make_report):
    assert report_analyze(report_id=987654) == Outcome.MISSING
    assert report_analyze(report_id=make_report(acme).id) == Outcome.SKIPPED


# ---------------------------------------------------------------- re-matching and recovery


def test_a_rematch_moves_the_report_to_its_new_group(acme, alice, make_upload, fake_core, make_document):
    report = _submitted(acme, alice, make_upload)
    report_analyze(report_id=report.id)
    old_group = FailureGroup.objects.get()
    fake_core.answer["document"] = make_document(fingerprint="a" * 16, failure_class="cuda_error")
    assert report_rematch(report_id=report.id)
    report.refresh_from_db()
    assert report.status == Report.Status.QUEUED and report.document is not None  # the old one stays readable
    report_analyze(report_id=report.id)
    report.refresh_from_db()
    assert report.group.fingerprint == "a" * 16
    assert not FailureGroup.objects.filter(id=old_group.id).exists()


def test_rematch_queues_only_reports_from_another_knowledge_base(
    acme, make_report, django_capture_on_commit_callbacks
):
    current = make_report(acme, kb_digest="new")
    outdated = make_report(acme, kb_digest="old")
    queued = make_report(acme, status=Report.Status.QUEUED)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert reports_rematch(project=acme, outdated_for="new") == 1
    assert len(callbacks) == 1
    statuses = dict(Report.objects.values_list("id", "status"))
    assert statuses == {current.id: "done", outdated.id: "queued", queued.id: "queued"}


def test_the_rematch_command_queues_done_reports(acme, umbrella, make_report):
    make_report(acme)
    make_report(umbrella)
    out = io.StringIO()
    call_command("rematch", "--project", "acme", "--all", stdout=out)
    assert "queued 1 report in Acme" in out.getvalue()
    assert Report.objects.filter(project=umbrella, status="done").exists()


def test_stuck_reports_are_sent_again(
    acme, make_report, settings, django_capture_on_commit_callbacks, monkeypatch
):
    sent: list[int] = []
    monkeypatch.setattr("dispatchlab.reports.submit._enqueue", sent.append)
    long_ago = timezone.now() - timedelta(seconds=settings.DISPATCHLAB_STALE_CLAIM_SECONDS + 5)
    lost = make_report(acme, status=Report.Status.QUEUED, enqueued_at=long_ago)
    make_report(acme, status=Report.Status.QUEUED, enqueued_at=timezone.now())  # just sent
    dead = make_report(acme, status=Report.Status.PARSING, claimed_at=long_ago)
    make_report(acme, status=Report.Status.PARSING, claimed_at=timezone.now())  # alive
    make_report(acme)
    with django_capture_on_commit_callbacks(execute=True):
        assert reports_requeue_stale() == 2
    assert sorted(sent) == sorted([lost.id, dead.id])


# ---------------------------------------------------------------- eager end to end, with the real core


def test_an_uploaded_crash_log_is_diagnosed(acme, alice, make_upload, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        report = report_create(project=acme, user=alice, files=[make_upload("server.log")])
    report.refresh_from_db()
    assert report.status == Report.Status.DONE, report.error
    assert report.failure_class == "oom"
    assert report.document["matches"][0]["failure_class"] == "oom"
    assert report.document["sources"][0]["name"] == "server.log"
    assert report.group is not None and report.group.count == 1


# ---------------------------------------------------------------- tokens and the first user


def test_a_token_is_stored_as_a_hash_only(acme, alice):
    token, key = apitoken_create(user=alice, project=acme)
    assert key.startswith("dl_") and key not in token.key_hash and token.prefix == key[:11]
    assert apitoken_authenticate(key=key) == token
    assert apitoken_authenticate(key=key + "x") is None
    assert apitoken_authenticate(key="nonsense") is None


def test_a_token_stops_working_when_its_user_leaves_the_project(acme, alice):
    _, key = apitoken_create(user=alice, project=acme)
    Membership.objects.filter(user=alice).delete()
    assert apitoken_authenticate(key=key) is None


def test_the_apitoken_command_prints_the_token_alone_on_its_last_line(db):
    out = io.StringIO()
    call_command("apitoken", "--user", "ci", "--project", "Nightly", "--create", "--read-only", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    token = apitoken_authenticate(key=key)
    assert token is not None and token.read_only and token.project.name == "Nightly"
    assert ApiToken.objects.count() == 1


def test_the_apitoken_command_refuses_unknown_users_without_create(acme):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("apitoken", "--user", "nobody", "--project", "Acme", stdout=io.StringIO())


def test_the_webhooksecret_command_prints_and_rotates_the_secret(acme):
    out = io.StringIO()
    call_command("webhooksecret", "--project", "acme", stdout=out)
    assert out.getvalue().strip().splitlines()[-1] == acme.webhook_secret
    out = io.StringIO()
    call_command("webhooksecret", "--project", "Acme", "--rotate", stdout=out)
    acme.refresh_from_db()
    assert out.getvalue().strip().splitlines()[-1] == acme.webhook_secret


def test_the_first_user_is_created_once(db):
    first = user_bootstrap(username="admin", password="", project_name="default")
    assert first is not None and first.password
    user = User.objects.get(username="admin")
    assert user.is_superuser and user.check_password(first.password)
    assert Membership.objects.filter(user=user, project=first.project).exists()
    assert user_bootstrap(username="admin") is None


def test_the_bootstrap_command_prints_the_login(db):
    out = io.StringIO()
    call_command("bootstrap", "--password", "s3cret-pass", stdout=out)
    text = out.getvalue()
    assert "login:    admin" in text and "password: s3cret-pass" in text
    assert "knowledge base:" in text


# ---------------------------------------------------------------- storage and the broker


def test_uploads_work_with_a_storage_that_has_no_local_paths(acme, alice, make_upload, settings, fake_core):
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {"BACKEND": "django.core.files.storage.InMemoryStorage"},
    }
    report = _submitted(acme, alice, make_upload)
    assert report_analyze(report_id=report.id) == Outcome.DONE
    # the core read a downloaded copy, named as uploaded
    assert fake_core.calls[0][0].endswith("/server.log")


def test_a_broker_that_is_down_leaves_the_upload_queued_for_the_sweep(
    acme, alice, make_upload, monkeypatch, django_capture_on_commit_callbacks, caplog
):
    from kombu.exceptions import OperationalError

    from dispatchlab.reports.tasks import report_analyze_task

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("Error 111 connecting to redis:6379. Connection refused.")

    monkeypatch.setattr(report_analyze_task, "delay", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        report = report_create(project=acme, user=alice, files=[make_upload()])
    report.refresh_from_db()
    assert report.status == Report.Status.QUEUED and report.files.count() == 1
    assert "Connection refused" in caplog.text


def test_uploading_a_failed_log_again_tries_it_again(
    acme, alice, make_upload, django_capture_on_commit_callbacks
):
    failed, _ = report_submit(project=acme, user=alice, files=[make_upload("core.log", b"\x00\x01" * 100)])
    Report.objects.filter(id=failed.id).update(status=Report.Status.FAILED, error="binary")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        again, created = report_submit(
            project=acme, user=alice, files=[make_upload("core.log", b"\x00\x01" * 100)]
        )
    assert not created and again.id == failed.id and again.status == Report.Status.QUEUED
    assert len(callbacks) == 1

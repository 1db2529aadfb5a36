"""Redacting a report's log: queued for a worker that runs the pattern in a child process under a time
limit, one redaction of a report at a time; every stored copy is replaced, the parse runs again and
tells no one; only members with write access may do it."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from django.core.files.storage import default_storage
from django.test import Client

from dispatchlab.core.redact import run
from dispatchlab.gpu.models import ConfirmOutput, ConfirmRun
from dispatchlab.notify.models import Delivery, Endpoint, Event
from dispatchlab.reports.accounts import apitoken_create
from dispatchlab.reports.models import FailureGroup, Redaction, Report
from dispatchlab.reports.redaction import RunOutcome, redaction_from, redaction_request, redaction_run
from dispatchlab.reports.submit import report_submit

SECRET = "hf_SeCrEtToKeN1234567890"
OTHER = "sk-OtHeRsEcReT0987654321"
CATASTROPHIC = "(a+)+$"


@pytest.fixture
def parsed(alice, acme, oom_log, make_upload, django_capture_on_commit_callbacks) -> Report:
    log = oom_log.replace(b"\n", f"\nHF_TOKEN={SECRET}\nOPENAI_KEY={OTHER}\n".encode(), 1)
    log += b"a" * 40 + b"!\n"
    with django_capture_on_commit_callbacks(execute=True):
        report, _ = report_submit(
            project=acme,
            user=alice,
            files=[make_upload(f"server-{SECRET}.log.gz", gzip.compress(log))],
            title=f"crash with {SECRET}",
            launch_command=f"HF_TOKEN={SECRET} python -m sglang.launch_server --model-path m",
        )
    report.refresh_from_db()
    assert report.status == Report.Status.DONE
    return report


def stored_text(report: Report) -> bytes:
    report.refresh_from_db()
    data = b"".join(default_storage.open(item.file.name).read() for item in report.files.all())
    return gzip.decompress(data) if data.startswith(b"\x1f\x8b") else data


def redact(client: Client, report: Report, key: str, body: dict, capture) -> dict:
    with capture(execute=True):
        response = client.post(
            f"/api/v1/reports/{report.id}/redact",
            body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {key}",
        )
    assert response.status_code == 202, response.content
    return response.json()


def test_a_member_redacts_a_pattern_from_the_api_and_the_parse_runs_again(
    parsed, alice, acme, django_capture_on_commit_callbacks
):
    old_names = [item.file.name for item in parsed.files.all()]
    assert SECRET.encode() in Path(parsed.text_path).read_bytes()
    _, key = apitoken_create(user=alice, project=acme)
    answer = redact(Client(), parsed, key, {"pattern": r"hf_\w+"}, django_capture_on_commit_callbacks)
    assert answer["redaction"]["status"] == "queued" and answer["redacted_lines"] is None
    parsed.refresh_from_db()
    assert parsed.status == Report.Status.DONE and parsed.document["failure_class"] == "oom"
    assert SECRET.encode() not in stored_text(parsed) and b"HF_TOKEN=[REDACTED]" in stored_text(parsed)
    assert SECRET.encode() not in Path(parsed.text_path).read_bytes()
    assert SECRET not in str(parsed.document)
    assert not any(default_storage.exists(name) for name in old_names)
    followed = Client().get(f"/api/v1/reports/{parsed.id}/redact", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert followed["redactions"] == [
        {**followed["redactions"][0], "status": "done", "redacted_lines": 1, "what": "a pattern"}
    ]


def test_the_secret_is_gone_from_the_title_launch_command_search_group_events_and_confirm_runs(
    parsed, alice, acme, django_capture_on_commit_callbacks
):
    group = FailureGroup.objects.get(id=parsed.group_id)
    FailureGroup.objects.filter(id=group.id).update(title=f"OOM near {SECRET}")
    endpoint = Endpoint.objects.create(
        project=acme, url="https://hooks.example.invalid/x", events=["group.new"]
    )
    event = Event.objects.create(
        project=acme,
        kind="group.new",
        group=group,
        payload={"report": {"id": parsed.id, "title": parsed.title}},
    )
    Delivery.objects.create(endpoint=endpoint, event=event, status=Delivery.Status.FAILED)
    confirm = ConfirmRun.objects.create(
        project=acme,
        report=parsed,
        queue="gpu",
        launcher="sglang",
        original_command=parsed.launch_command,
        env={"HF_TOKEN": SECRET},
        job={"env": {"HF_TOKEN": SECRET}},
    )
    output = ConfirmOutput.objects.create(confirm=confirm, seq=0, text=f"loading with token {SECRET}\n")
    _, key = apitoken_create(user=alice, project=acme)

    def found_by_search() -> bool:
        page = Client().get("/api/v1/reports", {"q": SECRET[:12]}, HTTP_AUTHORIZATION=f"Bearer {key}").json()
        return parsed.id in [item["id"] for item in page["results"]]

    assert found_by_search()

    redact(Client(), parsed, key, {"pattern": r"hf_\w+"}, django_capture_on_commit_callbacks)

    parsed.refresh_from_db()
    confirm.refresh_from_db()
    output.refresh_from_db()
    event.refresh_from_db()
    assert SECRET not in parsed.title and SECRET not in parsed.launch_command
    assert all(SECRET not in item.original_name for item in parsed.files.all())
    assert all(SECRET not in item.file.name for item in parsed.files.all())
    assert SECRET not in str(FailureGroup.objects.filter(project=acme).values_list("title", flat=True))
    assert SECRET not in str(event.payload)
    assert (
        SECRET not in str((confirm.original_command, confirm.env, confirm.job)) and SECRET not in output.text
    )
    assert Redaction.objects.get(report=parsed).pattern == ""  # the pattern spells the secret: not kept
    assert not found_by_search()


def test_the_re_parse_after_a_redaction_notifies_no_endpoint(
    parsed, alice, acme, django_capture_on_commit_callbacks
):
    Endpoint.objects.create(project=acme, url="https://hooks.example.invalid/x", events=["group.new"])
    FailureGroup.objects.all().delete()  # the re-parse would make a new group: that is no news
    _, key = apitoken_create(user=alice, project=acme)
    redact(Client(), parsed, key, {"pattern": r"hf_\w+"}, django_capture_on_commit_callbacks)
    parsed.refresh_from_db()
    assert parsed.status == Report.Status.DONE and parsed.group_id is not None
    assert not Event.objects.filter(project=acme).exists()


def test_a_backtracking_pattern_is_stopped_and_the_redaction_refused_saying_it_ran_too_long(
    parsed, alice, acme, settings, django_capture_on_commit_callbacks
):
    settings.DISPATCHLAB_REDACT_TIME_LIMIT = 1
    _, key = apitoken_create(user=alice, project=acme)
    redact(Client(), parsed, key, {"pattern": CATASTROPHIC}, django_capture_on_commit_callbacks)
    redaction = Redaction.objects.get(report=parsed)
    assert redaction.status == Redaction.Status.REFUSED and "ran longer than 1 s" in redaction.reason
    assert SECRET.encode() in stored_text(parsed)  # nothing was half-done


def test_the_second_of_two_quick_redactions_waits_for_the_first_and_both_hold(
    parsed, alice, django_capture_on_commit_callbacks
):
    first = redaction_request(report=parsed, spec=redaction_from(pattern=r"hf_\w+"), user=alice)
    second = redaction_request(report=parsed, spec=redaction_from(pattern=r"sk-\w+"), user=alice)
    assert redaction_run(redaction_id=second.id) == RunOutcome.WAITING  # the first goes first
    with django_capture_on_commit_callbacks(execute=True):
        assert redaction_run(redaction_id=first.id) == RunOutcome.DONE
    assert redaction_run(redaction_id=second.id) == RunOutcome.DONE
    text = stored_text(parsed)
    assert SECRET.encode() not in text and OTHER.encode() not in text


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
    assert "lines 2-2" in alice_client.get(f"/reports/{parsed.id}/redact/").content.decode()


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
    assert SECRET.encode() in stored_text(parsed) and not Redaction.objects.exists()


def test_an_outsider_sees_no_such_report(parsed, charlie_client):
    assert (
        charlie_client.post(f"/reports/{parsed.id}/redact/", {"mode": "lines", "first_line": "1"}).status_code
        == 404
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"pattern": "("}, "not a regular expression"),
        ({"pattern": "x" * 501}, "at most 500 characters"),
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


def test_a_pattern_matching_empty_text_is_refused_by_the_worker(
    parsed, alice, acme, django_capture_on_commit_callbacks
):
    _, key = apitoken_create(user=alice, project=acme)
    redact(Client(), parsed, key, {"pattern": "x*"}, django_capture_on_commit_callbacks)
    redaction = Redaction.objects.get(report=parsed)
    assert redaction.status == Redaction.Status.REFUSED and "matches empty text" in redaction.reason


def test_a_redaction_of_a_report_being_parsed_waits_for_the_parse(parsed, alice):
    Report.objects.filter(id=parsed.id).update(status=Report.Status.PARSING)
    redaction = redaction_request(report=parsed, spec=redaction_from(pattern="hf_"), user=alice)
    assert redaction_run(redaction_id=redaction.id) == RunOutcome.WAITING
    Report.objects.filter(id=parsed.id).update(status=Report.Status.DONE)
    assert redaction_run(redaction_id=redaction.id) == RunOutcome.DONE


def test_the_child_blanks_a_line_range_in_derived_texts_too(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(f"start\nexport HF_TOKEN={SECRET}\nend\n")
    answer = run(
        {
            "first_line": 2,
            "last_line": 2,
            "paths": [str(log)],
            "target": str(tmp_path / "out.log"),
            "max_expanded_bytes": 10**9,
            "values": {"title": f"HF_TOKEN={SECRET}", "output": f"x\nexport HF_TOKEN={SECRET}\ny"},
        }
    )
    assert answer["ok"] and answer["changed"] == 1
    assert SECRET not in str(answer["values"]) and SECRET not in (tmp_path / "out.log").read_text()

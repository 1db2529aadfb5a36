"""Decision records as alice (member of acme), bob (acme viewer) and charlie (umbrella only) meet them:
on top of the reports where a failure recurs, going stale when a log passes their revisit-when condition,
their pages, forms and history."""

from __future__ import annotations

import copy
import functools
import html
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dispatchlab.core import analyze_paths
from dispatchlab.decisions import services
from dispatchlab.decisions.models import Decision, DecisionEdit
from dispatchlab.decisions.services import (
    decision_create,
    decision_update,
    decisions_report_parsed,
)
from dispatchlab.decisions.validation import DecisionInvalid
from dispatchlab.reports.models import Report
from dispatchlab.reports.submit import report_submit
from dispatchlab.reports.tasks import report_analyze_task

CANONICAL = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "sglang_dsv4_eagle_sm120.log"
TOP = "spec-draft-mxfp4-trtllm-moe-non-sm100"
SECOND = "trtllm-gen-moe-on-non-sm100"
TITLE = "MTP off on sm_120 until flashinfer ships SM120 trtllm-gen kernels"


@functools.cache
def _canonical() -> dict[str, Any]:
    return analyze_paths([CANONICAL])


def canonical(**versions: str) -> dict[str, Any]:
    """The seed case (DSv4 NVFP4 + EAGLE on sm_120, flashinfer 0.6.3), with other versions if given."""
    document = copy.deepcopy(_canonical())
    document["versions"].update(versions)
    return document


@pytest.fixture
def record(alice, acme, django_capture_on_commit_callbacks):
    """record(**fields) -> a decision of acme by alice, its documents refreshed as after the commit."""

    def make(project: Any = None, user: Any = None, **data: Any) -> Decision:
        data.setdefault("title", TITLE)
        with django_capture_on_commit_callbacks(execute=True):
            return decision_create(project=project or acme, user=user or alice, data=data)

    return make


@pytest.fixture
def edit(alice, django_capture_on_commit_callbacks):
    def change(decision: Decision, user: Any = None, **data: Any) -> Decision:
        with django_capture_on_commit_callbacks(execute=True):
            return decision_update(decision=decision, user=user or alice, data=data)

    return change


@pytest.fixture
def stale_calls(monkeypatch) -> list[Decision]:
    calls: list[Decision] = []
    monkeypatch.setattr(services, "on_stale", calls.append)
    return calls


def parsed(report: Report, capture: Any) -> Report:
    """What the pipeline's hook does once the report is parsed."""
    with capture(execute=True):
        decisions_report_parsed(report_id=report.id)
    report.refresh_from_db()
    return report


class Tags(HTMLParser):
    """The elements of an HTML fragment, as a browser would build them: (tag, attributes)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, attrs))


def banner(page: str) -> str:
    """The decisions banner of a page, or ""."""
    found = re.search(r'<section class="decisions-banner[^"]*" id="decisions".*?</section>', page, re.S)
    return html.unescape(found.group(0)) if found else ""


# ---------------------------------------------------------------- where failures recur


def test_a_record_linked_to_a_failure_group_appears_on_top_of_a_new_report_with_that_fingerprint(
    alice_client, acme, make_report, record, django_capture_on_commit_callbacks
):
    decision = record(status="accepted", links={"groups": [canonical()["fingerprint"]]})
    report = parsed(make_report(acme, document=canonical()), django_capture_on_commit_callbacks)

    page = alice_client.get(reverse("front:report", args=[report.id])).content.decode()
    today = timezone.now().date().isoformat()
    sentence = f"Accepted {today}: {TITLE}, DR-1"
    assert sentence in banner(page)
    assert f'href="{reverse("front:decision", args=[decision.id])}"' in banner(page)
    # above the diagnosis
    assert page.index('id="decisions"') < page.index('id="diagnosis"')
    ref = {
        "id": decision.id,
        "number": 1,
        "title": TITLE,
        "status": "accepted",
        "stale": False,
        "stale_reason": None,
        "status_since": today,
    }
    assert report.document["decisions"] == [ref]


def test_an_uploaded_log_gets_its_decisions_from_the_parse_pipeline(
    alice, acme, record, client, django_capture_on_commit_callbacks
):
    from dispatchlab.reports.accounts import apitoken_create

    decision = record(status="accepted", links={"signatures": [TOP]})
    upload = SimpleUploadedFile("server.log", CANONICAL.read_bytes(), content_type="text/plain")
    with django_capture_on_commit_callbacks(execute=False):
        report, _ = report_submit(project=acme, user=alice, files=[upload])
    with django_capture_on_commit_callbacks(execute=True):
        report_analyze_task.apply(args=[report.id])
    key = apitoken_create(user=alice, project=acme, read_only=True)[1]
    document = client.get(f"/api/v1/reports/{report.id}", HTTP_AUTHORIZATION=f"Bearer {key}").json()[
        "document"
    ]
    assert [ref["id"] for ref in document["decisions"]] == [decision.id]
    assert document["matches"][0]["id"] == TOP and document["matches"][0]["decisions"][0]["number"] == 1


def test_a_record_on_a_lower_match_shows_in_that_matchs_decisions_not_on_top(
    acme, make_report, record, alice_client, django_capture_on_commit_callbacks
):
    report = make_report(acme, document=canonical())
    decision = record(links={"signatures": [SECOND]})  # the record comes after the report: a refresh
    report.refresh_from_db()
    assert report.document["decisions"] == []
    (second,) = [m for m in report.document["matches"] if m["id"] == SECOND]
    assert [ref["id"] for ref in second["decisions"]] == [decision.id]
    assert "DR-1" not in banner(alice_client.get(reverse("front:report", args=[report.id])).content.decode())


def test_editing_a_record_refreshes_the_documents_it_was_and_is_linked_to(acme, make_report, record, edit):
    report = make_report(acme, document=canonical())
    decision = record(links={"reports": [report.id]})
    edit(decision, title="MTP off on sm_120 for now", status="accepted")
    report.refresh_from_db()
    (ref,) = report.document["decisions"]
    assert ref["title"] == "MTP off on sm_120 for now" and ref["status"] == "accepted"
    edit(decision, links={"reports": []})
    report.refresh_from_db()
    assert report.document["decisions"] == []


def test_another_projects_record_never_reaches_a_report(acme, umbrella, charlie, make_report, record):
    report = make_report(acme, document=canonical())
    record(project=umbrella, user=charlie, links={"groups": [report.fingerprint], "signatures": [TOP]})
    report.refresh_from_db()
    assert report.document.get("decisions", []) == []


def test_the_group_page_shows_the_records_of_its_fingerprint_and_signature(
    acme, make_report, record, alice_client, bob_client, charlie_client, django_capture_on_commit_callbacks
):
    from dispatchlab.reports.models import FailureGroup

    report = make_report(acme, document=canonical())
    group = FailureGroup.objects.create(
        project=acme, fingerprint=report.fingerprint, title="draft MoE", count=1
    )
    Report.objects.filter(id=report.id).update(group=group)
    record(title="By fingerprint", links={"groups": [report.fingerprint]})
    record(title="By signature", status="accepted", links={"signatures": [TOP]})
    page = banner(alice_client.get(reverse("front:group", args=[group.id])).content.decode())
    assert page.index("By signature, DR-2") < page.index("By fingerprint, DR-1")  # accepted first
    assert f"{reverse('front:decision_new')}?group={group.id}" in page
    assert "Record a decision" not in banner(
        bob_client.get(reverse("front:group", args=[group.id])).content.decode()
    )
    assert charlie_client.get(reverse("front:group", args=[group.id])).status_code == 404


# ---------------------------------------------------------------- revisit-when and staleness


def test_a_report_showing_a_version_past_revisit_when_marks_the_record_stale_with_the_reason_and_calls_on_stale_once(
    acme, make_report, record, stale_calls, alice_client, django_capture_on_commit_callbacks
):
    decision = record(status="accepted", links={"signatures": [TOP]}, revisit_when={"flashinfer": ">=0.7"})
    before = parsed(make_report(acme, document=canonical()), django_capture_on_commit_callbacks)  # 0.6.3
    decision.refresh_from_db()
    assert decision.stale is False and before.document["decisions"][0]["stale"] is False

    report = parsed(
        make_report(acme, document=canonical(flashinfer="0.7.1")), django_capture_on_commit_callbacks
    )
    parsed(make_report(acme, document=canonical(flashinfer="0.7.2")), django_capture_on_commit_callbacks)

    decision.refresh_from_db()
    reason = f"report {report.id} shows flashinfer 0.7.1, which matches flashinfer>=0.7"
    assert (
        decision.stale is True and decision.stale_reason == reason and decision.stale_report_id == report.id
    )
    assert [d.id for d in stale_calls] == [decision.id]
    # every document that lists the record now says so, the older report's too
    before.refresh_from_db()
    assert before.document["decisions"][0]["stale"] is True
    assert before.document["decisions"][0]["stale_reason"] == reason
    page = banner(alice_client.get(reverse("front:report", args=[before.id])).content.decode())
    assert "stale" in page and reason in page
    (entry,) = DecisionEdit.objects.filter(decision=decision, kind="stale")
    assert entry.user is None and entry.changes["stale_reason"]["to"] == reason


def test_any_log_of_the_project_makes_a_record_stale_not_only_linked_ones(
    acme, umbrella, make_report, record, stale_calls, django_capture_on_commit_callbacks
):
    decision = record(links={"signatures": ["some-other-signature"]}, revisit_when={"sglang": ">0.5.8"})
    parsed(make_report(umbrella, document=canonical()), django_capture_on_commit_callbacks)  # another project
    decision.refresh_from_db()
    assert decision.stale is False
    report = parsed(make_report(acme, document=canonical()), django_capture_on_commit_callbacks)
    decision.refresh_from_db()
    assert decision.stale_reason == f"report {report.id} shows sglang 0.5.9, which matches sglang>0.5.8"


def test_a_new_condition_clears_the_staleness_and_is_checked_against_the_logs_already_there(
    acme, make_report, record, edit, stale_calls, django_capture_on_commit_callbacks
):
    report = parsed(make_report(acme, document=canonical()), django_capture_on_commit_callbacks)
    decision = record(links={"signatures": [TOP]}, revisit_when={"flashinfer": ">=0.6"})
    decision.refresh_from_db()
    assert decision.stale and decision.stale_reason.startswith(f"report {report.id} shows flashinfer 0.6.3")
    edit(decision, revisit_when={"flashinfer": ">=0.7"})
    decision.refresh_from_db()
    assert decision.stale is False and decision.stale_reason == ""
    report.refresh_from_db()
    assert report.document["decisions"][0]["stale"] is False
    assert len(stale_calls) == 1
    last = DecisionEdit.objects.filter(decision=decision).last()
    assert last.changes["stale"] == {"from": True, "to": False}


def test_a_superseded_record_does_not_turn_stale(
    acme, make_report, record, stale_calls, django_capture_on_commit_callbacks
):
    newer = record(title="Use a BF16 draft")
    old = record(status="superseded", superseded_by=newer.id, revisit_when={"flashinfer": ">=0.6"})
    parsed(make_report(acme, document=canonical()), django_capture_on_commit_callbacks)
    old.refresh_from_db()
    assert old.stale is False and stale_calls == []


# ---------------------------------------------------------------- history


def test_the_history_lists_each_edits_changed_fields(alice, bob, acme, record, edit, alice_client):
    decision = record(context="first context", revisit_when={"flashinfer": ">=0.7"})
    edit(decision, title="MTP off on sm_120", status="accepted")
    edit(
        decision,
        alternatives=[{"what": "`--speculative-moe-runner-backend triton`", "outcome": "same crash"}],
    )
    edit(decision, title="MTP off on sm_120")  # no change: no entry

    kinds = list(DecisionEdit.objects.filter(decision=decision).values_list("kind", flat=True))
    assert kinds == ["created", "edited", "edited"]
    first, second = DecisionEdit.objects.filter(decision=decision, kind="edited")
    assert first.changes == {
        "title": {"from": TITLE, "to": "MTP off on sm_120"},
        "status": {"from": "proposed", "to": "accepted"},
    }
    assert set(second.changes) == {"alternatives"} and first.user == alice

    page = alice_client.get(reverse("front:decision", args=[decision.id])).content.decode()
    history = html.unescape(page[page.index('id="history"') :])
    assert history.count('class="history-entry') == 3
    assert "proposed" in history and "accepted" in history and "alternatives tried" in history
    assert "by alice" in history


def test_the_status_date_follows_the_last_status_change(acme, record, edit):
    decision = record()
    Decision.objects.filter(id=decision.id).update(
        status_changed_at=timezone.now() - timezone.timedelta(days=30)
    )
    edit(Decision.objects.get(id=decision.id), status="accepted")
    assert Decision.objects.get(id=decision.id).status_changed_at.date() == timezone.now().date()


# ---------------------------------------------------------------- Markdown


def test_markdown_with_script_and_javascript_links_is_inert(record, alice_client):
    decision = record(
        context="**bold** <script>alert(1)</script> [click](javascript:alert(1)) <img src=x onerror=alert(2)>",
        decision="[upstream](https://github.com/flashinfer-ai/flashinfer/issues/1) and `code`",
        consequences='<a href="javascript:alert(3)">x</a> [y](JaVaScRiPt:alert(4))',
    )
    page = alice_client.get(reverse("front:decision", args=[decision.id])).content.decode()
    body = page[page.index('id="context"') : page.index('id="alternatives"')]
    tags = Tags()
    tags.feed(body)
    assert "<strong>bold</strong>" in body and "<code>code</code>" in body
    assert not {"script", "img"} & {tag for tag, _ in tags.found}
    assert not [name for _, attrs in tags.found for name, _ in attrs if name.startswith("on")]
    hrefs = [value for tag, attrs in tags.found if tag == "a" for name, value in attrs if name == "href"]
    assert hrefs == ["https://github.com/flashinfer-ai/flashinfer/issues/1"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body  # shown as the text people typed


def test_only_http_links_are_upstream_issues(record):
    with pytest.raises(DecisionInvalid) as invalid:
        record(links={"upstream": ["javascript:alert(1)", "https://github.com/sgl-project/sglang/issues/1"]})
    assert list(invalid.value.message_dict) == ["links.upstream"]
    assert "is not an http(s) URL" in invalid.value.message_dict["links.upstream"][0]


# ---------------------------------------------------------------- pages and forms


def test_record_a_decision_on_a_report_prefills_title_alternatives_and_links(
    acme, make_report, alice_client, bob_client
):
    report = make_report(acme, document=canonical())
    page = alice_client.get(reverse("front:report", args=[report.id])).content.decode()
    url = f"{reverse('front:decision_new')}?report={report.id}"
    assert f'href="{url}"' in page.replace("&amp;", "&")
    form = html.unescape(alice_client.get(url).content.decode())
    assert f'value="{report.document["matches"][0]["title"]}"' in form
    assert 'value="--speculative-moe-runner-backend triton"' in form
    assert "The draft's MXFP4 quant method picks its kernel below the runner-backend setting" in form
    links = {
        name: re.search(rf'name="links_{name}"[^>]*>([^<]*)<', form).group(1)
        for name in ("groups", "signatures", "reports")
    }
    assert links == {"groups": report.fingerprint, "signatures": TOP, "reports": str(report.id)}
    # a viewer reads reports but records nothing
    assert (
        "Record a decision" not in bob_client.get(reverse("front:report", args=[report.id])).content.decode()
    )
    assert bob_client.get(url).status_code == 403


def test_the_form_records_a_decision_and_needs_the_csrf_token(alice, acme, make_report):
    report = make_report(acme, document=canonical())
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    url = reverse("front:decision_new")
    fields = {
        "project": "acme",
        "title": TITLE,
        "status": "accepted",
        "decision": "Launch without `--speculative-algorithm`.",
        "alt_what": ["--speculative-moe-runner-backend triton", ""],
        "alt_outcome": ["same crash", ""],
        "links_groups": report.fingerprint,
        "links_signatures": TOP,
        "links_reports": str(report.id),
        "links_upstream": "https://github.com/flashinfer-ai/flashinfer/issues/2000",
        "revisit_when": "flashinfer >=0.7\nsglang: >0.5.23",
    }
    assert client.post(url, fields).status_code == 403  # no token
    client.get(f"{url}?report={report.id}")
    response = client.post(url, {**fields, "csrfmiddlewaretoken": client.cookies["csrftoken"].value})
    decision = Decision.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse(
        "front:decision", args=[decision.id]
    )
    assert decision.number == 1 and decision.status == "accepted" and decision.author == alice
    assert decision.alternatives == [
        {"what": "--speculative-moe-runner-backend triton", "outcome": "same crash"}
    ]
    assert decision.revisit_when == {"flashinfer": ">=0.7", "sglang": ">0.5.23"}
    page = html.unescape(client.get(response["Location"]).content.decode())
    assert "DR-1 recorded." in page and "flashinfer>=0.7" in page
    assert (
        '<a href="https://github.com/flashinfer-ai/flashinfer/issues/2000" rel="noreferrer noopener nofollow">'
        in page
    )


def test_the_form_says_what_is_wrong_by_field(alice_client, acme):
    response = alice_client.post(
        reverse("front:decision_new"),
        {
            "project": "acme",
            "title": "",
            "revisit_when": "flashinfer >=0.7-x\nnumpy >=2",
            "links_reports": "99999",
        },
    )
    assert response.status_code == 400
    page = html.unescape(response.content.decode())
    assert "title" in page and "is required" in page
    assert "flashinfer: '>=0.7-x' is not a PEP 440 specifier" in page
    assert "numpy: unknown package 'numpy'" in page
    assert "project acme has no report 99999" in page
    assert 'name="revisit_when"' in page and "numpy >=2" in page  # what was typed stays
    assert not Decision.objects.exists()


def test_editing_through_the_form_keeps_the_history(alice_client, record):
    decision = record(status="proposed", revisit_when={"flashinfer": ">=0.7"})
    form = html.unescape(
        alice_client.get(reverse("front:decision_edit", args=[decision.id])).content.decode()
    )
    assert f'value="{TITLE}"' in form and "flashinfer >=0.7" in form
    response = alice_client.post(
        reverse("front:decision_edit", args=[decision.id]),
        {"title": TITLE, "status": "accepted", "revisit_when": "flashinfer >=0.7"},
    )
    assert response.status_code == 302
    (entry,) = DecisionEdit.objects.filter(decision=decision, kind="edited")
    assert entry.changes == {"status": {"from": "proposed", "to": "accepted"}}


def test_viewers_read_records_and_outsiders_get_404(record, alice_client, bob_client, charlie_client):
    decision = record()
    detail = reverse("front:decision", args=[decision.id])
    edit_url = reverse("front:decision_edit", args=[decision.id])
    assert bob_client.get(detail).status_code == 200
    assert f'href="{edit_url}"' not in bob_client.get(detail).content.decode()
    assert f'href="{edit_url}"' in alice_client.get(detail).content.decode()
    assert bob_client.get(edit_url).status_code == 403
    assert bob_client.post(edit_url, {"title": "x", "status": "accepted"}).status_code == 403
    assert (
        bob_client.post(reverse("front:decision_new"), {"project": "acme", "title": "x"}).status_code == 403
    )
    for url in (detail, edit_url):
        assert charlie_client.get(url).status_code == 404
    assert charlie_client.post(edit_url, {"title": "x"}).status_code == 404
    assert TITLE not in charlie_client.get(reverse("front:decisions")).content.decode()


def test_the_list_filters_by_status_and_staleness(record, alice_client, client):
    record(title="Accepted one", status="accepted")
    stale = record(title="Stale one")
    Decision.objects.filter(id=stale.id).update(stale=True, stale_reason="report 1 shows torch 2.10")
    url = reverse("front:decisions")
    assert client.get(url).status_code == 302  # login first
    everything = alice_client.get(url).content.decode()
    assert "Accepted one" in everything and "Stale one" in everything
    accepted = alice_client.get(url, {"status": "accepted"}).content.decode()
    assert "Accepted one" in accepted and "Stale one" not in accepted
    only_stale = alice_client.get(url, {"stale": "yes"}).content.decode()
    assert "Stale one" in only_stale and "Accepted one" not in only_stale
    assert 'href="/decisions/"' in everything  # the nav link


def test_numbers_are_a_sequence_per_project(acme, umbrella, charlie, record):
    assert [record().number for _ in range(3)] == [1, 2, 3]
    assert record(project=umbrella, user=charlie).number == 1

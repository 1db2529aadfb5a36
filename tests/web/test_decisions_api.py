"""The decision records' JSON API (docs/contract.md) as alice (member of acme), bob (acme viewer), a read-only
token, charlie (umbrella only) and nobody call it; the export that `dispatchlab match --decisions` reads."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from dispatchlab.core.decisions import attach_decisions, load_decisions
from dispatchlab.decisions.models import Decision
from dispatchlab.reports.accounts import apitoken_create
from tests.web.test_decisions import TITLE, TOP, canonical, parsed

URL = "/api/v1/decisions"
CONTRACT_FIELDS = {
    "id",
    "number",
    "title",
    "status",
    "context",
    "decision",
    "consequences",
    "alternatives",
    "links",
    "revisit_when",
    "stale",
    "stale_reason",
    "author",
    "created",
    "updated",
}
RECORD = {
    "title": TITLE,
    "status": "accepted",
    "context": "The draft's MXFP4 MoE dispatches to SM100-only trtllm-gen kernels on sm_120.",
    "decision": "Launch without `--speculative-algorithm` on sm_120.",
    "consequences": "About 30% lower decode throughput until then.",
    "alternatives": [
        {
            "what": "`--speculative-moe-runner-backend triton`",
            "outcome": "same crash, the draft's MXFP4 quant method ignores it",
        }
    ],
    "links": {
        "groups": ["2fbe92b07ed61262"],
        "signatures": [TOP],
        "upstream": ["https://github.com/flashinfer-ai/flashinfer/issues/2000"],
    },
    "revisit_when": {"flashinfer": ">=0.7", "sglang": ">0.5.23"},
}


def bearer(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def alice_key(alice, acme) -> str:
    return apitoken_create(user=alice, project=acme)[1]


@pytest.fixture
def reader_key(alice, acme) -> str:
    return apitoken_create(user=alice, project=acme, read_only=True)[1]


@pytest.fixture
def bob_key(bob, acme) -> str:
    return apitoken_create(user=bob, project=acme)[1]


@pytest.fixture
def charlie_key(charlie, umbrella) -> str:
    return apitoken_create(user=charlie, project=umbrella)[1]


@pytest.fixture
def api(client, django_capture_on_commit_callbacks):
    """api(method, path, key, body) -> response; committed work (document refreshes) runs."""

    def call(method: str, path: str, key: str | None = None, body: Any = None, **params: Any) -> Any:
        headers = bearer(key) if key else {}
        with django_capture_on_commit_callbacks(execute=True):
            if method == "get":
                return client.get(path, params, **headers)
            data = body if isinstance(body, bytes | str) else json.dumps(body)
            return getattr(client, method)(path, data=data, content_type="application/json", **headers)

    return call


@pytest.fixture
def created(api, alice_key) -> dict[str, Any]:
    response = api("post", URL, alice_key, RECORD)
    assert response.status_code == 201, response.content
    return response.json()


def test_a_member_records_a_decision_in_the_contract_shape(created, alice_key, api):
    assert set(created) >= CONTRACT_FIELDS
    assert created["number"] == 1 and created["label"] == "DR-1" and created["project"] == "acme"
    assert created["links"] == {**RECORD["links"], "reports": []}
    assert created["revisit_when"] == RECORD["revisit_when"]
    assert created["alternatives"] == RECORD["alternatives"]
    assert created["stale"] is False and created["stale_reason"] is None and created["author"] == "alice"
    assert api("get", f"{URL}/{created['id']}", alice_key).json() == created
    assert api("post", URL, alice_key, {"title": "second"}).json()["number"] == 2


def test_a_bad_record_comes_back_with_what_is_wrong_by_field(api, alice_key):
    response = api(
        "post",
        URL,
        alice_key,
        {
            "title": "",
            "status": "done",
            "alternatives": [{"what": "", "result": "x"}],
            "links": {"upstream": ["javascript:alert(1)"], "reports": [123456], "issues": []},
            "revisit_when": {"flashinfer": ">=0.7-x", "numpy": ">=2", "torch": "===nightly"},
            "priority": "high",
            "number": 7,
        },
    )
    assert response.status_code == 400
    fields = response.json()["fields"]
    assert set(fields) == {"number"}  # the server's own fields are refused first
    response = api(
        "post",
        URL,
        alice_key,
        {
            "title": "",
            "status": "done",
            "alternatives": [{"what": "", "result": "x"}],
            "links": {"upstream": ["javascript:alert(1)"], "reports": [123456], "issues": []},
            "revisit_when": {"flashinfer": ">=0.7-x", "numpy": ">=2", "torch": "===nightly"},
            "priority": "high",
        },
    )
    fields = response.json()["fields"]
    assert fields["title"] == ["is required"]
    assert "must be one of proposed, accepted, rejected, superseded" in fields["status"][0]
    assert "unknown key result" in fields["alternatives[0]"][0] and fields["alternatives[0].what"] == [
        "is required"
    ]
    assert "'javascript:alert(1)' is not an http(s) URL" in fields["links.upstream"][0]
    assert fields["links.reports"] == ["project acme has no report 123456"]
    assert "unknown kind issues" in fields["links"][0]
    assert "is not a PEP 440 specifier" in fields["revisit_when.flashinfer"][0]
    assert "unknown package 'numpy'" in fields["revisit_when.numpy"][0]
    assert "cannot be checked against logs" in fields["revisit_when.torch"][0]
    assert "unknown field" in fields["priority"][0]
    assert not Decision.objects.exists()
    assert api("post", URL, alice_key, b"{not json").json()["error"].startswith("the body is not JSON")


def test_a_superseded_record_names_its_successor(api, alice_key, created):
    response = api("post", URL, alice_key, {"title": "old", "status": "superseded"})
    assert (
        response.status_code == 400
        and "names the record that replaces it" in response.json()["fields"]["superseded_by"][0]
    )
    old = api(
        "post", URL, alice_key, {"title": "old", "status": "superseded", "superseded_by": created["id"]}
    ).json()
    assert old["superseded_by"] == created["id"]
    cycle = api("patch", f"{URL}/{created['id']}", alice_key, {"superseded_by": old["id"]})
    assert cycle.status_code == 400 and "a cycle" in cycle.json()["fields"]["superseded_by"][0]
    revived = api("patch", f"{URL}/{old['id']}", alice_key, {"status": "proposed"}).json()
    assert revived["status"] == "proposed" and revived["superseded_by"] is None


def test_a_member_edits_and_the_history_lists_each_edits_changed_fields(api, alice_key, created):
    path = f"{URL}/{created['id']}"
    changed = api("patch", path, alice_key, {"status": "rejected", "links": {"upstream": []}})
    assert changed.status_code == 200
    body = changed.json()
    assert (
        body["status"] == "rejected"
        and body["links"]["upstream"] == []
        and body["links"]["signatures"] == [TOP]
    )
    # a record sent back as GET gave it, with one change, is that one change
    api("patch", path, alice_key, {**body, "title": "MTP off on sm_120"})
    history = api("get", f"{path}/history", alice_key).json()
    assert history["count"] == 3 and [e["kind"] for e in history["results"]] == [
        "created",
        "edited",
        "edited",
    ]
    assert (
        history["results"][0]["user"] == "alice" and history["results"][0]["changes"]["title"]["to"] == TITLE
    )
    assert history["results"][1]["changes"] == {
        "status": {"from": "accepted", "to": "rejected"},
        "links.upstream": {"from": RECORD["links"]["upstream"], "to": []},
    }
    assert history["results"][2]["changes"] == {"title": {"from": TITLE, "to": "MTP off on sm_120"}}


def test_staleness_is_set_by_logs_not_by_a_patch(api, alice_key, created):
    response = api("patch", f"{URL}/{created['id']}", alice_key, {"stale": True})
    assert response.status_code == 400
    assert "change revisit_when to clear it" in response.json()["fields"]["stale"][0]


def test_a_viewer_and_a_read_only_token_only_read(
    api, created, bob_key, reader_key, bob, django_capture_on_commit_callbacks
):
    path = f"{URL}/{created['id']}"
    for key in (bob_key, reader_key):
        assert api("get", path, key).status_code == 200
        assert api("get", URL, key).json()["count"] == 1
        assert api("get", f"{path}/history", key).status_code == 200
        assert api("patch", path, key, {"title": "x"}).status_code == 403
        assert api("post", URL, key, {"title": "x"}).status_code == 403
    assert api("post", URL, reader_key, {"title": "x"}).json()["error"] == "this token is read-only"
    session = Client()
    session.force_login(bob)
    assert session.get(path).status_code == 200
    assert session.patch(path, data='{"title": "x"}', content_type="application/json").status_code == 403
    assert Decision.objects.get().title == TITLE


def test_a_session_write_needs_the_csrf_token(alice, created):
    session = Client(enforce_csrf_checks=True)
    session.force_login(alice)
    path = f"{URL}/{created['id']}"
    response = session.patch(path, data='{"title": "x"}', content_type="application/json")
    assert response.status_code == 403 and "CSRF" in response.json()["error"]


def test_another_projects_user_gets_404_and_sees_none(api, created, charlie_key, charlie):
    path = f"{URL}/{created['id']}"
    assert api("get", path, charlie_key).status_code == 404
    assert api("patch", path, charlie_key, {"title": "x"}).status_code == 404
    assert api("get", f"{path}/history", charlie_key).status_code == 404
    assert api("get", URL, charlie_key).json() == {"results": [], "count": 0, "next": None, "previous": None}
    assert api("get", URL, charlie_key, project="acme").status_code == 404
    assert api("post", URL, charlie_key, {"title": "x", "project": "acme"}).status_code == 404
    assert api("post", URL, charlie_key, {"title": "in umbrella"}).json()["project"] == "umbrella"


def test_nobody_gets_401(api, created):
    for method, path in (
        ("get", URL),
        ("post", URL),
        ("get", f"{URL}/{created['id']}"),
        ("patch", f"{URL}/{created['id']}"),
    ):
        response = api(method, path, None, {"title": "x"})
        assert response.status_code == 401 and response["WWW-Authenticate"] == "Bearer"
    assert api("get", f"{URL}/{created['id']}/history").status_code == 401


def test_the_list_is_paginated(api, alice_key):
    for n in range(25):
        api("post", URL, alice_key, {"title": f"record {n}"})
    first = api("get", URL, alice_key, limit=10).json()
    assert first["count"] == 25 and len(first["results"]) == 10
    assert [r["number"] for r in first["results"]] == list(range(25, 15, -1))  # newest first
    assert first["previous"] is None and "page=2" in first["next"] and "limit=10" in first["next"]
    second = Client().get(first["next"], **bearer(alice_key)).json()
    assert [r["number"] for r in second["results"]] == list(range(15, 5, -1))
    last = api("get", URL, alice_key, limit=10, page=3).json()
    assert len(last["results"]) == 5 and last["next"] is None
    assert api("get", URL, alice_key, page=9).json()["results"] == []
    assert len(api("get", URL, alice_key, limit=1000).json()["results"]) == 25  # at most 100 a page
    for bad in (
        {"page": "0"},
        {"page": "x"},
        {"limit": "-1"},
        {"status": "done"},
        {"stale": "maybe"},
        {"format": "csv"},
    ):
        response = api("get", URL, alice_key, **bad)
        assert response.status_code == 400 and response.json()["error"]


def test_the_list_filters_by_status_staleness_and_link(api, alice_key, created):
    api("post", URL, alice_key, {"title": "proposed one"})
    Decision.objects.filter(id=created["id"]).update(
        stale=True, stale_reason="report 9 shows flashinfer 0.7.1"
    )
    assert [r["title"] for r in api("get", URL, alice_key, status="proposed").json()["results"]] == [
        "proposed one"
    ]
    assert [r["id"] for r in api("get", URL, alice_key, stale="true").json()["results"]] == [created["id"]]
    assert [r["id"] for r in api("get", URL, alice_key, signature=TOP).json()["results"]] == [created["id"]]
    assert api("get", URL, alice_key, group="2fbe92b07ed61262").json()["count"] == 1


def test_the_export_is_what_dispatchlab_match_reads_and_says_what_the_report_says(
    api, alice_key, created, acme, make_report, tmp_path, django_capture_on_commit_callbacks
):
    report = parsed(make_report(acme, document=canonical()), django_capture_on_commit_callbacks)
    api("post", URL, alice_key, {"title": "unlinked"})
    export = api("get", URL, alice_key, format="export").json()
    assert [d["number"] for d in export["decisions"]] == [1, 2] and "results" not in export
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    document = canonical()
    attach_decisions(document, load_decisions(path))
    served = api("get", f"/api/v1/reports/{report.id}", alice_key).json()["document"]
    assert document["decisions"] == served["decisions"] and len(served["decisions"]) == 1
    assert document["matches"][0]["decisions"] == served["matches"][0]["decisions"]
    # the management command writes the same records
    out = io.StringIO()
    call_command("exportdecisions", "--project", "acme", stdout=out)
    by_command = json.loads(out.getvalue())["decisions"]
    assert [(d["id"], d["links"], d["revisit_when"]) for d in by_command] == [
        (d["id"], d["links"], d["revisit_when"]) for d in export["decisions"]
    ]


def test_the_schema_describes_the_decisions_api(client):
    schema = client.get("/api/schema/").json()
    assert {"/api/v1/decisions", "/api/v1/decisions/{id}", "/api/v1/decisions/{id}/history"} <= set(
        schema["paths"]
    )
    assert set(schema["paths"]["/api/v1/decisions/{id}"]) == {"get", "patch"}
    assert {"Decision", "DecisionRef", "DecisionEdit"} <= set(schema["components"]["schemas"])
    assert schema["components"]["schemas"]["Match"]["properties"]["decisions"]["items"] == {
        "$ref": "#/components/schemas/DecisionRef"
    }


def test_an_upstream_link_with_characters_a_url_may_not_hold_is_refused(api, alice_key):
    response = api(
        "post", URL, alice_key, {"title": "x", "links": {"upstream": ["https://github.com/a/{b}<c>"]}}
    )
    assert response.status_code == 400
    assert "holds characters a URL may not" in response.json()["fields"]["links.upstream"][0]
    assert not Decision.objects.exists()

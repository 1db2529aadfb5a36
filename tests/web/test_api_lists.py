"""The API's lists and their filters (reports, failure groups, the knowledge base), as alice (member of
acme), bob (acme viewer), a read-only token and charlie (umbrella only) call them; the JSON errors every
endpoint answers (bad parameters, unknown ids and paths, wrong methods)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from dispatchlab.core.signatures import load_knowledge_base
from dispatchlab.decisions.services import decision_create
from dispatchlab.gpu.models import ConfirmRun, SignatureConfirmation
from dispatchlab.reports.accounts import apitoken_create
from dispatchlab.reports.models import FailureGroup, Report

REPORTS = "/api/v1/reports"
GROUPS = "/api/v1/groups"
SIGNATURES = "/api/v1/signatures"


def bearer(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def alice_key(acme, alice) -> str:
    return apitoken_create(user=alice, project=acme)[1]


@pytest.fixture
def charlie_key(umbrella, charlie) -> str:
    return apitoken_create(user=charlie, project=umbrella)[1]


@pytest.fixture
def get(client):
    def call(path: str, key: str | None = None, **params: Any) -> Any:
        return client.get(path, params, **(bearer(key) if key else {}))

    return call


@pytest.fixture
def parsed(client, alice_key, make_upload, django_capture_on_commit_callbacks) -> Report:
    """A real upload of the OOM crash log, parsed by the real core (the task runs eagerly)."""
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(REPORTS, {"file": make_upload(), "title": "nightly"}, **bearer(alice_key))
    report = Report.objects.get(id=answer.json()["id"])
    assert report.status == Report.Status.DONE and report.group is not None
    return report


# ---------------------------------------------------------------- reports


def test_the_report_list_is_paginated_and_keeps_its_first_shape(get, alice_key, acme, make_report):
    made = [make_report(acme, title=f"run {n}") for n in range(5)]
    first = get(REPORTS, alice_key, limit=2).json()
    assert first["count"] == 5 and [r["id"] for r in first["results"]] == [made[4].id, made[3].id]
    assert first["reports"] == first["results"]  # the list's first shape, kept
    assert first["previous"] is None and "page=2" in first["next"] and "limit=2" in first["next"]
    last = Client().get(first["next"].replace("page=2", "page=3"), **bearer(alice_key)).json()
    assert [r["id"] for r in last["results"]] == [made[0].id] and last["next"] is None
    assert "page=2" in last["previous"]
    assert get(REPORTS, alice_key, page=99).json()["results"] == []
    assert len(get(REPORTS, alice_key, limit=1000).json()["results"]) == 5  # at most 100 a page


def test_the_report_list_takes_the_dashboards_filters(get, alice_key, acme, make_report, make_document):
    oom = make_report(acme, title="nightly h100")
    vllm = make_report(
        acme,
        document=make_document(
            server="vllm", failure_class="cuda_error", backends={"attention_backend": "flashinfer"}
        ),
    )
    failed = make_report(acme, status=Report.Status.FAILED, title="broken upload")

    def ids(**params: str) -> list[int]:
        return [r["id"] for r in get(REPORTS, alice_key, **params).json()["results"]]

    assert ids(failure_class="oom") == [oom.id]
    assert ids(server="vllm") == [vllm.id]
    assert ids(status="failed") == [failed.id]
    assert ids(q="nightly") == [oom.id]
    assert ids(backend="attention_backend=flashinfer") == [vllm.id]
    assert ids(backend="fa3") == [oom.id]
    assert ids(project="acme", status="done") == [vllm.id, oom.id]
    assert ids(project="nowhere") == []  # as the page: a value nothing has lists nothing
    assert ids(status="") == [failed.id, vllm.id, oom.id]  # an empty field is no filter


@pytest.mark.parametrize(
    ("params", "name", "says"),
    [
        ({"status": "finished"}, "status", "must be one of queued, parsing, done, failed"),
        ({"failure_class": "oops"}, "failure_class", "must be one of arch_unsupported_kernel, cuda_error"),
        ({"limit": "x"}, "limit", "must be a whole number"),
        ({"limit": "0"}, "limit", "must be at least 1"),
        ({"page": "-1"}, "page", "must be at least 1"),
        ({"backend": "9bad=x"}, "backend", "the key is a backend name such as attention_backend"),
        ({"q": "x" * 201}, "q", "must be at most 200 characters"),
    ],
)
def test_a_bad_filter_is_a_400_that_names_the_parameter_and_what_it_takes(get, alice_key, params, name, says):
    response = get(REPORTS, alice_key, **params)
    assert response.status_code == 400
    body = response.json()
    assert set(body["fields"]) == {name} and says in body["fields"][name][0]
    assert body["error"].startswith(f"{name} ") and says in body["error"]


# ---------------------------------------------------------------- failure groups


def test_the_groups_list_the_callers_groups_with_the_pages_filters(get, alice_key, charlie_key, parsed):
    group = parsed.group
    listed = get(GROUPS, alice_key).json()
    assert listed["count"] == 1 and listed["next"] is None and listed["previous"] is None
    (item,) = listed["results"]
    assert item["id"] == group.id and item["fingerprint"] == group.fingerprint
    assert item["failure_class"] == "oom" and item["project"] == "acme" and item["count"] == 1
    assert item["url"].endswith(f"/groups/{group.id}/")
    assert [g["id"] for g in get(GROUPS, alice_key, failure_class="oom").json()["results"]] == [group.id]
    assert get(GROUPS, alice_key, failure_class="cuda_error").json()["count"] == 0
    assert get(GROUPS, alice_key, q=group.fingerprint[:6]).json()["count"] == 1
    assert get(GROUPS, alice_key, project="acme").json()["count"] == 1
    assert get(GROUPS, alice_key, project="umbrella").json()["count"] == 0
    assert get(GROUPS, alice_key, failure_class="nope").status_code == 400
    # charlie sees no trace of acme's group
    assert get(GROUPS, charlie_key).json() == {"results": [], "count": 0, "next": None, "previous": None}
    assert get(f"{GROUPS}/{group.id}", charlie_key).status_code == 404
    assert get(GROUPS).status_code == 401


def test_a_group_shows_its_reports_and_linked_decisions(get, alice, alice_key, parsed, bob_client):
    group = parsed.group
    decision_create(
        project=parsed.project,
        user=alice,
        data={"title": "lower mem fraction", "links": {"groups": [group.fingerprint]}},
    )
    body = get(f"{GROUPS}/{group.id}", alice_key).json()
    assert [r["id"] for r in body["reports"]] == [parsed.id] and body["reports"][0]["group"] == group.id
    assert body["signatures"] == ["cuda-out-of-memory"]
    assert [d["title"] for d in body["decisions"]] == ["lower mem fraction"]
    assert bob_client.get(f"{GROUPS}/{group.id}").status_code == 200  # a viewer reads
    assert get(f"{GROUPS}/{group.id + 1000}", alice_key).json() == {"error": "no such failure group"}


# ---------------------------------------------------------------- the knowledge base


def test_the_knowledge_base_is_listed_a_page_at_a_time_with_filters(get, alice_key):
    kb = load_knowledge_base()
    first = get(SIGNATURES, alice_key, limit=100).json()
    assert first["count"] == len(kb.signatures) and first["kb_digest"] == kb.digest
    assert [s["id"] for s in first["results"]] == sorted(s.id for s in kb.signatures)[:100]
    oom = get(SIGNATURES, alice_key, failure_class="oom").json()["results"]
    assert oom and all(s["failure_class"] == "oom" for s in oom)
    assert "cuda-out-of-memory" in [s["id"] for s in oom]
    memory = get(SIGNATURES, alice_key, area="memory").json()["results"]
    assert memory and {s["area"] for s in memory} == {"memory"}
    found = get(SIGNATURES, alice_key, q="CUDA OUT OF MEMORY").json()["results"]
    assert "cuda-out-of-memory" in [s["id"] for s in found]
    refused = get(SIGNATURES, alice_key, area="kitchen")
    assert refused.status_code == 400 and "area must be one of" in refused.json()["error"]
    assert "memory" in refused.json()["error"]
    assert get(SIGNATURES).status_code == 401


def test_a_signature_in_full_with_confirmations_only_naming_the_callers_runs(
    get, alice_key, charlie_key, acme, make_report
):
    report = make_report(acme)
    run = ConfirmRun.objects.create(
        project=acme, report=report, queue="gpu.sm_90", arch="sm_90", status="fixed", launcher="sglang"
    )
    SignatureConfirmation.objects.create(
        signature_id="cuda-out-of-memory",
        confirm=run,
        outcome="fixed",
        gpu_name="NVIDIA H200",
        arch="sm_90",
        server="sglang",
        server_version="0.5.23",
    )
    body = get(f"{SIGNATURES}/cuda-out-of-memory", alice_key).json()
    assert body["id"] == "cuda-out-of-memory" and body["failure_class"] == "oom"
    assert body["explanation"] and body["source"] == "memory/cuda-out-of-memory.toml"
    assert body["match"]["any"] or body["match"]["all"] or body["match"]["sequence"]
    (seen,) = body["confirmations"]
    assert seen["confirm"] == run.id and seen["label"].startswith(
        "confirmed on NVIDIA H200 sm_90, sglang 0.5.23"
    )
    # a confirmation is knowledge about the fix: charlie sees it, but not which of acme's runs it was
    (theirs,) = get(f"{SIGNATURES}/cuda-out-of-memory", charlie_key).json()["confirmations"]
    assert theirs["outcome"] == "fixed" and theirs["confirm"] is None
    assert get(f"{SIGNATURES}/no-such-thing", alice_key).status_code == 404


def test_tried_and_failed_comes_with_the_signature(get, alice_key):
    kb = load_knowledge_base()
    tried = next(s for s in kb.signatures if s.tried_and_failed)
    body = get(f"{SIGNATURES}/{tried.id}", alice_key).json()
    assert body["tried_and_failed"] == [{"what": t.what, "why": t.why} for t in tried.tried_and_failed]


# ---------------------------------------------------------------- JSON errors everywhere


def test_a_wrong_method_is_a_json_405_not_a_csrf_page(client, alice_key, alice_client):
    for method, path in (
        ("post", GROUPS),
        ("delete", REPORTS),
        ("put", "/api/v1/decisions"),
        ("post", "/api/v1/hosts"),
        ("get", "/api/v1/hooks/ci"),
        ("post", "/api/schema/"),
    ):
        for caller, headers in (
            (client, bearer(alice_key)),
            (alice_client, {}),
            (Client(enforce_csrf_checks=True), {}),
        ):
            response = getattr(caller, method)(path, **headers)
            assert response.status_code == 405, (method, path)
            assert response["Content-Type"] == "application/json" and "answers" in response.json()["error"]
            assert response["Allow"]


def test_an_unknown_api_path_is_a_json_404(client, alice_key):
    for path in ("/api/v1/nothing", "/api/v1/reports/-1", "/api/v1/reports/x/confirm", "/api/v2/reports"):
        response = client.get(path, **bearer(alice_key))
        assert response.status_code == 404 and "no such API endpoint" in response.json()["error"]


def test_a_page_404_stays_html(alice_client):
    response = alice_client.get("/no-such-page/")
    assert response.status_code == 404 and response["Content-Type"].startswith("text/html")


def test_an_absurd_page_or_id_is_no_server_error(get, alice_key, acme, make_report):
    make_report(acme)
    huge = "9" * 30
    assert get(REPORTS, alice_key, page=huge).json()["results"] == []
    assert get(f"{REPORTS}/{huge}", alice_key).status_code == 404
    assert get(f"{GROUPS}/{huge}", alice_key).status_code == 404
    assert FailureGroup.objects.count() == 0

"""Similar incidents on the report page and in the API: known public cases, and the project's own groups."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from dispatchlab.reports.accounts import apitoken_create
from dispatchlab.reports.models import FailureGroup, Project, Report

OOM_CRASH = {
    "line": 11,
    "phase": "kv_cache",
    "exception": "torch.OutOfMemoryError",
    "message": "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB",
}
NCCL_CRASH = {
    "line": 40,
    "phase": "serving",
    "exception": "torch.distributed.DistBackendError",
    "message": "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600012 ms",
}


def _grouped(
    make_report: Any, make_document: Any, project: Project, title: str, crash: dict[str, Any], cls: str
) -> Report:
    fingerprint = hashlib.sha256(title.encode()).hexdigest()[:16]
    group = FailureGroup.objects.create(
        project=project, fingerprint=fingerprint, title=title, failure_class=cls, count=1
    )
    document = make_document(crash=crash, failure_class=cls, fingerprint=fingerprint, matches=[])
    return make_report(project, document=document, group=group, fingerprint=fingerprint)


@pytest.fixture
def crash(make_report: Any, make_document: Any, acme: Project, umbrella: Project) -> Report:
    _grouped(
        make_report, make_document, acme, "Earlier KV-cache OOM of acme", {**OOM_CRASH, "line": 90}, "oom"
    )
    _grouped(make_report, make_document, acme, "NCCL watchdog of acme", NCCL_CRASH, "nccl_error")
    _grouped(make_report, make_document, umbrella, "Umbrella's own OOM", OOM_CRASH, "oom")
    message = OOM_CRASH["message"].replace("2.00", "4.00")
    return _grouped(make_report, make_document, acme, "Today's OOM", {**OOM_CRASH, "message": message}, "oom")


def _bearer(user: Any, project: Project) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {apitoken_create(user=user, project=project)[1]}"}


def test_the_report_page_lists_the_projects_similar_groups_and_no_other_projects(alice_client, crash):
    page = alice_client.get(f"/reports/{crash.id}/").content.decode()
    assert 'id="similar"' in page
    assert "Earlier KV-cache OOM of acme" in page
    assert "Umbrella&#x27;s own OOM" not in page and "Umbrella's own OOM" not in page
    assert (
        page.count("Today&#x27;s OOM") + page.count("Today's OOM") <= 2
    )  # the title, never a link to itself


def test_the_api_answers_the_similar_groups_of_the_reports_own_project_best_first(alice, acme, client, crash):
    answer = client.get(f"/api/v1/reports/{crash.id}", **_bearer(alice, acme)).json()
    groups = answer["document"]["similar"]["groups"]
    titles = [g["title"] for g in groups]
    assert titles[0] == "Earlier KV-cache OOM of acme"
    assert "Umbrella's own OOM" not in titles
    assert crash.group_id not in [g["id"] for g in groups]
    assert groups[0]["url"].endswith(f"/groups/{groups[0]['id']}/")
    assert all(c["url"].startswith("https://") for c in answer["document"]["similar"]["cases"])


def test_an_outsider_sees_neither_the_report_nor_its_similar_groups(
    charlie, umbrella, client, charlie_client, crash
):
    assert client.get(f"/api/v1/reports/{crash.id}", **_bearer(charlie, umbrella)).status_code == 404
    assert charlie_client.get(f"/reports/{crash.id}/").status_code == 404


def test_a_clean_report_shows_no_similar_incidents(alice_client, make_report, make_document, acme, crash):
    clean = make_report(
        acme, document=make_document(crash=None, failure_class="none", matches=[], outcome="serving")
    )
    page = alice_client.get(f"/reports/{clean.id}/").content.decode()
    assert 'id="similar"' not in page

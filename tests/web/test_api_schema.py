"""The OpenAPI document is generated from the code: it covers every API URL and method, and real answers
of each endpoint validate against the schemas generated for them (strictly: a field a view sends that its
TypedDict does not declare fails). The API page shows the same document."""

from __future__ import annotations

import copy
import hashlib
import hmac
import importlib.util
import json
import re
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from jsonschema import Draft202012Validator

from dispatchlab.api.schema import openapi_document, openapi_path, operations_of
from dispatchlab.decisions.services import decision_create
from dispatchlab.gpu.services import host_heartbeat
from dispatchlab.reports.accounts import apitoken_create
from dispatchlab.reports.models import Report

REPORTS = "/api/v1/reports"


def bearer(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def api_patterns() -> list[tuple[str, Any]]:
    """(route, view) of every pattern in dispatchlab/api/urls.py, as mounted under /api/."""
    (mount,) = [p for p in get_resolver().url_patterns if isinstance(p, URLResolver) and p.namespace == "api"]
    return [
        (str(mount.pattern) + str(p.pattern), p.callback)
        for p in mount.url_patterns
        if isinstance(p, URLPattern)
    ]


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return openapi_document()


def strict(node: Any) -> Any:
    """The schema with `additionalProperties: false` wherever it lists properties and says nothing of
    others: the answers must hold only what their TypedDicts declare (the open-ended shapes say `true`)."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def conforms(document: dict[str, Any], path: str, method: str, response: Any) -> dict[str, Any]:
    """Assert the answer is JSON that the document's schema for (path, method, status) accepts."""
    answers = document["paths"][path][method]["responses"]
    assert str(response.status_code) in answers, (
        f"{method} {path} answered an undocumented {response.status_code}"
    )
    assert response["Content-Type"] == "application/json"
    schema = answers[str(response.status_code)]["content"]["application/json"]["schema"]
    body = response.json()
    root = {**strict(schema), "components": strict(document["components"])}
    errors = list(Draft202012Validator(root).iter_errors(body))
    # under anyOf, the branch that came closest says what is wrong
    deepest = [max(e.context, key=lambda c: len(c.absolute_path)) if e.context else e for e in errors]
    assert not errors, f"{method} {path} {response.status_code}: " + "; ".join(
        f"{list(e.absolute_path)}: {e.message[:300]}" for e in deepest[:5]
    )
    return body


# ---------------------------------------------------------------- generated, complete


def test_every_api_url_and_method_is_in_the_document(document):
    patterns = api_patterns()
    v1 = [(route, view) for route, view in patterns if route.startswith("api/v1/")]
    assert len(v1) >= 13
    for route, view in v1:
        operations = operations_of(view)
        assert operations, f"{route}: the view declares no @operation, so the document cannot describe it"
        path = openapi_path(route)
        assert path in document["paths"], f"{route} is missing from the document"
        assert set(document["paths"][path]) == {m.lower() for m in operations}
        params = re.findall(r"\{(\w+)\}", path)
        for op in document["paths"][path].values():
            assert [p["name"] for p in op.get("parameters", []) if p["in"] == "path"] == params
    # nothing described that does not exist
    assert set(document["paths"]) == {openapi_path(route) for route, view in patterns if operations_of(view)}


def test_the_documents_shapes_are_valid_json_schema_and_ids_unique(document):
    for schema in document["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    ids = [op["operationId"] for item in document["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))
    assert document["openapi"] == "3.1.0"


def test_the_hand_written_document_is_gone():
    assert importlib.util.find_spec("dispatchlab.decisions.openapi") is None


def test_the_served_document_is_the_generated_one(client, document):
    served = client.get("/api/schema/").json()
    assert served["paths"] == document["paths"] and served["components"] == document["components"]
    assert served["servers"] == [{"url": "http://testserver/"}]


def test_every_query_parameter_is_validated_by_the_type_that_documents_it(document):
    # A parameter's schema comes from the query TypedDict the wrapper validates with: the enums are
    # the vocabulary's, not a copy.
    from dispatchlab.core.signatures import FAILURE_CLASSES

    params = {p["name"]: p for p in document["paths"]["/api/v1/reports"]["get"]["parameters"]}
    assert params["failure_class"]["schema"]["enum"] == list(FAILURE_CLASSES)
    assert set(params) >= {
        "q",
        "project",
        "server",
        "arch",
        "failure_class",
        "signature",
        "backend",
        "status",
    }
    assert {"page", "limit"} <= set(params)


# ---------------------------------------------------------------- real answers validate


@pytest.fixture
def alice_key(acme, alice) -> str:
    return apitoken_create(user=alice, project=acme)[1]


def test_real_answers_of_the_reports_and_groups_validate(
    client, document, alice_key, make_upload, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):  # parsed for real, by the core
        created = client.post(REPORTS, {"file": make_upload()}, **bearer(alice_key))
    report_id = conforms(document, "/api/v1/reports", "post", created)["id"]
    report = conforms(
        document, "/api/v1/reports/{id}", "get", client.get(f"{REPORTS}/{report_id}", **bearer(alice_key))
    )
    assert report["status"] == "done" and report["document"]["matches"]
    conforms(document, "/api/v1/reports", "get", client.get(REPORTS, **bearer(alice_key)))
    conforms(document, "/api/v1/reports", "get", client.get(REPORTS, {"status": "nope"}, **bearer(alice_key)))
    conforms(document, "/api/v1/reports", "get", client.get(REPORTS))  # 401
    conforms(document, "/api/v1/reports/{id}", "get", client.get(f"{REPORTS}/999999", **bearer(alice_key)))
    conforms(document, "/api/v1/reports", "post", client.post(REPORTS, {}, **bearer(alice_key)))  # 400
    group_id = Report.objects.get(id=report_id).group_id
    conforms(document, "/api/v1/groups", "get", client.get("/api/v1/groups", **bearer(alice_key)))
    conforms(
        document, "/api/v1/groups/{id}", "get", client.get(f"/api/v1/groups/{group_id}", **bearer(alice_key))
    )


def test_real_answers_of_the_webhook_validate(
    client, document, acme, oom_log, django_capture_on_commit_callbacks
):
    body = json.dumps({"log": oom_log.decode(), "job": "e2e", "branch": "main"}).encode()
    signature = "sha256=" + hmac.new(acme.webhook_secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {"HTTP_X_DISPATCHLAB_SIGNATURE": signature, "HTTP_X_DISPATCHLAB_DELIVERY": "d1"}
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post("/api/v1/hooks/ci", body, content_type="application/json", **headers)
    conforms(document, "/api/v1/hooks/ci", "post", first)
    waited = client.post("/api/v1/hooks/ci?wait=1", body, content_type="application/json", **headers)
    assert conforms(document, "/api/v1/hooks/ci", "post", waited)["document"]["failure_class"] == "oom"
    conforms(
        document,
        "/api/v1/hooks/ci",
        "post",
        client.post("/api/v1/hooks/ci", body, content_type="application/json"),
    )
    bad_wait = client.post("/api/v1/hooks/ci?wait=soon", body, content_type="application/json", **headers)
    assert conforms(document, "/api/v1/hooks/ci", "post", bad_wait)["fields"] == {
        "wait": ["must be a whole number"]
    }


def test_real_answers_of_the_knowledge_base_validate(client, document, alice_key):
    listed = conforms(
        document, "/api/v1/signatures", "get", client.get("/api/v1/signatures?limit=100", **bearer(alice_key))
    )
    for item in listed["results"]:
        path = f"/api/v1/signatures/{item['id']}"
        conforms(document, "/api/v1/signatures/{id}", "get", client.get(path, **bearer(alice_key)))
    conforms(
        document, "/api/v1/signatures/{id}", "get", client.get("/api/v1/signatures/nope", **bearer(alice_key))
    )


def test_real_answers_of_the_gpu_side_validate(client, document, alice_key, acme, make_report, monkeypatch):
    from dispatchlab.gpu import services
    from tests.web.test_gpu_pages import _canonical_document

    monkeypatch.setattr(services, "_send", lambda task, kwargs, queue: None)
    host_heartbeat(payload={
        "host": "rtx-box", "queues": ["gpu", "gpu.sm_120"], "launchers": ["sglang"], "model_roots": ["/models"],
        "inventory": {"gpus": [{"name": "NVIDIA RTX PRO 6000", "arch": "sm_120", "memory_mib": 97887}],
                      "versions": {"sglang": "0.5.23", "vllm": None}},
    })  # fmt: skip
    conforms(document, "/api/v1/hosts", "get", client.get("/api/v1/hosts", **bearer(alice_key)))
    crash = make_report(acme, document=copy.deepcopy(_canonical_document()))
    answer = client.post(
        f"/api/v1/reports/{crash.id}/confirm", data="{}", content_type="application/json", **bearer(alice_key)
    )
    confirm_id = conforms(document, "/api/v1/reports/{id}/confirm", "post", answer)["id"]
    conforms(
        document,
        "/api/v1/confirms/{id}",
        "get",
        client.get(f"/api/v1/confirms/{confirm_id}", **bearer(alice_key)),
    )
    refused = client.post(
        f"/api/v1/reports/{crash.id}/confirm", data="[]", content_type="application/json", **bearer(alice_key)
    )
    conforms(document, "/api/v1/reports/{id}/confirm", "post", refused)


def test_real_answers_of_the_decisions_validate(client, document, alice, alice_key, acme):
    decision = decision_create(
        project=acme,
        user=alice,
        data={
            "title": "FA3 off on Blackwell",
            "alternatives": [{"what": "fa4", "outcome": "crashes"}],
            "links": {
                "signatures": ["fa3-backend-on-non-hopper"],
                "upstream": ["https://github.com/x/y/issues/1"],
            },
            "revisit_when": {"flashinfer": ">=0.7"},
        },
    )
    path = f"/api/v1/decisions/{decision.id}"
    conforms(document, "/api/v1/decisions", "get", client.get("/api/v1/decisions", **bearer(alice_key)))
    export = client.get("/api/v1/decisions?format=export", **bearer(alice_key))
    conforms(document, "/api/v1/decisions", "get", export)
    conforms(document, "/api/v1/decisions/{id}", "get", client.get(path, **bearer(alice_key)))
    patched = client.patch(path, {"status": "accepted"}, content_type="application/json", **bearer(alice_key))
    conforms(document, "/api/v1/decisions/{id}", "patch", patched)
    invalid = client.patch(
        path, {"revisit_when": {"flashinfer": "soon"}}, content_type="application/json", **bearer(alice_key)
    )
    assert (
        "revisit_when.flashinfer" in conforms(document, "/api/v1/decisions/{id}", "patch", invalid)["fields"]
    )
    conforms(
        document, "/api/v1/decisions/{id}/history", "get", client.get(f"{path}/history", **bearer(alice_key))
    )
    created = client.post(
        "/api/v1/decisions", {"title": "x"}, content_type="application/json", **bearer(alice_key)
    )
    conforms(document, "/api/v1/decisions", "post", created)
    signature = client.get("/api/v1/signatures/fa3-backend-on-non-hopper", **bearer(alice_key))
    assert [
        d["id"] for d in conforms(document, "/api/v1/signatures/{id}", "get", signature)["decisions"]
    ] == [decision.id]


# ---------------------------------------------------------------- the API page


def test_the_api_page_shows_every_operation_of_the_document(client, alice_client, document):
    page = alice_client.get("/api/")
    assert page.status_code == 200
    html = page.content.decode()
    for path, item in document["paths"].items():
        for method, op in item.items():
            assert f'id="{op["operationId"]}"' in html and path in html, (method, path)
    for name in document["components"]["schemas"]:
        assert f'id="schema-{name}"' in html
    assert 'href="/api/schema/"' in html
    # nothing is loaded from elsewhere at run time
    assert not re.search(r'(src|href)="(https?:)?//', html)
    # linked from the navigation, and public as the document is
    assert 'href="/api/"' in alice_client.get("/").content.decode()
    assert client.get("/api/").status_code == 200


def test_query_shapes_are_built_one_at_a_time_when_first_requests_come_together(monkeypatch):
    """pydantic reads a TypedDict's source with ast.parse when it first builds it, which CPython 3.11 cannot
    do in two threads at once (a 500 under eight first requests): the builds wait for each other."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from typing_extensions import TypedDict

    from dispatchlab.api import schema

    building, most = [0], [0]
    real = schema.TypeAdapter

    def slow_adapter(shape):
        building[0] += 1
        most[0] = max(most[0], building[0])
        time.sleep(0.02)
        building[0] -= 1
        return real(shape)

    monkeypatch.setattr(schema, "TypeAdapter", slow_adapter)
    shapes = [TypedDict(f"Query{n}", {"page": int}, total=False) for n in range(8)]  # type: ignore[operator]
    start = threading.Barrier(8)

    def first_request(shape):
        start.wait()
        return schema._properties(shape)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(first_request, shapes))
    assert all("page" in properties for properties, _required in answers)
    assert most[0] == 1

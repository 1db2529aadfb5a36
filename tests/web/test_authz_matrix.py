"""Who may do what, on every page and API endpoint: the matrix of authz_cases.py as test cases.

Each case makes one request as one caller against objects of acme and checks the status; a refused
request must change nothing and queue nothing. A URL pattern without a row (or an exemption) fails
`test_every_url_pattern_is_in_the_matrix_or_exempt_with_a_reason`; a method without a row must answer 405.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from dispatchlab.decisions import services as decision_services
from dispatchlab.decisions.models import Decision, DecisionEdit
from dispatchlab.decisions.services import decision_create
from dispatchlab.gpu import services as gpu_services
from dispatchlab.gpu import sweep_services
from dispatchlab.gpu.models import ConfirmRun, GpuHost, ProbeRun, SignatureConfirmation, SweepRun
from dispatchlab.gpu.services import confirm_create
from dispatchlab.gpu.sweep_services import sweep_create, sweep_finished
from dispatchlab.notify import services as notify_services
from dispatchlab.notify.models import Delivery, Endpoint, Event
from dispatchlab.notify.services import endpoint_create
from dispatchlab.reports import submit as report_services
from dispatchlab.reports.accounts import apitoken_create
from dispatchlab.reports.models import FailureGroup, Membership, Project, Report
from tests.web.authz_cases import (
    CALLERS,
    EXEMPT_NAMES,
    EXEMPT_NAMESPACES,
    EXEMPT_ROUTE_PREFIXES,
    LISTS,
    LOGIN,
    MATRIX,
    PATH_OBJECTS,
    QUERIES,
    REFUSED,
    Row,
)

SIGNATURE = "cuda-out-of-memory"  # the top match of the reports' documents
COMMAND = "python -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B --mem-fraction-static 0.8"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
EVENTS = ["group.new", "group.returned", "decision.stale"]


# ---------------------------------------------------------------- the URL patterns


@dataclass(frozen=True)
class Pattern:
    name: str | None  # "front:report"
    route: str  # "reports/<int:report_id>/"
    params: tuple[str, ...]
    namespace: str


def url_patterns() -> Iterator[Pattern]:
    def walk(
        patterns: list[URLPattern | URLResolver], prefix: str, namespace: str, params: tuple[str, ...]
    ) -> Iterator[Pattern]:
        for entry in patterns:
            route = prefix + str(entry.pattern)
            found = params + tuple(getattr(entry.pattern, "converters", {}))
            if isinstance(entry, URLResolver):
                inner = ":".join(n for n in (namespace, entry.namespace) if n)
                yield from walk(entry.url_patterns, route, inner, found)
            else:
                name = f"{namespace}:{entry.name}" if namespace and entry.name else entry.name
                yield Pattern(name, route, found, namespace)

    yield from walk(get_resolver("dispatchlab.config.urls").url_patterns, "", "", ())


def _exemption(pattern: Pattern) -> str | None:
    top = pattern.namespace.split(":")[0]
    if top in EXEMPT_NAMESPACES:
        return EXEMPT_NAMESPACES[top]
    if pattern.name in EXEMPT_NAMES:
        return EXEMPT_NAMES[pattern.name]
    return next(
        (why for prefix, why in EXEMPT_ROUTE_PREFIXES.items() if pattern.route.startswith(prefix)), None
    )


def _patterns_by_name() -> dict[str, Pattern]:
    return {p.name: p for p in url_patterns() if p.name and _exemption(p) is None}


# ---------------------------------------------------------------- the world


@dataclass
class World:
    """acme's objects (what the paths name) and umbrella's (what charlie should see instead)."""

    report: Report
    report2: Report
    group: FailureGroup
    confirm: ConfirmRun
    probe: ProbeRun
    sweep: SweepRun
    decision: Decision
    endpoint: Endpoint
    host: GpuHost
    theirs: dict[str, Any]
    clients: dict[str, tuple[Client, Client]]  # caller -> (for pages, for the API)
    keys: dict[str, str]  # caller -> its API token's key
    project_slug: str = "acme"
    signature_id: str = SIGNATURE
    queued: list[str] = field(default_factory=list)

    def ids(self) -> dict[str, Any]:
        return {
            name: getattr(self, name).pk
            for name in (
                "report",
                "report2",
                "group",
                "confirm",
                "probe",
                "sweep",
                "decision",
                "endpoint",
                "host",
            )
        }

    def path_value(self, param: str) -> Any:
        assert param in PATH_OBJECTS, (
            f"path parameter <{param}>: say in authz_cases.PATH_OBJECTS what it names"
        )
        value = getattr(self, PATH_OBJECTS[param])
        return value if isinstance(value, str) else value.pk


@pytest.fixture
def queued(monkeypatch) -> list[str]:
    """What would have gone to the broker: the functions the other tests patch, recording instead."""
    calls: list[str] = []
    monkeypatch.setattr(gpu_services, "_send", lambda task, kwargs, queue: calls.append(f"gpu {task}"))
    monkeypatch.setattr(gpu_services, "_send_cancel", lambda confirm_id: calls.append("gpu cancel"))
    monkeypatch.setattr(sweep_services, "_send", lambda task, kwargs, queue: calls.append(f"gpu {task}"))
    monkeypatch.setattr(notify_services, "_enqueue", lambda delivery_id: calls.append("notify delivery"))
    monkeypatch.setattr(report_services, "_enqueue", lambda report_id: calls.append("report analyze"))
    monkeypatch.setattr(
        decision_services, "_refresh_on_commit", lambda *a, **k: calls.append("decision refresh")
    )
    return calls


def _probe(project: Project | None, host: GpuHost, backend: str) -> ProbeRun:
    result = {
        "name": "moe_fp8",
        "backend": backend,
        "component": "moe",
        "runs": True,
        "status": "PASSED",
        "max_error": 0.004,
        "ms": 1.25,
        "tflops": 310.0,
        "peak_fraction": 0.62,
        "arch": "sm_90",
    }
    return ProbeRun.objects.create(
        project=project,
        host=host,
        host_name=host.name,
        status=ProbeRun.Status.DONE,
        finished_at=timezone.now(),
        arch="sm_90",
        gpu_name="NVIDIA H200",
        results=[result],
    )


def _objects(
    project: Project, user: User, make_report: Callable[..., Report], host: GpuHost
) -> dict[str, Any]:
    slug = project.slug
    group = FailureGroup.objects.create(project=project, fingerprint="f" * 16, title=f"{slug}-group-secret")
    report = make_report(project, title=f"{slug}-report-secret", group=group)
    confirm = confirm_create(report=report, user=user, command=COMMAND)
    # what a finished run shows about the signature's fix, to every project (its run: to its own only)
    SignatureConfirmation.objects.create(signature_id=SIGNATURE, confirm=confirm, outcome="fixed")
    sweep = sweep_create(report=report, component="attention", user=user)
    fix = {"candidate": "sdpa_flash", "flag": "--attention-backend", "value": "torch_native",
           "args_patch": {"attention_backend": "torch_native"}, "ms": 0.04, "why": "fastest correct"}  # fmt: skip
    sweep_finished(payload={"sweep_id": sweep.id, "host": "h200-box", "result": {"proposed_fix": fix}})
    decision_data = {"title": f"{slug}-decision-secret", "links": {"signatures": [SIGNATURE]}}
    return {
        "group": group,
        "report": report,
        "confirm": confirm,
        "probe": _probe(project, host, f"{slug}_probe_backend"),
        "sweep": SweepRun.objects.get(pk=sweep.pk),
        "decision": decision_create(project=project, user=user, data=decision_data),
        "endpoint": endpoint_create(
            project=project,
            user=user,
            name=f"{slug}-hook-secret",
            url=f"https://hooks.example.com/services/{slug}/token-in-the-path",
            kind="generic",
            events=EVENTS,
        ),
    }


def _bearer(key: str, **options: Any) -> Client:
    return Client(headers={"Authorization": f"Bearer {key}"}, **options)


def _session(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def world(acme, umbrella, alice, bob, charlie, make_report, queued) -> World:
    owner = User.objects.create_superuser(username="owner", password="password")
    Membership.objects.create(user=owner, project=acme, role=Membership.Role.MEMBER)
    host = GpuHost.objects.create(
        name="h200-box",
        arches=["sm_90"],
        queues=["gpu.sm_90"],
        inventory={"gpus": [{"index": 0, "name": "NVIDIA H200", "arch": "sm_90", "memory_mib": 143771}]},
    )
    theirs = _objects(umbrella, charlie, make_report, host)
    ours = _objects(acme, alice, make_report, host)
    report2 = make_report(acme, title="acme-report-two")
    _, alice_key = apitoken_create(user=alice, project=acme)
    _, alice_read_key = apitoken_create(user=alice, project=acme, read_only=True)
    _, bob_key = apitoken_create(user=bob, project=acme)
    _, charlie_key = apitoken_create(user=charlie, project=umbrella)
    # dora is a member of both projects; her token is umbrella's, and must read and write as charlie's
    dora = User.objects.create_user(username="dora", password="password")
    for project in (acme, umbrella):
        Membership.objects.create(user=dora, project=project, role=Membership.Role.MEMBER)
    _, dora_key = apitoken_create(user=dora, project=umbrella)
    owner_client, alice_client, bob_client, charlie_client = map(_session, (owner, alice, bob, charlie))
    clients = {
        "owner": (owner_client, owner_client),
        "member": (alice_client, _bearer(alice_key)),
        "viewer": (bob_client, bob_client),
        "viewer_token": (_bearer(bob_key), _bearer(bob_key)),
        "ro_token": (_bearer(alice_read_key), _bearer(alice_read_key)),
        "outsider": (charlie_client, charlie_client),
        "outsider_token": (_bearer(charlie_key), _bearer(charlie_key)),
        "anonymous": (Client(), Client()),
        # not a column of the matrix: test_a_token_is_confined_to_its_project
        "dual_token": (_bearer(dora_key), _bearer(dora_key)),
    }
    keys = {"member": alice_key}
    queued.clear()  # what setting up the world queued is not the request's doing
    return World(report2=report2, host=host, theirs=theirs, clients=clients, keys=keys, queued=queued, **ours)


# ---------------------------------------------------------------- requests


def _upload() -> SimpleUploadedFile:
    return SimpleUploadedFile(
        "matrix.log", b"posted by the authorization matrix\n", content_type="text/plain"
    )


# (url name, method) -> the body of the request: form fields, or ("json", object)
BODIES: dict[tuple[str, str], Callable[[World], Any]] = {
    ("front:upload", "POST"): lambda w: {"project": "acme", "title": "matrix upload", "file": _upload()},
    ("front:host_probe", "POST"): lambda w: {"project": "acme"},
    ("front:confirm_new", "POST"): lambda w: {"command": COMMAND},
    ("front:sweep_new", "POST"): lambda w: {"component": "moe"},
    ("front:sweep_confirm", "POST"): lambda w: {},
    ("api:report_sweep", "POST"): lambda w: ("json", {"component": "moe"}),
    ("front:decision_new", "POST"): lambda w: {"project": "acme", "title": "recorded", "status": "proposed"},
    ("front:decision_edit", "POST"): lambda w: {"title": "edited", "status": "proposed"},
    ("front:notify_project", "POST"): lambda w: {
        "name": "new hook",
        "url": "https://hooks.example.com/new",
        "kind": "generic",
        "events": EVENTS,
    },
    ("front:notify_test", "POST"): lambda w: {},
    ("front:notify_pause", "POST"): lambda w: {},
    ("front:notify_resume", "POST"): lambda w: {},
    ("front:notify_delete", "POST"): lambda w: {},
    ("api:reports", "POST"): lambda w: {"project": "acme", "title": "matrix upload", "file": _upload()},
    ("api:ci_hook", "POST"): lambda w: ("json", {"log": "a CI log without a signature"}),
    ("api:report_confirm", "POST"): lambda w: ("json", {"command": COMMAND}),
    ("api:confirm_cancel", "POST"): lambda w: ("json", {}),
    ("front:confirm_cancel", "POST"): lambda w: {},
    ("api:report_redact", "POST"): lambda w: ("json", {"pattern": "secret"}),
    ("front:redact", "POST"): lambda w: {"mode": "pattern", "pattern": "secret"},
    ("api:decisions", "POST"): lambda w: ("json", {"project": "acme", "title": "recorded"}),
    ("api:decision", "PATCH"): lambda w: ("json", {"title": "patched"}),
}


def _path(world: World, name: str, query: str = "") -> str:
    """The URL of a pattern, its parameters naming acme's objects, with the query formatted by their ids."""
    pattern = _patterns_by_name()[name]
    path = reverse(name, kwargs={param: world.path_value(param) for param in pattern.params})
    return path + query.format(**world.ids())


def _request(client: Client, method: str, path: str, body: Any) -> Any:
    if isinstance(body, tuple) and body[0] == "json":
        return client.generic(method, path, data=json.dumps(body[1]), content_type="application/json")
    if method == "GET":
        return client.get(path)
    if method == "POST":
        return client.post(path, body or {})
    return client.generic(method, path)


def _client(world: World, caller: str, name: str) -> Client:
    pages, api = world.clients[caller]
    return api if name.startswith("api:") else pages


def _state() -> tuple[Any, ...]:
    """What a write could change (token use stamps last_used_at, which is not a write by the caller)."""
    return (
        Report.objects.count(),
        list(ConfirmRun.objects.values_list("id", "status")),
        ProbeRun.objects.count(),
        SweepRun.objects.count(),
        list(Decision.objects.values_list("id", "title", "status", "updated_at")),
        DecisionEdit.objects.count(),
        list(Endpoint.objects.values_list("id", "name", "paused_at", "consecutive_failures")),
        Event.objects.count(),
        Delivery.objects.count(),
    )


def _shows(expected: int | str) -> str:
    return str(expected) if expected != LOGIN else "302 (login)"


CASES = [
    pytest.param(r, caller, id=f"{r.name} {r.method} as {caller} -> {_shows(r.expected[caller])}")
    for r in MATRIX
    for caller in CALLERS
]


# ---------------------------------------------------------------- the matrix is complete


def test_every_url_pattern_is_in_the_matrix_or_exempt_with_a_reason():
    rows = {r.name for r in MATRIX}
    missing = [
        f"{p.name or '(unnamed)'} at /{p.route}"
        for p in url_patterns()
        if _exemption(p) is None and p.name not in rows
    ]
    assert not missing, (
        "URL patterns outside the authorization matrix: add a row per method to "
        "tests/web/authz_cases.py MATRIX (or a reason to EXEMPT_*): " + ", ".join(missing)
    )
    stale = sorted(rows - set(_patterns_by_name()))
    assert not stale, f"rows of authz_cases.MATRIX name no URL pattern: {', '.join(stale)}"


def test_every_write_row_says_what_it_sends():
    writes = {(r.name, r.method) for r in MATRIX if r.method != "GET"}
    assert not writes - set(BODIES), f"say in BODIES what these send: {sorted(writes - set(BODIES))}"
    assert len({(r.name, r.method) for r in MATRIX}) == len(MATRIX), "one row per (url name, method)"


# ---------------------------------------------------------------- the matrix


@pytest.mark.parametrize(("row", "caller"), CASES)
def test_each_caller_gets_the_status_of_the_matrix(
    world, row: Row, caller: str, django_capture_on_commit_callbacks
):
    path = _path(world, row.name, QUERIES.get((row.name, row.method), ""))
    body = BODIES[(row.name, row.method)](world) if row.method != "GET" else None
    before = _state()
    # run what the request leaves for after the commit, so anything it queues is seen
    with django_capture_on_commit_callbacks(execute=True):
        response = _request(_client(world, caller, row.name), row.method, path, body)
    expected = row.expected[caller]
    shown = f"{row.method} {path} as {caller}"
    location = response.get("Location", "")
    if expected == LOGIN:
        assert response.status_code == 302 and location.startswith(settings.LOGIN_URL), (
            f"{shown}: {response.status_code} {location!r}, expected a redirect to the login page"
        )
    else:
        assert response.status_code == expected, f"{shown}: {response.status_code}, expected {expected}"
        if expected == 302:
            assert not location.startswith(settings.LOGIN_URL), f"{shown}: sent to log in"
    if expected in REFUSED:
        assert _state() == before, f"{shown} was refused ({response.status_code}) but changed something"
        assert world.queued == [], f"{shown} was refused ({response.status_code}) but queued {world.queued}"


@pytest.mark.parametrize("name", sorted({r.name for r in MATRIX}))
def test_a_method_without_a_row_is_refused(world, name: str):
    """A write method added to a view must come with its row: until then it fails here."""
    allowed = {r.method for r in MATRIX if r.name == name}
    path = _path(world, name)
    client = _client(world, "member", name)
    answered = {
        method: _request(client, method, path, None).status_code
        for method in METHODS
        if method not in allowed
    }
    assert all(status == 405 for status in answered.values()), (
        f"{name} answers {answered} to a member: add rows to authz_cases.MATRIX for the methods it accepts"
    )


# ---------------------------------------------------------------- lists stay in their project


def _markers(objects: dict[str, Any]) -> dict[str, list[str]]:
    """kind -> patterns that betray an object of that kind: its title (or name) and its links."""
    report, group, confirm = objects["report"], objects["group"], objects["confirm"]
    decision, endpoint, probe = objects["decision"], objects["endpoint"], objects["probe"]
    project = report.project.slug
    digits = r"(?![0-9])"
    return {
        "report": [
            re.escape(report.title),
            rf"/reports/{report.pk}/",
            rf"/api/v1/reports/{report.pk}{digits}",
        ],
        "group": [re.escape(group.title), rf"/groups/{group.pk}/"],
        "confirm": [rf"/confirms/{confirm.pk}/", rf"/api/v1/confirms/{confirm.pk}{digits}"],
        "decision": [
            re.escape(decision.title),
            rf"/decisions/{decision.pk}/",
            rf"/api/v1/decisions/{decision.pk}{digits}",
        ],
        "endpoint": [re.escape(endpoint.name), rf"/notifications/{project}/{endpoint.pk}/"],
        "probe": [re.escape(probe.results[0]["backend"]), rf"\?probe={probe.pk}{digits}"],
    }


def _listed_ids(answer: dict[str, Any]) -> set[Any]:
    """The ids of the items of a JSON list answer (`{"reports": [...]}`, `{"results": [...]}`, ...)."""
    return {
        item.get("id")
        for value in answer.values()
        if isinstance(value, list)
        for item in value
        if isinstance(item, dict)
    }


LIST_CASES = [
    pytest.param(name, query, kinds, caller, id=f"{name}{query} as {caller}")
    for name, query, kinds in LISTS
    for caller in ("outsider", *(["outsider_token", "dual_token"] if name.startswith("api:") else []))
]


@pytest.mark.parametrize(("name", "query", "kinds", "caller"), LIST_CASES)
def test_a_list_shows_the_outsider_only_their_own_project(world, name, query, kinds, caller):
    ours = {
        "report": world.report,
        "group": world.group,
        "confirm": world.confirm,
        "probe": world.probe,
        "decision": world.decision,
        "endpoint": world.endpoint,
    }
    path = _path(world, name, query)
    member = _client(world, "member", name).get(path, follow=True)
    outsider = _client(world, caller, name).get(path, follow=True)
    assert member.status_code == outsider.status_code == 200
    member_body, outsider_body = member.content.decode(), outsider.content.decode()
    acme, umbrella = _markers(ours), _markers(world.theirs)
    for kind in kinds:
        # the list does show its objects: acme's to the member, umbrella's to charlie
        assert re.search(acme[kind][0], member_body), f"{path}: alice does not see acme's {kind}"
        assert re.search(umbrella[kind][0], outsider_body), f"{path}: {caller} does not see umbrella's {kind}"
    leaks = [
        f"{kind} ({pattern})"
        for kind, found in acme.items()
        for pattern in found
        if re.search(pattern, outsider_body)
    ]
    assert not leaks, f"{path} as {caller} shows acme's {', '.join(leaks)}"
    if name.startswith("api:"):
        listed = _listed_ids(outsider.json())
        assert {world.theirs[kind].pk for kind in kinds} <= listed, f"{path}: umbrella's ids not listed"
        leaked = {kind: ours[kind].pk for kind in kinds if ours[kind].pk in listed}
        assert not leaked, f"{path} as {caller} lists acme's {leaked}"


def test_a_signature_names_only_the_callers_own_confirm_runs(world):
    """Every project's confirmations of a signature are shown (what a fix did on which GPU); the run
    behind one is named to its own project only."""
    path = _path(world, "api:signature")
    for caller, own in (("member", world.confirm), ("outsider", world.theirs["confirm"])):
        for client in world.clients[caller]:
            confirmations = client.get(path).json()["confirmations"]
            assert sorted(c["confirm"] or 0 for c in confirmations) == [0, own.pk], caller


API_ROWS = [r for r in MATRIX if r.name.startswith("api:")]


@pytest.mark.parametrize("row", API_ROWS, ids=[f"{r.name} {r.method}" for r in API_ROWS])
def test_a_token_is_confined_to_its_project(world, row: Row, django_capture_on_commit_callbacks):
    """dora is a member of acme too, but her token is umbrella's: the API answers it as charlie's."""
    path = _path(world, row.name, QUERIES.get((row.name, row.method), ""))
    body = BODIES[(row.name, row.method)](world) if row.method != "GET" else None
    before = _state()
    with django_capture_on_commit_callbacks(execute=True):
        response = _request(_client(world, "dual_token", row.name), row.method, path, body)
    expected = row.expected["outsider_token"]
    assert response.status_code == expected, (
        f"{row.method} {path}: {response.status_code}, expected {expected}"
    )
    if expected in REFUSED:
        assert _state() == before and world.queued == []


NOTIFY_WRITES = ("notify_test", "notify_pause", "notify_resume", "notify_delete")


@pytest.mark.parametrize("name", ["notify_endpoint", *NOTIFY_WRITES])
def test_an_outsider_naming_their_own_project_cannot_reach_anothers_endpoint(world, name):
    path = reverse(f"front:{name}", args=["umbrella", world.endpoint.pk])
    client = world.clients["outsider"][0]
    before = _state()
    response = client.get(path) if name == "notify_endpoint" else client.post(path)
    assert response.status_code == 404 and _state() == before


WRITES = [r for r in MATRIX if r.method != "GET" and r.expected["member"] in (201, 200, 302)]


@pytest.mark.parametrize("row", WRITES, ids=[f"{r.name} {r.method}" for r in WRITES])
def test_a_session_write_needs_the_csrf_token_and_a_token_write_does_not(world, row: Row):
    """The other cases run as Django's test client does, without CSRF checks; here they are on."""
    path = _path(world, row.name, QUERIES.get((row.name, row.method), ""))
    session = Client(enforce_csrf_checks=True)
    session.force_login(User.objects.get(username="alice"))
    before = _state()
    response = _request(session, row.method, path, BODIES[(row.name, row.method)](world))
    assert response.status_code == 403 and _state() == before, f"{row.name}: {response.status_code}"
    if row.name.startswith("api:"):
        token_client = _bearer(world.keys["member"], enforce_csrf_checks=True)
        response = _request(token_client, row.method, path, BODIES[(row.name, row.method)](world))
        assert response.status_code == row.expected["member"], f"{row.name}: {response.status_code}"


# ---------------------------------------------------------------- the exempt admin, the viewer's view


def test_the_admin_site_is_for_staff_only(world):
    """The premise of exempting the admin: a project role, even a member's, does not open it."""
    for caller in ("member", "viewer", "outsider", "anonymous"):
        response = world.clients[caller][0].get(reverse("admin:index"))
        assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login")), caller
    assert world.clients["owner"][0].get(reverse("admin:index")).status_code == 200


def test_a_viewer_sees_neither_an_endpoints_secret_nor_its_full_url(world):
    pages = [
        reverse("front:notify_project", args=["acme"]),
        reverse("front:notify_endpoint", args=["acme", world.endpoint.pk]),
    ]
    for path in pages:
        body = world.clients["viewer"][0].get(path).content.decode()
        assert world.endpoint.secret not in body and world.endpoint.url not in body, path
        assert world.endpoint.url in world.clients["member"][0].get(path).content.decode(), path

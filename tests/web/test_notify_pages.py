"""Notifications: the pages (endpoints, deliveries, test events) and what they show."""

from __future__ import annotations

import html
import json
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

from dispatchlab.notify import delivery as sending
from dispatchlab.notify import services
from dispatchlab.notify.models import Attempt, Delivery, Endpoint, Event, GroupClosure
from dispatchlab.notify.payloads import EventKind

# fixtures are found by name: imported as re-exports
from tests.web.test_notify import (
    _notify_settings as _notify_settings,
)
from tests.web.test_notify import (
    core as core,
)
from tests.web.test_notify import (
    endpoint as endpoint,
)
from tests.web.test_notify import (
    enqueued as enqueued,
)
from tests.web.test_notify import (
    land as land,
)
from tests.web.test_notify import (
    receiver as receiver,
)
from tests.web.test_notify import (
    resolver as resolver,
)
from tests.web.test_notify import (
    worker as worker,
)

# ---------------------------------------------------------------- pages


def test_a_member_adds_an_endpoint_and_sees_its_secret(alice_client, acme):
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {
            "url": "https://chat.example.com/hooks/abc",
            "kind": "slack",
            "events": ["group.new"],
            "name": "#oncall",
        },
    )
    hook = Endpoint.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("front:notify_endpoint", args=["acme", hook.pk]) + "?created=1"
    assert hook.kind == "slack" and hook.events == ["group.new"] and hook.name == "#oncall"
    page = alice_client.get(response["Location"]).content.decode()
    assert hook.secret in page and "Send a test event" in page


INTERNAL_URLS = [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
    ("http://metadata.example.test/x", "metadata.example.test resolves to 169.254.169.254, which is a cloud"),
    ("http://0251.0376.0251.0376/", "resolves to 169.254.169.254, which is a cloud metadata address"),
    ("http://[::ffff:169.254.169.254]/", "is a cloud metadata address"),
    ("http://169.254.10.1:8080/", "169.254.10.1 is a link-local address"),
    ("http://[fe80::1]/", "fe80::1 is a link-local address"),
    ("https://[::1]/z", "::1 is a loopback address"),
    ("http://10.0.0.5:8065/hooks/x", "10.0.0.5 is a private or reserved address"),
    ("http://mattermost.corp.test/hooks/y", "resolves to 10.20.0.7, which is a private or reserved"),
    ("http://mixed.example.test/", "resolves to fe80::1, which is a link-local address"),
    ("http://0.0.0.0:8000/", "0.0.0.0 is not an address a host answers on"),
]


@pytest.mark.parametrize(("url", "message"), INTERNAL_URLS)
def test_internal_and_metadata_addresses_are_refused_when_an_endpoint_is_added(
    alice_client, acme, url, message
):
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": url, "kind": "generic", "events": ["group.new"]},
    )
    assert response.status_code == 400
    assert message in html.unescape(response.content.decode())
    assert not Endpoint.objects.exists()


def test_the_refusal_names_the_setting_that_allows_a_network(alice_client, acme):
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": "http://10.0.0.5:8065/hooks/x", "kind": "generic", "events": ["group.new"]},
    )
    assert (
        "10.0.0.5 is a private or reserved address: webhooks are not sent there unless "
        "DISPATCHLAB_NOTIFY_ALLOW_NETWORKS allows its network."
    ) in html.unescape(response.content.decode())


def test_an_operator_allows_the_internal_chat_servers_network_but_never_the_metadata_address(
    alice_client, acme, settings
):
    settings.DISPATCHLAB_NOTIFY_ALLOW_NETWORKS = ["10.0.0.0/8", "169.254.0.0/16"]
    for url in (
        "http://10.0.0.5:8065/hooks/x",
        "http://mattermost.corp.test/hooks/y",
        "http://169.254.10.1/",
    ):
        response = alice_client.post(
            reverse("front:notify_project", args=["acme"]),
            {"url": url, "kind": "generic", "events": ["group.new"]},
        )
        assert response.status_code == 302, url
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": "http://metadata.example.test/", "kind": "generic", "events": ["group.new"]},
    )
    assert response.status_code == 400 and "cloud metadata address" in response.content.decode()
    assert Endpoint.objects.count() == 3


def test_the_notifyendpoint_command_refuses_a_link_local_address(acme):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r"url: 169\.254\.10\.1 is a link-local address"):
        call_command(
            "notifyendpoint", "--project", "acme", "--url", "http://169.254.10.1/h", "--event", "group.new"
        )
    assert not Endpoint.objects.exists()


def test_a_name_that_resolves_to_the_metadata_address_when_sent_is_refused_without_a_connection(
    acme, resolver
):
    hook = endpoint(acme, "http://chat.example.com/hook")  # public when it was added
    resolver.answers["chat.example.com"] = [["169.254.169.254"]]
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.FAILED
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.FAILED
    assert delivery.error == (
        "refused: chat.example.com resolves to 169.254.169.254, which is a cloud metadata address: "
        "webhooks are not sent there."
    )
    hook.refresh_from_db()
    assert hook.consecutive_failures == 1  # and the socket guard saw no connection


def test_a_row_changed_behind_the_forms_back_is_refused_when_sent(acme, settings):
    hook = endpoint(acme, "http://127.0.0.1:9/hook")
    settings.DISPATCHLAB_NOTIFY_ALLOW_NETWORKS = []
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.FAILED
    assert Delivery.objects.get().error.startswith("refused: 127.0.0.1 is a loopback address")


def test_the_name_is_resolved_once_and_the_request_goes_to_that_address_with_its_host_name(
    acme, receiver, resolver
):
    port = receiver.server.server_address[1]
    resolver.answers["hook.example.test"] = [["127.0.0.1"]]
    hook = endpoint(acme, f"http://hook.example.test:{port}/hook")
    # A rebinding name: the first answer passes the check, the next would lead to the metadata service.
    resolver.answers["hook.example.test"] = [["127.0.0.1"], ["169.254.169.254"]]
    resolver.lookups.clear()
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.DELIVERED
    assert resolver.lookups.count("hook.example.test") == 1
    assert receiver.requests[0]["headers"]["Host"] == f"hook.example.test:{port}"


def _self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *(
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                f"/CN={name}",
            ),
            *("-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_https_goes_to_the_resolved_address_with_the_names_sni_and_certificate_check(
    acme, receiver, resolver, tmp_path, monkeypatch
):
    cert, key = _self_signed(tmp_path, "hook.example.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the worker trusts this test's certificate
    seen: list[str | None] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: seen.append(name)
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    port = receiver.server.server_address[1]
    resolver.answers["hook.example.test"] = [["127.0.0.1"]]
    resolver.answers["other.example.test"] = [["127.0.0.1"]]
    good = endpoint(acme, f"https://hook.example.test:{port}/hook")
    wrong = endpoint(acme, f"https://other.example.test:{port}/hook")  # the certificate does not name it

    sent = services.endpoint_send_test(endpoint=good, user=None)
    assert sending.delivery_send(delivery_id=sent.id) == sending.SendOutcome.DELIVERED
    assert seen == ["hook.example.test"]
    assert receiver.requests[0]["headers"]["Host"] == f"hook.example.test:{port}"
    refused = services.endpoint_send_test(endpoint=wrong, user=None)
    with pytest.raises(sending.DeliveryUnavailable):
        sending.delivery_send(delivery_id=refused.id)
    assert "certificate" in Delivery.objects.get(id=refused.id).error
    assert len(receiver.requests) == 1


def test_the_endpoints_answer_is_not_stored_nor_shown_only_its_status(
    acme, alice_client, bob_client, land, receiver
):
    hook = endpoint(acme, receiver.url)
    receiver.script = [404]
    receiver.body = b"root:x:0:0:internal-secret"
    land(b"one\n")
    attempt = Delivery.objects.get().attempt_rows.get()
    assert attempt.status_code == 404 and attempt.error == "HTTP 404 Not Found"
    stored = json.dumps(list(Delivery.objects.values()), default=str) + json.dumps(
        list(Attempt.objects.values()), default=str
    )
    assert "internal-secret" not in stored
    for client in (alice_client, bob_client):
        page = client.get(reverse("front:notify_endpoint", args=["acme", hook.pk])).content.decode()
        assert "internal-secret" not in page and "HTTP 404" in page


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://user:secret@chat.internal/hook", "Put no user name or password in the URL"),
        ("https://token@chat.internal/hook", "Put no user name or password in the URL"),
        ("ftp://chat.internal/hook", "Only http:// and https:// URLs can receive events (ftp: is refused)."),
        ("file:///etc/passwd", "Only http:// and https:// URLs can receive events (file: is refused)."),
        ("javascript:alert(1)", "Only http:// and https:// URLs can receive events"),
        ("chat.internal/hook", "Only http:// and https:// URLs can receive events (no scheme is refused)."),
        ("http:///hook", "The URL has no host name."),
    ],
)
def test_urls_with_credentials_or_other_schemes_are_refused_with_a_message(alice_client, acme, url, message):
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": url, "kind": "generic", "events": ["group.new"]},
    )
    assert response.status_code == 400
    assert message in html.unescape(response.content.decode())
    assert not Endpoint.objects.exists()


def test_an_endpoint_needs_an_event(alice_client, acme):
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": "https://chat.example.com/h", "kind": "generic"},
    )
    assert response.status_code == 400 and "Choose at least one event" in response.content.decode()


def test_a_viewer_reads_but_cannot_add_endpoints(bob_client, acme):
    hook = endpoint(acme, "https://hooks.slack.com/services/T000/B000/secret-token", kind="slack")
    response = bob_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": "https://chat.example.com/hook", "kind": "generic", "events": ["group.new"]},
    )
    assert response.status_code == 403
    assert Endpoint.objects.count() == 1
    listing = bob_client.get(reverse("front:notify_project", args=["acme"])).content.decode()
    assert "Add an endpoint" not in listing and "secret-token" not in listing
    assert "https://hooks.slack.com/services/…" in listing
    detail = bob_client.get(reverse("front:notify_endpoint", args=["acme", hook.pk])).content.decode()
    assert hook.secret not in detail and "secret-token" not in detail and "Send a test event" not in detail
    for action in ("notify_test", "notify_pause", "notify_resume", "notify_delete"):
        assert bob_client.post(reverse(f"front:{action}", args=["acme", hook.pk])).status_code == 403
    assert Endpoint.objects.filter(pk=hook.pk, paused_at__isnull=True).exists()


def test_an_outsider_gets_404(charlie_client, acme):
    hook = endpoint(acme)
    assert charlie_client.get(reverse("front:notify_project", args=["acme"])).status_code == 404
    assert charlie_client.get(reverse("front:notify_endpoint", args=["acme", hook.pk])).status_code == 404
    response = charlie_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": "https://chat.example.com/hook", "kind": "generic", "events": ["group.new"]},
    )
    assert response.status_code == 404
    for action in ("notify_test", "notify_pause", "notify_resume", "notify_delete"):
        assert charlie_client.post(reverse(f"front:{action}", args=["acme", hook.pk])).status_code == 404
    # nor under charlie's own project
    assert charlie_client.get(reverse("front:notify_endpoint", args=["umbrella", hook.pk])).status_code == 404
    assert Endpoint.objects.filter(pk=hook.pk, paused_at__isnull=True).exists()


def test_the_nav_leads_to_the_only_project(alice_client, acme):
    page = alice_client.get(reverse("front:report_list")).content.decode()
    assert f'href="{reverse("front:notifications")}"' in page and ">Notifications<" in page
    response = alice_client.get(reverse("front:notifications"))
    assert response.status_code == 302 and response["Location"] == reverse(
        "front:notify_project", args=["acme"]
    )


def test_a_member_deletes_an_endpoint(alice_client, acme):
    hook = endpoint(acme)
    response = alice_client.post(reverse("front:notify_delete", args=["acme", hook.pk]))
    assert response.status_code == 302 and not Endpoint.objects.exists()


def test_the_notifyendpoint_command_prints_the_secret_last(acme, capsys):
    call_command(
        "notifyendpoint",
        "--project",
        "acme",
        "--url",
        "http://127.0.0.1:8065/hooks/x",
        "--event",
        "group.new",
    )
    hook = Endpoint.objects.get()
    assert capsys.readouterr().out.strip().splitlines()[-1] == hook.secret
    assert hook.events == ["group.new"] and hook.kind == "generic"


def test_the_task_retries_an_unavailable_endpoint_after_the_services_countdown(monkeypatch):
    from dispatchlab.notify.tasks import delivery_send_task

    def unavailable(*, delivery_id: int) -> None:
        raise sending.DeliveryUnavailable("HTTP 502 Bad Gateway", countdown=7.5)

    asked: dict[str, Any] = {}

    def retry(**kwargs: Any) -> Exception:
        asked.update(kwargs)
        return RuntimeError("retried")

    monkeypatch.setattr(sending, "delivery_send", unavailable)
    monkeypatch.setattr(delivery_send_task, "retry", retry)
    with pytest.raises(RuntimeError, match="retried"):
        delivery_send_task.run(12)
    assert asked["countdown"] == 7.5 and isinstance(asked["exc"], sending.DeliveryUnavailable)


def test_accepting_a_decision_linked_to_a_group_closes_it_so_its_next_crash_is_news(acme, land, enqueued):
    from dispatchlab.decisions.services import decision_create, decision_update

    endpoint(acme)
    crash = land(b"one\n")
    record = decision_create(
        project=acme,
        user=None,
        data={"title": "MTP off on sm_120", "status": "proposed", "links": {"groups": [crash.fingerprint]}},
    )
    assert not GroupClosure.objects.filter(group=crash.group, closed_at__isnull=False).exists()
    decision_update(decision=record, user=None, data={"status": "accepted"})
    closure = GroupClosure.objects.get(group=crash.group)
    assert (
        closure.closed_kind == GroupClosure.Kind.DECISION_ACCEPTED and record.label in closure.closed_reason
    )
    land(b"two\n")
    assert Event.objects.filter(kind="group.returned").count() == 1


def test_a_decision_turning_stale_notifies_the_projects_endpoints(
    acme, enqueued, django_capture_on_commit_callbacks
):
    from dispatchlab.decisions.models import Decision
    from dispatchlab.decisions.services import on_stale

    endpoint(acme, events=[EventKind.DECISION_STALE.value])
    record = Decision.objects.create(
        project=acme,
        number=7,
        title="MTP off on sm_120",
        stale=True,
        stale_reason="report 9 shows flashinfer 0.7.1",
    )
    with django_capture_on_commit_callbacks(execute=True):
        on_stale(record)
    event = Event.objects.get(kind=EventKind.DECISION_STALE.value)
    assert "flashinfer 0.7.1" in json.dumps(event.payload)
    assert len(enqueued) == 1

"""Hardening a user or an attacker notices: deep JSON, methods the API does not take, token expiry and
revocation, login rate limits, security headers and `check --deploy`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from dispatchlab.reports.accounts import apitoken_create
from dispatchlab.reports.models import ApiToken, Report

ROOT = Path(__file__).resolve().parents[2]
HOOK = "/api/v1/hooks/ci"
DEEP = 1000


def nested_object(depth: int) -> bytes:
    return b'{"log": "x", "extra": ' + b"[" * depth + b"]" * depth + b"}"


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


# ---------------------------------------------------------------- deep JSON (item 5)


@pytest.mark.parametrize("depth", [DEEP, 100_000])
def test_a_signed_webhook_body_nested_deep_is_a_400_with_a_json_error(client, acme, depth):
    body = nested_object(depth)
    response = client.post(
        HOOK,
        body,
        content_type="application/json",
        HTTP_X_DISPATCHLAB_SIGNATURE=signature(acme.webhook_secret, body),
    )
    assert response.status_code == 400
    assert "nested too deeply" in response.json()["error"]
    assert not Report.objects.exists()


def test_a_deeply_nested_api_body_is_a_400_with_a_json_error(alice, acme):
    _, key = apitoken_create(user=alice, project=acme)
    body = b'{"project": "acme", "title": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    response = Client().post(
        "/api/v1/decisions", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert "not JSON" in response.json()["error"]


# ---------------------------------------------------------------- 405 on the API


def _api_paths() -> list[str]:
    paths = []

    def walk(patterns: list[URLPattern | URLResolver], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif route.startswith("api/"):
                paths.append("/" + re.sub(r"<(\w+:)?\w+>", "1", route))

    walk(get_resolver().url_patterns, "")
    return paths


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
def test_methods_an_api_endpoint_does_not_take_are_a_json_405_not_a_csrf_page(alice, method):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    allowed = {("/api/v1/decisions/1", "PATCH")}  # the one write these methods make (CSRF-checked, 403)
    for path in _api_paths():
        response = browser.generic(method, path, b"{}", content_type="application/json")
        if (path, method) in allowed:
            assert response.status_code == 403 and "CSRF" in response.json()["error"]
            continue
        assert response.status_code == 405, (path, response.status_code)
        assert response["Content-Type"] == "application/json" and response["Allow"], path


# ---------------------------------------------------------------- tokens


def bearer(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def test_a_new_token_expires_after_the_configured_days(alice, acme, settings):
    settings.DISPATCHLAB_API_TOKEN_DAYS = 30
    token, key = apitoken_create(user=alice, project=acme)
    assert token.expires_at is not None
    assert abs((token.expires_at - timezone.now()) - timedelta(days=30)) < timedelta(minutes=1)
    assert Client().get("/api/v1/reports", **bearer(key)).status_code == 200


def test_an_expired_token_is_refused_with_a_401_saying_so(alice, acme):
    token, key = apitoken_create(user=alice, project=acme)
    ApiToken.objects.filter(id=token.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = Client().get("/api/v1/reports", **bearer(key))
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"].startswith("token expired on ")


def test_a_token_made_with_zero_days_never_expires(alice, acme):
    token, _ = apitoken_create(user=alice, project=acme, days=0)
    assert token.expires_at is None


def test_a_revoked_token_is_refused_and_listed_as_revoked(alice, acme, capsys):
    call_command("apitoken", "--user", "alice", "--project", "acme")
    key = capsys.readouterr().out.strip().splitlines()[-1]
    assert Client().get("/api/v1/reports", **bearer(key)).status_code == 200
    prefix = ApiToken.objects.get().prefix
    call_command("apitoken", "--revoke", prefix)
    assert "revoked 1 token" in capsys.readouterr().out
    response = Client().get("/api/v1/reports", **bearer(key))
    assert response.status_code == 401 and response.json() == {"error": "invalid or revoked token"}
    call_command("apitoken", "--list", "--project", "acme")
    listed = capsys.readouterr().out
    assert prefix in listed and "revoked" in listed and "alice" in listed


def test_revoking_needs_the_whole_shown_prefix(alice, acme):
    apitoken_create(user=alice, project=acme)
    with pytest.raises(Exception, match="prefix as listed"):
        call_command("apitoken", "--revoke", "dl_")
    assert ApiToken.objects.get().revoked_at is None


def test_the_existing_create_usage_still_prints_the_token_last(db, capsys):
    call_command("apitoken", "--user", "ci", "--project", "Infra", "--create", "--read-only", "--days", "7")
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("dl_") and "read-only token" in lines[0] and "expires" in lines[0]


# ---------------------------------------------------------------- login rate limiting


@pytest.fixture
def fresh_cache():
    cache.clear()
    yield cache
    cache.clear()


def login(client: Client, password: str, address: str = "10.0.0.1") -> object:
    return client.post("/accounts/login/", {"username": "alice", "password": password}, REMOTE_ADDR=address)


def test_after_five_failures_even_the_right_password_is_refused_for_a_while(alice, fresh_cache, settings):
    settings.DISPATCHLAB_LOGIN_MAX_FAILURES = 5
    settings.DISPATCHLAB_LOGIN_WINDOW_SECONDS = 600
    client = Client()
    for _ in range(5):
        assert login(client, "wrong").status_code == 200
    refused = login(client, "password")
    assert refused.status_code == 200 and "_auth_user_id" not in client.session
    assert "Too many failed logins" in html.unescape(refused.content.decode())
    assert "try again in 10 minute(s)" in html.unescape(refused.content.decode())
    # Another address is not locked out by this one.
    other = Client()
    assert login(other, "password", address="10.0.0.2").status_code == 302


def test_the_lock_ends_with_its_window(alice, fresh_cache, settings, monkeypatch):
    import dispatchlab.security.login as login_module

    settings.DISPATCHLAB_LOGIN_MAX_FAILURES = 2
    settings.DISPATCHLAB_LOGIN_WINDOW_SECONDS = 60
    client = Client()
    login(client, "wrong"), login(client, "wrong")
    assert login(client, "password").status_code == 200
    later = login_module.time.time() + 61
    monkeypatch.setattr(login_module.time, "time", lambda: later)
    cache.clear()  # the cache entry expired with the window too
    assert login(client, "password").status_code == 302


def test_the_admin_login_is_limited_too(alice, fresh_cache, settings):
    settings.DISPATCHLAB_LOGIN_MAX_FAILURES = 1
    client = Client()
    client.post("/admin/login/", {"username": "alice", "password": "wrong"}, REMOTE_ADDR="10.0.0.3")
    refused = client.post(
        "/admin/login/", {"username": "alice", "password": "password"}, REMOTE_ADDR="10.0.0.3"
    )
    assert "Too many failed logins" in html.unescape(refused.content.decode())


def test_the_limit_holds_on_redis_shared_by_every_web_process(alice, settings):
    redis = pytest.importorskip("redis")
    url = os.environ.get("DISPATCHLAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
    try:
        redis.Redis.from_url(url).ping()
    except redis.RedisError:
        pytest.skip(f"no Redis at {url}")
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url}}
    settings.DISPATCHLAB_LOGIN_MAX_FAILURES = 3
    from django.core.cache import caches

    caches["default"].clear()
    try:
        for _ in range(3):
            login(Client(), "wrong", address="10.9.9.9")  # a new client each time: no shared session
        assert login(Client(), "password", address="10.9.9.9").status_code == 200
    finally:
        caches["default"].clear()


def test_a_forwarded_for_is_believed_only_from_a_trusted_proxy(alice, fresh_cache, settings):
    settings.DISPATCHLAB_LOGIN_MAX_FAILURES = 2
    settings.DISPATCHLAB_TRUSTED_PROXIES = ["10.1.0.0/16"]
    client = Client()

    def guess(peer: str, forwarded: str) -> str:
        answer = client.post(
            "/accounts/login/",
            {"username": "alice", "password": "wrong"},
            REMOTE_ADDR=peer,
            HTTP_X_FORWARDED_FOR=forwarded,
        )
        return "locked" if "Too many failed logins" in html.unescape(answer.content.decode()) else "checked"

    # From an outsider the header is ignored: every forged address is the one connection's.
    assert [guess("192.0.2.7", f"203.0.113.{n}") for n in range(3)] == ["checked", "checked", "locked"]
    # From the proxy each client is its own (the last hop the proxy saw, past the proxy's own hops).
    assert guess("10.1.0.5", "198.51.100.1, 10.1.0.9") == "checked"
    assert guess("10.1.0.5", "198.51.100.2") == "checked"
    assert guess("10.1.0.5", "198.51.100.1") == "checked"
    assert guess("10.1.0.5", "198.51.100.1") == "locked"


def test_a_right_password_does_not_count_as_a_failure(alice, fresh_cache, settings):
    settings.DISPATCHLAB_LOGIN_MAX_FAILURES = 2
    for _ in range(4):
        assert login(Client(), "password").status_code == 302
    assert login(Client(), "wrong").status_code == 200
    assert login(Client(), "password").status_code == 302


# ---------------------------------------------------------------- refused before the body (issue 16)


def test_an_anonymous_post_to_the_api_is_refused_before_its_body(acme):
    response = Client().post("/api/v1/decisions", b"{}", content_type="application/json")
    assert response.status_code == 401 and "Bearer" in response.json()["error"]
    response = Client().post(
        "/api/v1/reports", b"x", content_type="text/plain", HTTP_AUTHORIZATION="Bearer dl_nothing"
    )
    assert response.status_code == 401 and "invalid or revoked token" in response.json()["error"]


def test_an_anonymous_form_post_is_sent_to_the_login(acme):
    response = Client().post("/upload/", {"title": "x"})
    assert response.status_code == 302 and response["Location"] == "/accounts/login/?next=/upload/"


def test_a_post_to_a_path_no_view_answers_is_a_404_naming_it(alice_client):
    response = alice_client.post("/api/v1/report", {"x": "y"})
    assert response.status_code == 404 and "no such path: /api/v1/report" in response.json()["error"]
    response = alice_client.post("/upload", {"x": "y"})
    assert "did you mean /upload/" in response.json()["error"]


def test_a_delivery_must_name_its_project_when_too_many_have_a_secret(client, acme, umbrella, settings):
    settings.DISPATCHLAB_HOOK_UNNAMED_MAX_PROJECTS = 1
    body = b'{"log": "Traceback (most recent call last):\\nRuntimeError: x\\n"}'
    unnamed = client.post(
        HOOK,
        body,
        content_type="application/json",
        HTTP_X_DISPATCHLAB_SIGNATURE=signature(acme.webhook_secret, body),
    )
    assert unnamed.status_code == 400 and "X-Dispatchlab-Project" in unnamed.json()["error"]
    named = client.post(
        HOOK + "?project=acme",
        body,
        content_type="application/json",
        HTTP_X_DISPATCHLAB_SIGNATURE=signature(acme.webhook_secret, body),
    )
    assert named.status_code == 201, named.json()
    umbrella.webhook_secret = ""
    umbrella.save()
    quiet = client.post(
        HOOK,
        body,
        content_type="application/json",
        HTTP_X_DISPATCHLAB_SIGNATURE=signature("", body),
        HTTP_X_DISPATCHLAB_PROJECT=umbrella.slug,
    )
    assert quiet.status_code == 401 and "no webhook secret" in quiet.json()["error"]
    # One project with a secret left: a delivery need not name it.
    assert (
        client.post(
            HOOK,
            body,
            content_type="application/json",
            HTTP_X_DISPATCHLAB_SIGNATURE=signature(acme.webhook_secret, body),
        ).status_code
        == 201
    )


# ---------------------------------------------------------------- headers


def test_pages_carry_a_content_security_policy_that_allows_their_inline_handlers(alice_client, settings):
    response = alice_client.get("/")
    policy = response["Content-Security-Policy"]
    assert (
        "script-src 'self'" in policy and "object-src 'none'" in policy and "frame-ancestors 'none'" in policy
    )
    # Every inline event handler in the templates must be allowed by its hash, or it silently stops working.
    handlers = set()
    for template in (ROOT / "templates").rglob("*.html"):
        handlers |= {html.unescape(m) for m in re.findall(r'\son\w+="([^"]*)"', template.read_text())}
    assert handlers, "the test looks for inline handlers; none found means the regex is broken"
    for handler in handlers:
        digest = base64.b64encode(hashlib.sha256(handler.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy, f"inline handler {handler!r} is blocked by the CSP"
    # No inline <script> with code: only data islands (json_script) and files from static/.
    for template in (ROOT / "templates").rglob("*.html"):
        for tag in re.findall(r"<script\b[^>]*>", template.read_text()):
            assert "src=" in tag or "application/json" in tag, f"{template.name}: inline script {tag}"


def test_the_csp_is_configurable_with_a_nonce(alice_client, settings):
    settings.DISPATCHLAB_CSP = "script-src 'nonce-{nonce}'"
    settings.DISPATCHLAB_CSP_REPORT_ONLY = True
    first = alice_client.get("/")["Content-Security-Policy-Report-Only"]
    second = alice_client.get("/")["Content-Security-Policy-Report-Only"]
    assert first.startswith("script-src 'nonce-") and first != second


DEPLOY_ENV = {
    "DISPATCHLAB_SECRET_KEY": "x" * 30 + "-a-long-random-production-secret-key-0123456789",
    "DISPATCHLAB_ALLOWED_HOSTS": "triage.example.com",
    "DISPATCHLAB_SSL_REDIRECT": "true",
    "DISPATCHLAB_HSTS_SECONDS": "31536000",
    "DISPATCHLAB_HSTS_INCLUDE_SUBDOMAINS": "true",
    "DISPATCHLAB_HSTS_PRELOAD": "true",
}


def run_check_deploy(tmp_path: Path, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # a production environment: none of this test run's own settings (the browser tests allow async-unsafe ORM use)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DISPATCHLAB_") and k != "DJANGO_ALLOW_ASYNC_UNSAFE"
    }
    env.update({"DISPATCHLAB_DATA_DIR": str(tmp_path), **extra})
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_with_the_production_settings_of_docs_security(tmp_path):
    documented = (ROOT / "docs" / "security.md").read_text()
    for name in DEPLOY_ENV:
        assert name in documented, f"{name} is not documented in docs/security.md"
    result = run_check_deploy(tmp_path, DEPLOY_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_names_what_is_missing_without_them(tmp_path):
    result = run_check_deploy(tmp_path, {})
    assert result.returncode != 0
    assert "security.W004" in result.stderr + result.stdout  # HSTS
    assert "security.W008" in result.stderr + result.stdout  # SSL redirect


def test_hsts_ssl_redirect_and_secure_cookies_follow_the_settings(alice, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 3600
    assert Client().get("/accounts/login/").status_code == 301
    secure = Client().get("/accounts/login/", secure=True)
    assert secure.status_code == 200 and secure["Strict-Transport-Security"] == "max-age=3600"

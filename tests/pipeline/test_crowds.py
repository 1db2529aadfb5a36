"""Many clients at once against the production-shaped stack (issue 16): parallel login guesses are
each counted (item 7), a forged X-Forwarded-For does not buy a fresh address (item 7), and a hundred
simultaneous signed webhooks are all stored without a server error (item 8)."""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import re
import secrets
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.pipeline.conftest import REDIS_URL

pytestmark = pytest.mark.pipeline

MAX_FAILURES = 5  # DISPATCHLAB_LOGIN_MAX_FAILURES's default, which the stack runs with
LOCKED = "Too many failed logins"
WRONG = "Your user name and password didn't match"


def _make_user(stack, username: str) -> None:
    stack.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User; "
        f"User.objects.create_user({username!r}, password='the-right-password-4711')",
    )


def _login_form(stack) -> tuple[str, str]:
    """The CSRF cookie and form token a browser would get with the login page."""
    with urllib.request.urlopen(stack.base_url + "/accounts/login/", timeout=30) as response:
        cookie = response.headers["Set-Cookie"].split(";")[0]
        page = response.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    return cookie, token.group(1)


def _guess(stack, form: tuple[str, str], username: str, password: str, forwarded: str = "") -> str:
    cookie, token = form
    body = urllib.parse.urlencode(
        {"username": username, "password": password, "csrfmiddlewaretoken": token}
    ).encode()
    headers = {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"}
    if forwarded:
        headers["X-Forwarded-For"] = forwarded
    request = urllib.request.Request(stack.base_url + "/accounts/login/", body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            page = html.unescape(response.read().decode())
    except urllib.error.HTTPError as error:
        page = f"HTTP {error.code}"
    if LOCKED in page:
        return "locked"
    if WRONG in page:
        return "checked"
    return page[:300]


@pytest.fixture(scope="module")
def redis_cache_stack(tmp_path_factory, stack_with):
    """Production keeps login counts in Redis (DISPATCHLAB_CACHE_URL), shared by every web process."""
    with stack_with(tmp_path_factory.mktemp("redis-cache"), DISPATCHLAB_CACHE_URL=REDIS_URL) as running:
        yield running


@pytest.fixture(params=["file cache", "redis cache"])
def login_stack(request, stack):
    return stack if request.param == "file cache" else request.getfixturevalue("redis_cache_stack")


def test_forty_parallel_wrong_guesses_get_no_more_checks_than_the_limit(login_stack):
    stack = login_stack
    _make_user(stack, "carol")
    form = _login_form(stack)
    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda _: _guess(stack, form, "carol", "wrong"), range(40)))
    assert set(answers) <= {"checked", "locked"}, answers
    assert answers.count("checked") <= MAX_FAILURES, answers
    assert _guess(stack, form, "carol", "the-right-password-4711") == "locked"


def test_a_forged_forwarded_for_does_not_buy_a_fresh_address(stack):
    _make_user(stack, "dave")
    form = _login_form(stack)
    answers = [_guess(stack, form, "dave", "wrong", forwarded=f"203.0.113.{n}") for n in range(10)]
    assert answers[:MAX_FAILURES] == ["checked"] * MAX_FAILURES, answers
    assert answers[MAX_FAILURES:] == ["locked"] * (10 - MAX_FAILURES), answers


def _signed_delivery(stack, n: int) -> tuple[int, str]:
    body = json.dumps(
        {"log": f"Traceback (most recent call last):\nRuntimeError: crowd {n} {secrets.token_hex(4)}\n"}
    ).encode()
    digest = hmac.new(stack.webhook_secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-Dispatchlab-Signature": f"sha256={digest}",
        "X-Dispatchlab-Project": "pipeline",
        "X-Dispatchlab-Delivery": f"crowd-{n}",
    }
    # ?wait: each holds its request (and, unpooled, a database connection) while the worker parses, as
    # a CI job waiting for the diagnosis does.
    url = stack.base_url + "/api/v1/hooks/ci?wait=2"
    request = urllib.request.Request(url, body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, ""
    except urllib.error.HTTPError as error:
        return error.code, error.read()[:300].decode(errors="replace")


def test_a_hundred_simultaneous_signed_webhooks_are_all_stored_without_a_server_error(stack):
    with ThreadPoolExecutor(100) as pool:
        answers = list(pool.map(lambda n: _signed_delivery(stack, n), range(100)))
    failed = [answer for answer in answers if answer[0] != 201]
    assert not failed, failed[:5]
    stored = stack.sql("SELECT count(*) FROM reports_report WHERE delivery_id LIKE 'crowd-%%'")
    assert stored[0][0] == 100

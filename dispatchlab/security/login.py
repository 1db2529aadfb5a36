"""Login rate limiting: after DISPATCHLAB_LOGIN_MAX_FAILURES failed logins for one username from one
address within DISPATCHLAB_LOGIN_WINDOW_SECONDS, that pair is refused, even with the right password,
until the window since the first failure has passed. Counted in Django's cache, so every web process
(file cache of the embedded setup, or Redis) sees the same count; an attempt is counted before its
password is checked, atomically, so parallel guesses cannot all slip under the limit. The address is
the connection's unless it comes from one of DISPATCHLAB_TRUSTED_PROXIES (dispatchlab.security.clients)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.cache import cache
from django.core.cache.backends.redis import RedisCache
from django.http import HttpRequest

from dispatchlab.security import clients

KEY_PREFIX = "dispatchlab:login-failures:"


def client_address(request: HttpRequest) -> str:
    forwarded = (
        request.headers.get(settings.DISPATCHLAB_CLIENT_IP_HEADER, "")
        if settings.DISPATCHLAB_CLIENT_IP_HEADER
        else ""
    )
    return clients.client_address(str(request.META.get("REMOTE_ADDR", "")), forwarded)


def _key(username: str, address: str) -> str:
    digest = hashlib.sha256(f"{username.strip().lower()}\x00{address}".encode()).hexdigest()
    return KEY_PREFIX + digest


@contextlib.contextmanager
def _counting(key: str) -> Iterator[None]:
    """Make a read-modify-write of the count one step for every process of this machine: caches other
    than Redis (the file cache of the embedded setup) have no atomic increment."""
    lock_dir = Path(settings.DATA_DIR) / "login-locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / key.rpartition(":")[2][:2], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _is_redis() -> bool:
    return isinstance(cache, RedisCache)


def _take_attempt(key: str) -> tuple[int, float]:
    """Count one attempt for this pair before its password is checked; the count with it, and when the
    window began. Parallel guesses each get their own number, so no more than the limit are checked."""
    window = settings.DISPATCHLAB_LOGIN_WINDOW_SECONDS
    now = time.time()
    if _is_redis():
        # SET NX and INCR: atomic on the server, and INCR keeps the key's expiry (the window).
        cache.add(key + ":first", now, timeout=window)
        cache.add(key, 0, timeout=window)
        try:
            count = cache.incr(key)
        except ValueError:  # the window ended between the two calls
            cache.add(key, 1, timeout=window)
            count = 1
        return count, float(cache.get(key + ":first") or now)
    with _counting(key):
        entry = cache.get(key) or {"count": 0, "first": now}
        entry["count"] += 1
        cache.set(key, entry, timeout=max(1, int(entry["first"] + window - now) + 1))
        return entry["count"], entry["first"]


def _give_back_attempt(key: str) -> None:
    """A right password: its attempt is not a failure."""
    if _is_redis():
        with contextlib.suppress(ValueError):
            cache.decr(key)
        return
    with _counting(key):
        entry = cache.get(key)
        if entry and entry["count"] > 0:
            entry["count"] -= 1
            window = settings.DISPATCHLAB_LOGIN_WINDOW_SECONDS
            cache.set(key, entry, timeout=max(1, int(entry["first"] + window - time.time()) + 1))


LOCKED = "Too many failed logins for this user from your address: try again in %(minutes)s minute(s)."


class RateLimitedAuthenticationForm(AuthenticationForm):
    error_messages = {**AuthenticationForm.error_messages, "locked": LOCKED}
    locked_message = ""

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        if not self.request:
            return super().clean()
        key = _key(username, client_address(self.request))
        count, first = _take_attempt(key)
        if count > settings.DISPATCHLAB_LOGIN_MAX_FAILURES:
            wait = max(1, int(first + settings.DISPATCHLAB_LOGIN_WINDOW_SECONDS - time.time()) + 1)
            self.locked_message = self.error_messages["locked"] % {"minutes": (wait + 59) // 60}
            raise forms.ValidationError(self.locked_message, code="locked")
        cleaned = super().clean()  # a wrong password raises: its attempt stays counted
        _give_back_attempt(key)
        return cleaned


class RateLimitedLoginView(LoginView):
    authentication_form = RateLimitedAuthenticationForm


class RateLimitedAdminAuthenticationForm(RateLimitedAuthenticationForm, AdminAuthenticationForm):
    """The admin site's login, limited alike (admin.site.login_form)."""

    error_messages = {**AdminAuthenticationForm.error_messages, "locked": LOCKED}

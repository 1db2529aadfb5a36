"""Login rate limiting: after DISPATCHLAB_LOGIN_MAX_FAILURES failed logins for one username from one
address within DISPATCHLAB_LOGIN_WINDOW_SECONDS, that pair is refused, even with the right password,
until the window since the first failure has passed. Counted in Django's cache, so every web process
(file cache of the embedded setup, or Redis) sees the same count."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.cache import cache
from django.http import HttpRequest

KEY_PREFIX = "dispatchlab:login-failures:"


def client_address(request: HttpRequest) -> str:
    header: str = settings.DISPATCHLAB_CLIENT_IP_HEADER
    if header:
        forwarded = request.headers.get(header, "")
        # X-Forwarded-For lists every hop: the last is the one our own proxy saw.
        if forwarded:
            return forwarded.split(",")[-1].strip()
    return str(request.META.get("REMOTE_ADDR", ""))


def _key(username: str, address: str) -> str:
    digest = hashlib.sha256(f"{username.strip().lower()}\x00{address}".encode()).hexdigest()
    return KEY_PREFIX + digest


def _locked_for(key: str) -> int:
    """Seconds until this pair may try again; 0 when it may now."""
    entry = cache.get(key)
    if not entry or entry["count"] < settings.DISPATCHLAB_LOGIN_MAX_FAILURES:
        return 0
    return max(0, int(entry["first"] + settings.DISPATCHLAB_LOGIN_WINDOW_SECONDS - time.time()) + 1)


def _record_failure(key: str) -> None:
    window = settings.DISPATCHLAB_LOGIN_WINDOW_SECONDS
    entry = cache.get(key) or {"count": 0, "first": time.time()}
    entry["count"] += 1
    remaining = max(1, int(entry["first"] + window - time.time()) + 1)
    cache.set(key, entry, timeout=remaining)


LOCKED = "Too many failed logins for this user from your address: try again in %(minutes)s minute(s)."


class RateLimitedAuthenticationForm(AuthenticationForm):
    error_messages = {**AuthenticationForm.error_messages, "locked": LOCKED}
    locked_message = ""

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        key = _key(username, client_address(self.request)) if self.request else ""
        if key:
            wait = _locked_for(key)
            if wait:
                self.locked_message = self.error_messages["locked"] % {"minutes": (wait + 59) // 60}
                raise forms.ValidationError(self.locked_message, code="locked")
        try:
            return super().clean()
        except forms.ValidationError:
            if key:
                _record_failure(key)
            raise


class RateLimitedLoginView(LoginView):
    authentication_form = RateLimitedAuthenticationForm


class RateLimitedAdminAuthenticationForm(RateLimitedAuthenticationForm, AdminAuthenticationForm):
    """The admin site's login, limited alike (admin.site.login_form)."""

    error_messages = {**AdminAuthenticationForm.error_messages, "locked": LOCKED}

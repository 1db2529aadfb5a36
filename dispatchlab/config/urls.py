"""URLs: the JSON API, the admin, login/logout, and the pages (dispatchlab.front) at /."""

from __future__ import annotations

import importlib.util

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

from dispatchlab.security.login import RateLimitedAdminAuthenticationForm, RateLimitedLoginView

admin.site.login_form = RateLimitedAdminAuthenticationForm

urlpatterns: list[URLPattern | URLResolver] = [
    path("api/", include("dispatchlab.api.urls")),
    path("admin/", admin.site.urls),
    # Before Django's own: the same name and path, with failed logins limited.
    path("accounts/login/", RateLimitedLoginView.as_view(), name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
]

# Under /api/ Django's error pages answer JSON, as the API does.
handler400 = "dispatchlab.api.errors.bad_request"
handler403 = "dispatchlab.api.errors.permission_denied"
handler404 = "dispatchlab.api.errors.page_not_found"
handler500 = "dispatchlab.api.errors.server_error"

if importlib.util.find_spec("dispatchlab.front.urls") is not None:
    urlpatterns.append(path("", include("dispatchlab.front.urls")))

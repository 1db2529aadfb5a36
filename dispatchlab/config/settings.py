"""dispatchlab's only settings module: every value comes from a DISPATCHLAB_* environment variable.

The defaults need no services (a SQLite file and kombu's filesystem broker under DISPATCHLAB_DATA_DIR);
production sets DISPATCHLAB_DATABASE_URL (PostgreSQL) and DISPATCHLAB_BROKER_URL (Redis). A value that
cannot be read fails at start-up with ImproperlyConfigured naming the variable, never later.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import secrets
import warnings
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from dispatchlab.messaging.broker import DEFAULT_BROKER_URL, broker_config
from dispatchlab.notify import notify_queue
from dispatchlab.notify.addresses import parse_networks

BASE_DIR = Path(__file__).resolve().parent.parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"Unexpected value {name}={raw!r}, use 'true' or 'false'")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise ImproperlyConfigured(f"Unexpected value {name}={raw!r}, expected an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum {minimum}")
    return value


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"Unexpected value {name}={raw!r}, expected a number") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_json(name: str, default: dict[str, Any]) -> dict[str, Any]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ImproperlyConfigured(f"{name} is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object")
    return value


def env_secret(name: str) -> str | None:
    """The value of NAME, or the contents of the file named by NAME_FILE (Docker secrets)."""
    if name in os.environ:
        return os.environ[name]
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as error:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {error}") from None
    return None


DATA_DIR = Path(env_str("DISPATCHLAB_DATA_DIR", str(BASE_DIR / "var"))).resolve()
DEBUG = env_bool("DISPATCHLAB_DEBUG", False)


def _secret_key() -> str:
    configured = env_secret("DISPATCHLAB_SECRET_KEY")
    if configured:
        return configured
    # Without a configured key, keep one next to the data so sessions survive a restart of the
    # embedded setup. Production sets DISPATCHLAB_SECRET_KEY (every web process must share it).
    path = DATA_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(50)
        path.write_text(key)
        path.chmod(0o600)
        return key


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("DISPATCHLAB_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DISPATCHLAB_CSRF_TRUSTED_ORIGINS", [])
_BEHIND_TLS_PROXY = env_bool("DISPATCHLAB_BEHIND_TLS_PROXY", False)
if _BEHIND_TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# ---- transport security (docs/security.md lists what `check --deploy` wants in production) ----
SECURE_SSL_REDIRECT = env_bool("DISPATCHLAB_SSL_REDIRECT", False)
# Paths (regexes, without the leading slash) still answered over plain HTTP: health checks of the stack.
SECURE_REDIRECT_EXEMPT = env_list("DISPATCHLAB_SSL_REDIRECT_EXEMPT", [])
SECURE_HSTS_SECONDS = env_int("DISPATCHLAB_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DISPATCHLAB_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DISPATCHLAB_HSTS_PRELOAD", False)
# Cookies over HTTPS only: on by default whenever the site is served over TLS.
_TLS = _BEHIND_TLS_PROXY or SECURE_SSL_REDIRECT
SESSION_COOKIE_SECURE = env_bool("DISPATCHLAB_SECURE_COOKIES", _TLS)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# The Content-Security-Policy header (dispatchlab.security.middleware). The pages load scripts from
# static/ only; inline style attributes (confidence bars) and Plotly's injected stylesheets need
# 'unsafe-inline' for styles; the one inline handler (a delete confirmation) is allowed by its hash,
# which tests/web/test_security_headers.py recomputes from the templates. '{nonce}' in the value is
# replaced by a per-request nonce (request.csp_nonce). Empty: no header.
DISPATCHLAB_CSP = env_str(
    "DISPATCHLAB_CSP",
    "default-src 'self'; script-src 'self' 'unsafe-hashes' "
    "'sha256-QDX1qjnW+Eu80JKVsX4Ssawslfju7s1eBz2m+vHCsJs='; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
)
DISPATCHLAB_CSP_REPORT_ONLY = env_bool("DISPATCHLAB_CSP_REPORT_ONLY", False)
CSRF_FAILURE_VIEW = "dispatchlab.api.errors.csrf_failure"

# ---- login and tokens ----
# After this many failed logins for one username from one address within the window, that pair is
# refused (even with the right password) until the window has passed since the first failure.
DISPATCHLAB_LOGIN_MAX_FAILURES = env_int("DISPATCHLAB_LOGIN_MAX_FAILURES", 5, minimum=1)
DISPATCHLAB_LOGIN_WINDOW_SECONDS = env_int("DISPATCHLAB_LOGIN_WINDOW_SECONDS", 900, minimum=1)
# The proxies in front of the web server (addresses or networks, e.g. 10.0.0.5,172.18.0.0/16); default
# none. Only a request whose connection comes from one of them has its client's address read from
# DISPATCHLAB_CLIENT_IP_HEADER (the last address there that is not a proxy); anyone else's header is
# ignored, so a client cannot pick the address its login failures are counted for.
DISPATCHLAB_TRUSTED_PROXIES = env_list("DISPATCHLAB_TRUSTED_PROXIES", [])
DISPATCHLAB_CLIENT_IP_HEADER = env_str("DISPATCHLAB_CLIENT_IP_HEADER", "X-Forwarded-For")
# A new API token expires after this many days unless `apitoken --days` says otherwise; 0: never.
DISPATCHLAB_API_TOKEN_DAYS = env_int("DISPATCHLAB_API_TOKEN_DAYS", 90, minimum=0)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "dispatchlab.reports",
    "dispatchlab.gpu",
    "dispatchlab.decisions",
    "dispatchlab.notify",
    "dispatchlab.api",
]
# The pages (W2's app) are optional so the API and the worker also run from a checkout without them.
if importlib.util.find_spec("dispatchlab.front") is not None:
    INSTALLED_APPS.append("dispatchlab.front")
# Apps of one's own, as paperless-ngx's PAPERLESS_APPS: a feature that subscribes to the apps' events
# (dispatchlab.events) in its AppConfig.ready() without editing dispatchlab (docs/architecture.md).
INSTALLED_APPS += env_list("DISPATCHLAB_EXTRA_APPS", [])

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Header-only refusals (body too large, a webhook without a signature) before a byte is read.
    "dispatchlab.security.middleware.EarlyRefusalMiddleware",
    "dispatchlab.security.middleware.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "dispatchlab.config.urls"
WSGI_APPLICATION = "dispatchlab.config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# ---- database ----
_DEFAULT_DATABASE_URL = f"sqlite:///{DATA_DIR / 'dispatchlab.sqlite3'}"
_database_url = env_secret("DISPATCHLAB_DATABASE_URL") or _DEFAULT_DATABASE_URL
try:
    _database = dj_database_url.parse(_database_url, conn_max_age=env_int("DISPATCHLAB_DB_CONN_MAX_AGE", 60))
except ValueError as error:
    raise ImproperlyConfigured(f"DISPATCHLAB_DATABASE_URL cannot be read: {error}") from None
if _database["ENGINE"] == "django.db.backends.sqlite3":
    if _database["NAME"] != ":memory:":
        Path(_database["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # The web server and the worker write the same file: WAL lets readers run beside a writer,
    # IMMEDIATE transactions take the write lock up front instead of failing half-way.
    _database["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    _database["CONN_MAX_AGE"] = 0
# A pool of connections per web process (PostgreSQL): a request waits up to the timeout for one
# instead of opening its own, so a crowd of requests never passes the server's max_connections.
# The ASGI entry point turns it on (dispatchlab/config/asgi.py); 0: no pool, a connection per thread.
DISPATCHLAB_DB_POOL_SIZE = env_int("DISPATCHLAB_DB_POOL_SIZE", 0, minimum=0)
DISPATCHLAB_DB_POOL_TIMEOUT_SECONDS = env_float("DISPATCHLAB_DB_POOL_TIMEOUT_SECONDS", 60.0)
if DISPATCHLAB_DB_POOL_SIZE and _database["ENGINE"] == "django.db.backends.postgresql":
    _database.setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": DISPATCHLAB_DB_POOL_SIZE,
        "timeout": DISPATCHLAB_DB_POOL_TIMEOUT_SECONDS,
    }
    _database["CONN_MAX_AGE"] = 0  # a pooled connection goes back to the pool when its request ends
DATABASES = {"default": _database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("DISPATCHLAB_TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

# ---- files ----
STATIC_URL = "/static/"
STATIC_ROOT = Path(env_str("DISPATCHLAB_STATIC_ROOT", str(DATA_DIR / "static")))
# Hashed names cached for a year and gzip/Brotli copies, as collected by `manage.py collectstatic`
# into STATIC_ROOT (the devserver and the Docker image collect them; a page needs the manifest then).
STATIC_MANIFEST = env_bool("DISPATCHLAB_STATIC_MANIFEST", False)
STATICFILES_DIRS = [BASE_DIR / "static"]
MEDIA_URL = "/media/"
MEDIA_ROOT = Path(env_str("DISPATCHLAB_MEDIA_ROOT", str(DATA_DIR / "media"))).resolve()
# Uploads are kept as they arrived through any Django storage (S3 and friends in production);
# the worker's normalised text copy and line index always live under MEDIA_ROOT.
STORAGES = {
    "default": {
        "BACKEND": env_str("DISPATCHLAB_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage"),
        "OPTIONS": env_json("DISPATCHLAB_STORAGE_OPTIONS", {}),
    },
    "staticfiles": {
        "BACKEND": (
            "dispatchlab.config.staticfiles.CompressedManifestStorage"
            if STATIC_MANIFEST
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedStaticFilesStorage"
        ),
    },
}
# Without the manifest (tests, DEBUG, a server started before `collectstatic`), static files are served
# straight from the app folders under their plain names, cached for WHITENOISE_MAX_AGE (60 s).
WHITENOISE_USE_FINDERS = not STATIC_MANIFEST
# With finders serving static/, an empty STATIC_ROOT (no collectstatic yet) is expected, not a problem.
warnings.filterwarnings("ignore", message="No directory at", category=UserWarning)
DISPATCHLAB_MAX_UPLOAD_BYTES = env_int("DISPATCHLAB_MAX_UPLOAD_BYTES", 2 * 1024**3, minimum=1)
# A JSON webhook body is decoded whole in memory, so it gets a lower limit than a streamed upload.
DISPATCHLAB_MAX_JSON_BYTES = env_int("DISPATCHLAB_MAX_JSON_BYTES", 64 * 1024**2, minimum=1)
# Larger uploads stream to a temporary file instead of memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 16 * 1024 * 1024
FILE_UPLOAD_PERMISSIONS = 0o640

# Per-endpoint request body limits, enforced by the declared Content-Length before anything is read:
# path prefix -> bytes; the longest matching prefix wins, other paths get DISPATCHLAB_MAX_REQUEST_BYTES.
DISPATCHLAB_MAX_REQUEST_BYTES = env_int(
    "DISPATCHLAB_MAX_REQUEST_BYTES", DATA_UPLOAD_MAX_MEMORY_SIZE, minimum=1
)
DISPATCHLAB_MAX_HOOK_BYTES = env_int("DISPATCHLAB_MAX_HOOK_BYTES", DISPATCHLAB_MAX_UPLOAD_BYTES, minimum=1)
_UPLOAD_BODY = DISPATCHLAB_MAX_UPLOAD_BYTES + 1024 * 1024  # room for the multipart envelope
DISPATCHLAB_BODY_LIMITS: dict[str, int] = {
    "/api/v1/reports": _UPLOAD_BODY,
    # below a report (confirm, redact): small JSON bodies
    "/api/v1/reports/": DISPATCHLAB_MAX_REQUEST_BYTES,
    "/upload/": _UPLOAD_BODY,
    "/api/v1/hooks/ci": DISPATCHLAB_MAX_HOOK_BYTES + 1024 * 1024,
    "/accounts/": env_int("DISPATCHLAB_MAX_FORM_BYTES", 64 * 1024, minimum=1024),
}
DISPATCHLAB_BODY_LIMITS.update({k: int(v) for k, v in env_json("DISPATCHLAB_BODY_LIMITS", {}).items()})
# Bytes of request bodies larger than FILE_UPLOAD_MAX_MEMORY_SIZE (spooled to disk while they arrive)
# that one client may have in flight at once, per web process: past it a request is refused with 429
# before its body is read. Default: one upload of the largest size.
DISPATCHLAB_MAX_SPOOL_BYTES_PER_CLIENT = env_int(
    "DISPATCHLAB_MAX_SPOOL_BYTES_PER_CLIENT", max(DISPATCHLAB_BODY_LIMITS.values()), minimum=1
)
# ---- slow clients and crowds (dispatchlab.security.early, dispatchlab.security.deadlines) ----
# A connection must deliver a request's headers within this many seconds of opening (or of its
# previous answer), else it is answered 408 and closed.
DISPATCHLAB_HEADER_TIMEOUT_SECONDS = env_float("DISPATCHLAB_HEADER_TIMEOUT_SECONDS", 20.0)
# A body must arrive at DISPATCHLAB_BODY_MIN_BYTES_PER_SECOND on average once the grace seconds after
# the headers have passed, else it is answered 408 (a 2 GB upload at 16 kB/s still arrives).
DISPATCHLAB_BODY_GRACE_SECONDS = env_float("DISPATCHLAB_BODY_GRACE_SECONDS", 30.0)
DISPATCHLAB_BODY_MIN_BYTES_PER_SECOND = env_int("DISPATCHLAB_BODY_MIN_BYTES_PER_SECOND", 16 * 1024, minimum=1)
# Requests one web process serves at once; those past it wait up to the queue seconds for a turn,
# then are answered 503 with Retry-After.
DISPATCHLAB_WEB_MAX_IN_FLIGHT = env_int("DISPATCHLAB_WEB_MAX_IN_FLIGHT", 64, minimum=1)
DISPATCHLAB_WEB_QUEUE_SECONDS = env_float("DISPATCHLAB_WEB_QUEUE_SECONDS", 30.0)
if (
    min(DISPATCHLAB_HEADER_TIMEOUT_SECONDS, DISPATCHLAB_BODY_GRACE_SECONDS, DISPATCHLAB_WEB_QUEUE_SECONDS)
    <= 0
):
    raise ImproperlyConfigured(
        "DISPATCHLAB_HEADER_TIMEOUT_SECONDS, DISPATCHLAB_BODY_GRACE_SECONDS and "
        "DISPATCHLAB_WEB_QUEUE_SECONDS must be above 0"
    )
# Decompressed text of one uploaded file (a .gz, a zip member) is cut off with an error past this,
# while it is being expanded; the ratio guard of the core (1000x) stays in force below it.
DISPATCHLAB_MAX_EXPANDED_BYTES = env_int("DISPATCHLAB_MAX_EXPANDED_BYTES", 4 * 1024**3, minimum=1024)
# And the decompressed text of all the compressed files of one report together (twenty small .gz files
# each under the cap above would otherwise make a text copy twenty times it), and the members of one zip.
DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES = env_int(
    "DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES", DISPATCHLAB_MAX_EXPANDED_BYTES, minimum=1024
)
DISPATCHLAB_MAX_ZIP_MEMBERS = env_int("DISPATCHLAB_MAX_ZIP_MEMBERS", 10_000, minimum=1)
# Stored uploads of one project (bytes as uploaded) may not pass this; 0: no quota. A project's own
# `quota_bytes` overrides it.
DISPATCHLAB_PROJECT_QUOTA_BYTES = env_int("DISPATCHLAB_PROJECT_QUOTA_BYTES", 0, minimum=0)
# Reports (their logs and documents) older than this many days are deleted by beat; 0: kept forever.
# A project's own `retention_days` overrides it. Decision records are never deleted.
DISPATCHLAB_RETENTION_DAYS = env_int("DISPATCHLAB_RETENTION_DAYS", 0, minimum=0)

# ---- the parsing pipeline ----
# A parse slower than this is stopped and the report marked failed (soft), then killed (hard).
DISPATCHLAB_TASK_SOFT_TIME_LIMIT = env_int("DISPATCHLAB_TASK_SOFT_TIME_LIMIT", 1800, minimum=1)
DISPATCHLAB_TASK_TIME_LIMIT = env_int(
    "DISPATCHLAB_TASK_TIME_LIMIT", DISPATCHLAB_TASK_SOFT_TIME_LIMIT + 60, minimum=1
)
if DISPATCHLAB_TASK_TIME_LIMIT <= DISPATCHLAB_TASK_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured(
        f"DISPATCHLAB_TASK_TIME_LIMIT={DISPATCHLAB_TASK_TIME_LIMIT} must be above "
        f"DISPATCHLAB_TASK_SOFT_TIME_LIMIT={DISPATCHLAB_TASK_SOFT_TIME_LIMIT}"
    )
# A claim whose heartbeat (progress updates) is older than this belongs to a dead worker.
DISPATCHLAB_STALE_CLAIM_SECONDS = env_int("DISPATCHLAB_STALE_CLAIM_SECONDS", 300, minimum=1)
# A report whose worker died this many times is marked failed instead of being tried again.
DISPATCHLAB_MAX_ATTEMPTS = env_int("DISPATCHLAB_MAX_ATTEMPTS", 3, minimum=1)
# A redaction's pattern runs in a child process of the worker, killed after this many seconds (a
# backtracking pattern would otherwise hold a worker for ever); the redaction is then refused.
DISPATCHLAB_REDACT_TIME_LIMIT = env_int("DISPATCHLAB_REDACT_TIME_LIMIT", 120, minimum=1)
DISPATCHLAB_WEBHOOK_MAX_AGE_SECONDS = env_int("DISPATCHLAB_WEBHOOK_MAX_AGE_SECONDS", 300, minimum=1)
# A delivery naming no project is checked against every project's secret, one HMAC each over its body
# in one pass; with more projects than this having a secret it must name its project (400 otherwise).
DISPATCHLAB_HOOK_UNNAMED_MAX_PROJECTS = env_int("DISPATCHLAB_HOOK_UNNAMED_MAX_PROJECTS", 8, minimum=1)

# ---- confirm runs on GPU hosts ----
# The worker stops a confirmed launch after this long; it must become ready within the second figure.
DISPATCHLAB_CONFIRM_TIME_LIMIT = env_int("DISPATCHLAB_CONFIRM_TIME_LIMIT", 1800, minimum=10)
DISPATCHLAB_CONFIRM_READY_TIMEOUT = env_int("DISPATCHLAB_CONFIRM_READY_TIMEOUT", 1200, minimum=5)
# The throughput measurement runs at 1 and at this many concurrent requests.
DISPATCHLAB_CONFIRM_CONCURRENCY = env_int("DISPATCHLAB_CONFIRM_CONCURRENCY", 4, minimum=1)
# Output of one launch kept beyond this is counted, not stored.
DISPATCHLAB_CONFIRM_MAX_OUTPUT_BYTES = env_int(
    "DISPATCHLAB_CONFIRM_MAX_OUTPUT_BYTES", 64 * 1024 * 1024, minimum=1024
)

# ---- notifications out (dispatchlab.notify: webhooks of a project) ----
# Links in the messages point here: the address people open the dashboard at.
DISPATCHLAB_NOTIFY_BASE_URL = env_str("DISPATCHLAB_NOTIFY_BASE_URL", "http://127.0.0.1:8000")
if not DISPATCHLAB_NOTIFY_BASE_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"DISPATCHLAB_NOTIFY_BASE_URL={DISPATCHLAB_NOTIFY_BASE_URL!r} must start with http:// or https://"
    )
# One attempt, from the name lookup to the answer's headers, ends after this many seconds in all (a
# server dribbling its answer cannot stretch it); the notify worker's pool kills it a little later.
DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS = env_float("DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS", 10.0)
# Attempts of one delivery; connection errors before the request was sent, HTTP 5xx and 429 are retried
# after base * 2^(n-1) seconds (half of it random): 4, 8, 16 ... about 8 minutes over 8 attempts.
DISPATCHLAB_NOTIFY_MAX_ATTEMPTS = env_int("DISPATCHLAB_NOTIFY_MAX_ATTEMPTS", 8, minimum=1)
DISPATCHLAB_NOTIFY_RETRY_BASE_SECONDS = env_float("DISPATCHLAB_NOTIFY_RETRY_BASE_SECONDS", 4.0)
# An endpoint whose deliveries failed this many times in a row pauses until a person resumes it.
DISPATCHLAB_NOTIFY_PAUSE_AFTER = env_int("DISPATCHLAB_NOTIFY_PAUSE_AFTER", 5, minimum=1)
if DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS <= 0 or DISPATCHLAB_NOTIFY_RETRY_BASE_SECONDS < 0:
    raise ImproperlyConfigured(
        "DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS must be above 0 and DISPATCHLAB_NOTIFY_RETRY_BASE_SECONDS "
        "not below 0"
    )
# Webhooks reach public addresses only; loopback, link-local, private and reserved ones only in these
# networks (CIDR, comma-separated: "10.20.0.0/16,fd12::/64" for a chat server inside). Cloud metadata
# addresses never (docs/security.md).
DISPATCHLAB_NOTIFY_ALLOW_NETWORKS = env_list("DISPATCHLAB_NOTIFY_ALLOW_NETWORKS", [])
try:
    parse_networks(DISPATCHLAB_NOTIFY_ALLOW_NETWORKS)
except ValueError as _bad_network:
    raise ImproperlyConfigured(f"DISPATCHLAB_NOTIFY_ALLOW_NETWORKS: {_bad_network}") from None
# The pool's limits of one delivery task: the soft one (below the hard one, or billiard arms only the
# soft timer and the global soft limit of a parse would apply) records the attempt as interrupted, the
# hard one kills the process.
DISPATCHLAB_NOTIFY_TASK_SOFT_TIME_LIMIT = math.ceil(DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS) + 5
DISPATCHLAB_NOTIFY_TASK_TIME_LIMIT = DISPATCHLAB_NOTIFY_TASK_SOFT_TIME_LIMIT + 10

# ---- Celery (read by dispatchlab/config/celery.py with namespace "CELERY") ----
BROKER_URL = env_secret("DISPATCHLAB_BROKER_URL") or DEFAULT_BROKER_URL
# Shared with the GPU worker (dispatchlab/messaging/broker.py): the filesystem transport with atomic
# message files under DATA_DIR/broker by default; on Redis an unacknowledged (acks_late) message comes
# back after the visibility timeout, above the hard time limit, so a long parse is never handed to a
# second worker while the first still runs.
_BROKER = broker_config(
    url=BROKER_URL,
    data_dir=DATA_DIR,
    poll_seconds=env_float("DISPATCHLAB_BROKER_POLL_SECONDS", 0.05),
    visibility_timeout=DISPATCHLAB_TASK_TIME_LIMIT + 600,
)
CELERY_BROKER_URL = BROKER_URL
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = dict(_BROKER.transport_options)
if _BROKER.transport:
    CELERY_BROKER_TRANSPORT = _BROKER.transport
CELERY_BROKER_TRANSPORT_OPTIONS.update(env_json("DISPATCHLAB_BROKER_OPTIONS", {}))
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = env_str("DISPATCHLAB_QUEUE", "dispatchlab")
CELERY_TASK_ALWAYS_EAGER = env_bool("DISPATCHLAB_EAGER_TASKS", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True  # status lives on the Report row: no result backend
# A task is acknowledged when it ends and given back when its process dies, so a killed worker's
# report is parsed again; the claim on the Report row keeps that safe.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_TASK_SOFT_TIME_LIMIT = DISPATCHLAB_TASK_SOFT_TIME_LIMIT
CELERY_TASK_TIME_LIMIT = DISPATCHLAB_TASK_TIME_LIMIT
# Parses are long and uneven: a worker process takes one message at a time.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Deliveries have a queue and workers of their own (`worker -Q <queue>.notify`): a slow endpoint holds
# a notify process, never one that parses.
DISPATCHLAB_NOTIFY_QUEUE = notify_queue(CELERY_TASK_DEFAULT_QUEUE)
CELERY_TASK_ROUTES = {
    "reports.*": {"queue": CELERY_TASK_DEFAULT_QUEUE},
    # Event subscribers (dispatchlab.events) run where reports are parsed: every run mode has that worker.
    "events.*": {"queue": CELERY_TASK_DEFAULT_QUEUE},
    "notify.*": {"queue": DISPATCHLAB_NOTIFY_QUEUE},
    # What GPU workers send back (dispatchlab.messaging.contract).
    "hosts.*": {"queue": CELERY_TASK_DEFAULT_QUEUE},
    "confirms.*": {"queue": CELERY_TASK_DEFAULT_QUEUE},
    "probes.*": {"queue": CELERY_TASK_DEFAULT_QUEUE},
    # The GPU worker (python -m worker) is fed by name on its own queues.
    "gpu.*": {"queue": "gpu"},
}
# Safety net for messages a broker lost: re-enqueue reports stuck in queued/parsing.
CELERY_BEAT_SCHEDULE = {
    "requeue-stale-deliveries": {"task": "notify.requeue_stale", "schedule": 60.0},
    "requeue-stale-reports": {
        "task": "reports.requeue_stale",
        "schedule": float(max(60, DISPATCHLAB_STALE_CLAIM_SECONDS // 2)),
    },
    "prune-old-reports": {
        "task": "reports.prune_expired",
        "schedule": float(env_int("DISPATCHLAB_RETENTION_EVERY_SECONDS", 3600, minimum=60)),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

# ---- cache (login rate limits): shared by every web process ----
# A Redis URL in production (DISPATCHLAB_CACHE_URL=redis://redis:6379/1); by default files under DATA_DIR,
# which every process of the embedded setup shares.
_CACHE_URL = env_secret("DISPATCHLAB_CACHE_URL") or ""
if _CACHE_URL.startswith(("redis://", "rediss://", "unix://")):
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _CACHE_URL}}
elif _CACHE_URL:
    raise ImproperlyConfigured(f"DISPATCHLAB_CACHE_URL={_CACHE_URL!r} must be a redis:// URL (or unset)")
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(DATA_DIR / "cache"),
        }
    }

# ---- logging ----
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("DISPATCHLAB_LOG_LEVEL", "INFO")},
    "loggers": {
        # Django's own console handler prints these when DEBUG is on: do not print them twice.
        "django": {"handlers": [], "level": "INFO"},
        "django.db.backends": {"level": "WARNING"},
    },
}

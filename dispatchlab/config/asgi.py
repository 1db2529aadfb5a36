"""ASGI entry point: the production web server, `uvicorn dispatchlab.config.asgi:application`.

Under ASGI a client that sends its body slowly holds a coroutine, not a worker (deploy/README.md);
`dispatchlab.stack` and docker-compose.yml run it this way, with `--http
dispatchlab.security.deadlines:DeadlineH11Protocol` (a request's headers have a deadline) and
`--no-proxy-headers` (a client's address is decided by DISPATCHLAB_TRUSTED_PROXIES, not by uvicorn).
Django's ASGI handler reads a whole request body before any middleware runs, so the header-only
refusals (unknown path, no credentials, body too large, webhook without a valid signature header) and
the limits on slow bodies, spooled bytes and requests in flight sit in front of it.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")
# Each request runs in a thread of its own: a pool per process bounds their database connections.
os.environ.setdefault("DISPATCHLAB_DB_POOL_SIZE", "16")

django_application = get_asgi_application()

from dispatchlab.security.early import EarlyRefusalASGI  # noqa: E402 - needs the apps loaded

application = EarlyRefusalASGI(django_application)

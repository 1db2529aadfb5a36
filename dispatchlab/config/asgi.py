"""ASGI entry point: the production web server, `uvicorn dispatchlab.config.asgi:application`.

Under ASGI a client that sends its body slowly holds a coroutine, not a worker (deploy/README.md);
`dispatchlab.stack` and docker-compose.yml run it this way. Django's ASGI handler reads a whole request
body before any middleware runs, so the header-only refusals (body too large, webhook without a valid
signature header) sit in front of it.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")

django_application = get_asgi_application()

from dispatchlab.security.early import EarlyRefusalASGI  # noqa: E402 - needs the apps loaded

application = EarlyRefusalASGI(django_application)

"""WSGI entry point, for WSGI servers. Do not expose gunicorn's sync workers to clients directly: a
few slow clients hold them all; production serves `dispatchlab.config.asgi` (deploy/README.md)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")

application = get_wsgi_application()

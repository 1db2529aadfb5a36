"""WSGI entry point: `gunicorn dispatchlab.config.wsgi`."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")

application = get_wsgi_application()

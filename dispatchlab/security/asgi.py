"""Django's ASGI application behind the header-only refusals of dispatchlab.security.early.

Django's ASGI handler reads a whole request body (to a temporary file) before any middleware runs, so
the checks must sit in front of it: serve `dispatchlab.security.asgi:application`, or wrap the
application in dispatchlab/config/asgi.py the same way.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")

django_application = get_asgi_application()

from dispatchlab.security.early import EarlyRefusalASGI  # noqa: E402 - needs the apps loaded

application = EarlyRefusalASGI(django_application)

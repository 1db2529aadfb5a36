"""Project configuration: settings, URLs, the Celery app, WSGI/ASGI entry points.

`celery -A dispatchlab.config worker` finds the Celery app here.
"""

from dispatchlab.config.celery import app as celery_app

__all__ = ["celery_app"]

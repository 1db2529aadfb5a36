"""The Celery app of the web side: `celery -A dispatchlab.config worker`.

Every setting (JSON only, acks_late, time limits, routes) is a CELERY_* value in settings.py. Messages
carry ids only and task state lives on the Report row, so there is no result backend. The broker is
DISPATCHLAB_BROKER_URL: kombu's filesystem transport by default, Redis in production.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")

app = Celery("dispatchlab")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["dispatchlab.reports"])

"""The Celery app of the web side: `celery -A dispatchlab.config worker`.

Every setting (JSON only, acks_late, time limits, routes) is a CELERY_* value in settings.py. Two kinds
of worker run it: the parsing one (`-Q dispatchlab`) and the notify one (`-Q dispatchlab.notify`), so
a slow webhook endpoint never holds a process that parses. Messages
carry ids only and task state lives on the Report row, so there is no result backend. The broker is
DISPATCHLAB_BROKER_URL: kombu's filesystem transport by default, Redis in production.
"""

from __future__ import annotations

import gc
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_process_init

from dispatchlab.notify import NOTIFY_QUEUE_SUFFIX

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")

app = Celery("dispatchlab")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(
    [
        "dispatchlab.events",
        "dispatchlab.reports",
        "dispatchlab.gpu",
        "dispatchlab.decisions",
        "dispatchlab.notify",
    ]
)

logger = logging.getLogger(__name__)

WARM_UP_LOG = "[2026-01-01 00:00:00] The server is fired up and ready to roll!\n"


@worker_init.connect
def _warm_up_before_fork(**kwargs: Any) -> None:
    """Compile the knowledge base once in the main process: the pool's processes inherit it by fork,
    so no report pays for it. Then freeze what is loaded so the garbage collector stops walking it.
    A worker that only sends notifications parses nothing: it skips the knowledge base."""
    consumed = list(app.amqp.queues.consume_from or {})  # the worker's --queues, selected by now
    if consumed and all(name.endswith(NOTIFY_QUEUE_SUFFIX) for name in consumed):
        gc.freeze()
        return
    started = time.monotonic()
    try:
        from dispatchlab.core import analyze_paths

        with tempfile.TemporaryDirectory(prefix="dispatchlab-warm-") as folder:
            path = Path(folder) / "warm-up.log"
            path.write_text(WARM_UP_LOG)
            analyze_paths([path])
    except Exception:  # a broken core must not stop the worker: each report will say what fails
        logger.exception("warming up the core failed")
    else:
        logger.info("core warmed up in %.2fs", time.monotonic() - started)
    gc.freeze()


@worker_process_init.connect
def _freeze_imports(**kwargs: Any) -> None:
    # Django, Celery and the core make a large heap that never dies: without this, every full
    # collection during a parse walks it (measured: +50% parse time for a 10 MB log).
    gc.freeze()

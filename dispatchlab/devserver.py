"""`python -m dispatchlab.devserver`: the whole dashboard on one machine, no services needed.

Migrates the database (SQLite under DISPATCHLAB_DATA_DIR unless DISPATCHLAB_DATABASE_URL says
otherwise), creates the first user and project when there is none and prints the login, then runs a
real Celery worker process (`celery -A dispatchlab.config worker`, with the embedded beat that
re-sends lost messages) on the configured broker (kombu's filesystem transport by default) beside
Django's development server. Ctrl-C stops both.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dispatchlab.devserver", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--addr", default="127.0.0.1:8000", help="address:port of the web server")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes parsing logs")
    parser.add_argument("--username", default="admin", help="login of the first user, when none exists")
    return parser.parse_args(argv)


def _stop(worker: subprocess.Popen[bytes], web: subprocess.Popen[bytes]) -> None:
    # The worker's main process alone: it stops its pool itself (signalling the pool's processes
    # directly can leave the main process waiting on them forever).
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    # runserver's autoreloader runs the server in a child process: stop the whole group.
    if web.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(web.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for process in (worker, web):
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")
    os.environ.setdefault("DISPATCHLAB_DEBUG", "true")

    import django
    from django.conf import settings
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=1)
    bootstrap = io.StringIO()
    call_command("bootstrap", username=args.username, stdout=bootstrap)
    print(bootstrap.getvalue(), end="", flush=True)

    signal.signal(signal.SIGTERM, _terminated)
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "dispatchlab.config", "worker", "--beat"),
            *("--loglevel", "INFO", "--concurrency", str(args.concurrency)),
        ],
        start_new_session=True,  # Ctrl-C reaches this process only; it stops the others in order
    )
    web = subprocess.Popen([sys.executable, "-m", "django", "runserver", args.addr], start_new_session=True)
    try:
        time.sleep(3)  # let both print their start-up lines first
        database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        broker = settings.CELERY_BROKER_URL.split("@")[-1]
        login = [line for line in bootstrap.getvalue().splitlines() if line.startswith("  ")]
        print(
            f"\ndispatchlab: http://{args.addr}/  (database: {database}, broker: {broker}, data: {settings.DATA_DIR})",
            *(
                login
                or [
                    "  log in with the existing user (`python manage.py changepassword NAME` sets a password)"
                ]
            ),
            "Ctrl-C stops the web server and the worker.\n",
            sep="\n",
            flush=True,
        )
        while worker.poll() is None and web.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping the web server and the worker…", flush=True)
        _stop(worker, web)
        return 0
    # One of them exited by itself: stop the other and report.
    _stop(worker, web)
    for name, process in (("worker", worker), ("web server", web)):
        if process.returncode:
            print(f"the {name} exited with status {process.returncode}", file=sys.stderr)
            return process.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())

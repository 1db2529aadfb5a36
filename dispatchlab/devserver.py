"""`python -m dispatchlab.devserver`: the whole dashboard on one machine, no services needed.

Migrates the database (SQLite under DISPATCHLAB_DATA_DIR unless DISPATCHLAB_DATABASE_URL says
otherwise), creates the first user and project when there is none and prints the login, then runs a
real Celery worker process (`celery -A dispatchlab.config worker`, with the embedded beat that
re-sends lost messages) on the configured broker (kombu's filesystem transport by default) beside
Django's development server. Ctrl-C stops both.
"""

from __future__ import annotations

import argparse
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


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")
    os.environ.setdefault("DISPATCHLAB_DEBUG", "true")

    import django
    from django.conf import settings
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=1)
    call_command("bootstrap", username=args.username)

    env = dict(os.environ)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "dispatchlab.config",
            "worker",
            "--beat",
            "--loglevel",
            "INFO",
            "--concurrency",
            str(args.concurrency),
        ],
        env=env,
    )
    web = subprocess.Popen([sys.executable, "-m", "django", "runserver", args.addr], env=env)
    processes = [worker, web]
    time.sleep(3)
    broker = settings.CELERY_BROKER_URL.split("@")[-1]
    print(
        f"\ndispatchlab: http://{args.addr}/  (database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, "
        f"broker: {broker}, data: {settings.DATA_DIR})\n"
        "The first run printed the login above; `python manage.py changepassword NAME` sets a new one.\n"
        "Ctrl-C stops the web server and the worker.\n",
        flush=True,
    )
    try:
        while all(process.poll() is None for process in processes):
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping the web server and the worker…", flush=True)
        _stop(processes)
        return 0
    # One of them exited by itself: stop the other and report.
    _stop(processes)
    for name, process in (("worker", worker), ("web server", web)):
        if process.returncode:
            print(f"the {name} exited with status {process.returncode}", file=sys.stderr)
            return process.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m dispatchlab.devserver`: the whole dashboard on one machine, no services needed.

Migrates the database (SQLite under DISPATCHLAB_DATA_DIR unless DISPATCHLAB_DATABASE_URL says
otherwise), creates the first user and project when there is none and prints the login, then starts
the stack of `dispatchlab.stack`: a real Celery worker process that parses (with the embedded beat that
re-sends lost messages), a notify worker that sends the webhooks on a queue of its own, both on the
configured broker (kombu's filesystem transport by default), and uvicorn serving the ASGI app, as
production does. DEBUG stays off unless DISPATCHLAB_DEBUG says otherwise (a missing
page must not list the URL patterns); WhiteNoise serves the static files, collected at start-up (when
they changed) under hashed names with gzip and Brotli copies and a long cache, as in production. Ctrl-C or SIGTERM stops
everything, also when the devserver was started with SIGINT ignored (`&` in a script).
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import time
from collections.abc import Sequence

from dispatchlab.messaging.broker import data_dir_from_env
from dispatchlab.stack import Stack, StackError, stack_env, start_stack


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dispatchlab.devserver", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--addr", default="127.0.0.1:8000", help="address:port of the web server")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes parsing logs")
    parser.add_argument(
        "--notify-concurrency", type=int, default=2, help="worker processes sending webhook notifications"
    )
    parser.add_argument("--username", default="admin", help="login of the first user, when none exists")
    return parser.parse_args(argv)


def _stop_requested(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _banner(args: argparse.Namespace, bootstrap: str) -> str:
    from django.conf import settings

    database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    broker = settings.CELERY_BROKER_URL.split("@")[-1]
    login = [line for line in bootstrap.splitlines() if line.startswith("  ")] or [
        "  log in with the existing user (`python manage.py changepassword NAME` sets a password)"
    ]
    return "\n".join(
        [
            f"\ndispatchlab: http://{args.addr}/  (database: {database}, broker: {broker}, data: {settings.DATA_DIR})",
            *login,
            "Ctrl-C stops the web server and the workers.\n",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    host, _, port = args.addr.rpartition(":")
    # Explicit handlers: a process started with SIGINT ignored keeps it ignored otherwise.
    signal.signal(signal.SIGINT, _stop_requested)
    signal.signal(signal.SIGTERM, _stop_requested)
    env = stack_env(data_dir=data_dir_from_env())
    if env["DISPATCHLAB_DEBUG"].lower() not in ("1", "true", "yes", "on"):
        # Hashed, compressed static files with a long cache, as production serves them (collected below).
        env.setdefault("DISPATCHLAB_STATIC_MANIFEST", "true")
    os.environ.update(env)

    import django
    from django.conf import settings
    from django.core.management import call_command

    from dispatchlab.config.staticfiles import collect_if_stale

    stack: Stack | None = None
    try:
        django.setup()
        call_command("migrate", interactive=False, verbosity=1)
        if settings.STATIC_MANIFEST and collect_if_stale():
            print(f"collected the static files into {settings.STATIC_ROOT}", flush=True)
        bootstrap = io.StringIO()
        call_command("bootstrap", username=args.username, stdout=bootstrap)
        print(bootstrap.getvalue(), end="", flush=True)
        stack = start_stack(
            env,
            host=host or "127.0.0.1",
            port=int(port),
            web_workers=1,
            concurrency=args.concurrency,
            notify_concurrency=args.notify_concurrency,
        )
        print(_banner(args, bootstrap.getvalue()), flush=True)
        while (exited := stack.exited()) is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("\nstopping the web server and the workers…", flush=True)
        if stack is not None:
            stack.close()
        return 0
    except StackError as error:
        print(f"dispatchlab: {error}", file=sys.stderr)
        return 1
    # One of them exited by itself: stop the others and report.
    status = stack.processes[exited].returncode
    stack.close()
    print(f"the {exited} process exited with status {status}", file=sys.stderr)
    return status or 1


if __name__ == "__main__":
    sys.exit(main())

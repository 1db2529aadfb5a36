"""Shared bits of the benchmark scripts: the test log and its size, a
scratch stack of the dashboard."""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
PYTHON = sys.executable


def log_from_args(description: str) -> tuple[argparse.Namespace, Path]:
    """The benchmarks' shared options: --size of the generated log, or --log to take one; --runs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="bytes, or with a unit: 100MB, 1GiB")
    parser.add_argument("--log", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    return args, args.log or ensure_log(int(args.size))


_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
}


def parse_size(text: str) -> int:
    """`1GiB`, `100MB`, `1e9` or `1073741824`: a size in bytes."""
    match = re.fullmatch(r"\s*([\d.e+]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 100MB or 1GiB)")
    try:
        return int(float(match.group(1)) * _UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 100MB or 1GiB)") from None


def ensure_log(size: int, seed: int = 1) -> Path:
    """Make (once) a realistic serving log of `size` bytes; reuse it on later runs."""
    from genlog import write_log

    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"serving-{size}-{seed}.log"
    if not path.exists():
        print(f"writing {path} ({size / 1e6:,.0f} MB) ...", file=sys.stderr)
        tmp = path.with_suffix(".tmp")
        write_log(tmp, size, seed)
        tmp.rename(path)
    return path


class BenchStack:
    """A scratch stack for a benchmark, started by `dispatchlab.stack` as the devserver and the pipeline
    tests start theirs: "embedded" (SQLite + the filesystem broker in `folder`) or "services" (a scratch
    database on this machine's PostgreSQL, a queue of its own on its Redis: DISPATCHLAB_TEST_POSTGRES_URL,
    DISPATCHLAB_TEST_REDIS_URL). `token` is a member's API token of project "bench"."""

    def __init__(
        self, kind: str, folder: Path, concurrency: int, *, web_workers: int = 2, beat: str = "none"
    ) -> None:
        from dispatchlab.stack import create_database, stack_env

        self.kind, self.folder = kind, folder
        self.run_id = secrets.token_hex(4)
        self.database: str | None = None
        self.admin_url = os.environ.get(
            "DISPATCHLAB_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        )
        self.env = stack_env(
            data_dir=folder,
            queue=f"dispatchlab-bench-{self.run_id}",
            DISPATCHLAB_SECRET_KEY=secrets.token_urlsafe(40),
            DISPATCHLAB_DEBUG="false",
            DISPATCHLAB_ALLOWED_HOSTS="127.0.0.1,localhost",
        )
        for name in ("DISPATCHLAB_DATABASE_URL", "DISPATCHLAB_BROKER_URL"):
            self.env.pop(name, None)
        if kind == "services":
            self.database = f"dispatchlab_bench_{self.run_id}"
            self.env["DISPATCHLAB_DATABASE_URL"] = create_database(self.admin_url, self.database)
            self.env["DISPATCHLAB_BROKER_URL"] = os.environ.get(
                "DISPATCHLAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"
            )
        self.running = None
        try:
            self._start(concurrency, web_workers, beat)
        except BaseException:
            self.close()
            raise

    def _start(self, concurrency: int, web_workers: int, beat: str) -> None:
        from dispatchlab.stack import StackError, start_stack

        self._manage("migrate", "-v0")
        self.token = self._manage(
            "apitoken", "--user", "bench", "--project", "bench", "--create"
        ).splitlines()[-1]
        try:
            self.running = start_stack(
                self.env,
                concurrency=concurrency,
                web_workers=web_workers,
                beat=beat,  # type: ignore[arg-type]
                worker_hostname=f"bench-{self.run_id}@%h",
                log_dir=self.folder,
            )
        except StackError as error:
            raise SystemExit(str(error)) from None
        self.base_url = self.running.base_url
        self.worker_log = self.running.logs["worker"]

    def _manage(self, *args: str) -> str:
        from dispatchlab.stack import StackError, manage

        try:
            return manage(self.env, *args).strip()
        except StackError as error:
            raise SystemExit(str(error)) from None

    def close(self) -> None:
        from dispatchlab.stack import drop_database, forget_redis_keys

        if self.running is not None:
            self.running.close()
        if self.database:
            drop_database(self.admin_url, self.database)
            forget_redis_keys(self.env["DISPATCHLAB_BROKER_URL"], self.run_id)

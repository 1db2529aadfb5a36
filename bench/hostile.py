"""Every probe of issue 16 that needs time, one after another, on this machine's PostgreSQL and Redis
(traffic to 127.0.0.1 only):

    python bench/hostile.py            # edge, notify, upload: each script's own figures, then what held

- bench/hostile_edge.py: 100 simultaneous signed webhooks, anonymous 500 MB bodies, parallel wrong logins;
- bench/hostile_notify.py: uploads beside an endpoint that answers a byte every 5 s, and a notify worker
  killed with SIGKILL mid-delivery;
- bench/hostile_upload.py: decompression bombs, a zip of 10,000 members against 1,000, a parse killed
  with SIGKILL.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBES = ("hostile_edge.py", "hostile_notify.py", "hostile_upload.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=[name.removesuffix(".py") for name in PROBES], action="append")
    args = parser.parse_args()
    chosen = [name for name in PROBES if not args.only or name.removesuffix(".py") in args.only]
    results: list[tuple[str, int, float]] = []
    for name in chosen:
        print(f"==== {name}", flush=True)
        started = time.monotonic()
        code = subprocess.run([sys.executable, str(HERE / name)], check=False).returncode
        results.append((name, code, time.monotonic() - started))
    print("==== summary")
    for name, code, seconds in results:
        print(f"{name:22} {'held' if code == 0 else f'FAILED (exit {code})':16} {seconds:7.1f} s")
    return 0 if all(code == 0 for _, code, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

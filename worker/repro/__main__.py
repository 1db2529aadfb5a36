"""`python -m worker.repro NAME ARGS...`: run a named repro program."""

from __future__ import annotations

import importlib
import sys

from worker.repro import REPRO_PROGRAMS


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in REPRO_PROGRAMS:
        print(f"usage: python -m worker.repro {{{','.join(REPRO_PROGRAMS)}}} ARGS...", file=sys.stderr)
        return 2
    program = importlib.import_module(REPRO_PROGRAMS[argv[0]])
    code: int = program.main(argv[1:])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Named repro programs: small servers that exercise one real kernel path the way a crashed server
did, for hosts where the server itself cannot be installed. `python -m worker.repro NAME ARGS...`.

Each program module has `build_parser() -> argparse.ArgumentParser` (the worker validates a launch's
flags against it, as it validates SGLang's against the flag catalog) and `main(argv) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

REPRO_MODELS_DIR = Path(__file__).parent / "models"
REPRO_PROGRAMS = {
    "moe-serve": "worker.repro.moe_serve",
}


def repro_parser(name: str) -> argparse.ArgumentParser | None:
    module_name = REPRO_PROGRAMS.get(name)
    if module_name is None:
        return None
    parser: argparse.ArgumentParser = importlib.import_module(module_name).build_parser()
    return parser

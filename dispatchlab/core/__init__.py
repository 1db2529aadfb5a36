"""The pure-Python core of dispatchlab: reading, parsing, matching, fingerprints, CLI.

Nothing here imports Django, Celery, pynvml, sglang or torch (tests/core/test_purity.py).
The web app, the Celery tasks and the CLI all call the functions re-exported here.
"""

from dispatchlab.core.api import LogReadError, ProgressCallback, analyze_paths, parse_paths

__all__ = ["LogReadError", "ProgressCallback", "analyze_paths", "parse_paths"]

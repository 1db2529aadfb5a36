"""Entry points of the core, shared by the CLI, the Celery service and the GPU worker."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dispatchlab.core.reading import LogReadError

# progress(bytes_done, bytes_total): bytes_total is None when unknown (stdin, compressed input)
ProgressCallback = Callable[[int, int | None], None]

__all__ = ["LogReadError", "ProgressCallback", "analyze_paths", "match_document", "parse_paths"]


def parse_paths(paths: Sequence[str | Path], *, progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Parse one or several logs (several files make one document, in the given order).

    Returns the JSON-able parsed document of docs/contract.md. Raises LogReadError with a one-line,
    human-readable reason when an input is not a readable log.
    """
    from dispatchlab.core.parser import parse_sources
    from dispatchlab.core.reading import open_sources

    return parse_sources(open_sources(paths), progress=progress).to_dict()


def analyze_paths(paths: Sequence[str | Path], *, progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Parse, then match the knowledge base: the `match` document of docs/contract.md."""
    from dispatchlab.core.matching import analyze_sources
    from dispatchlab.core.reading import open_sources

    return analyze_sources(open_sources(paths), progress=progress)


def match_document(document: dict[str, Any]) -> dict[str, Any]:
    """Match an already parsed document (no access to the log lines: evidence is what it kept)."""
    from dispatchlab.core.matching import match_parsed_document

    return match_parsed_document(document)

"""Entry points of the core, shared by the CLI, the Celery service and the GPU worker."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dispatchlab.core.parse.vocabulary import ProgressCallback
from dispatchlab.core.reading import LogReadError

__all__ = ["LogReadError", "ProgressCallback", "analyze_paths", "parse_paths"]


def parse_paths(paths: Sequence[str | Path], *, progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Parse one or several logs (several files make one document, in the given order).

    Returns the JSON-able parsed document of docs/contract.md. Raises LogReadError with a one-line,
    human-readable reason when an input is not a readable log.
    """
    from dispatchlab.core.parse import parse_sources
    from dispatchlab.core.reading import open_sources

    return parse_sources(open_sources(paths), progress=progress).to_dict()


def analyze_paths(
    paths: Sequence[str | Path],
    *,
    progress: ProgressCallback | None = None,
    line_index: tuple[str | Path, str | Path] | None = None,
) -> dict[str, Any]:
    """Parse, then match the knowledge base: the `match` document of docs/contract.md. With
    `line_index=(text_path, index_path)`, the same read writes the log viewer's text copy and index."""
    from dispatchlab.core.matching import analyze_sources
    from dispatchlab.core.reading import open_sources

    sources = open_sources(paths)
    if line_index is None:
        return analyze_sources(sources, progress=progress)
    from dispatchlab.core.lineindex import LineIndexWriter

    writer = LineIndexWriter(*line_index)
    try:
        return analyze_sources(sources, progress=progress, index=writer)
    finally:
        writer.close()

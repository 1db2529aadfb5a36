"""Shared helpers for the core tests (no Django, no services)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatchlab.core.reading import Source

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "logs"
GOLDEN = ROOT / "tests" / "fixtures" / "golden"
GENUINE = ROOT / "tests" / "fixtures" / "genuine"


def log_text(path: Path) -> str:
    """A fixture log's text, ending in a newline (files are joined into multi-run logs)."""
    text = path.read_text()
    return text if text.endswith("\n") else text + "\n"


def corpus_candidates(environ: os._Environ[str] | dict[str, str] = os.environ) -> list[Path]:
    """Where the real-log corpus may be: DISPATCHLAB_CORPUS, ../shared/corpus next to the repo,
    /work/shared/corpus; in that order."""
    chosen = environ.get("DISPATCHLAB_CORPUS", "").strip()
    defaults = [ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus")]
    return [Path(chosen), *defaults] if chosen else defaults


def find_corpus(environ: os._Environ[str] | dict[str, str] = os.environ) -> Path | None:
    return next((path for path in corpus_candidates(environ) if any(path.glob("*.log"))), None)


def in_ci() -> bool:
    """`.ci/run` exports DISPATCHLAB_CI=1: there a missing input is a broken run, not a skip."""
    return os.environ.get("DISPATCHLAB_CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def require_corpus() -> Path:
    """The corpus folder, or a skip where it is missing; in CI a missing corpus fails the run."""
    corpus = find_corpus()
    if corpus is not None:
        return corpus
    message = "no corpus of real logs in " + ", ".join(map(str, corpus_candidates()))
    if in_ci():
        pytest.fail(
            f"{message}; DISPATCHLAB_CI is set, so the corpus tests may not be skipped", pytrace=False
        )
    pytest.skip(message)


CORPUS = find_corpus() or ROOT.parent / "shared" / "corpus"

CONTRACT_FIELDS = {
    "server",
    "server_version",
    "model",
    "gpu",
    "server_args",
    "backends",
    "draft_backends",
    "timeline",
    "tracebacks",
    "kernels",
    "crash",
    "outcome",
}
MATCH_FIELDS = {"matches", "failure_class", "fingerprint"}


def text_source(text: str, name: str = "test.log") -> Source:
    data = text.encode("utf-8")
    return Source(name, lambda: io.BytesIO(data), len(data))


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatchlab.core.cli", *args],
        input=stdin.decode("utf-8", "replace") if stdin is not None else None,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def assert_contract_document(doc: dict[str, Any], *, matched: bool = False) -> None:
    missing = CONTRACT_FIELDS - set(doc)
    assert not missing, f"document lacks {missing}"
    assert doc["server"] in ("sglang", "vllm", "unknown")
    assert set(doc["gpu"]) >= {"name", "arch", "count"}
    assert doc["outcome"] in ("crashed", "ready", "serving", "incomplete")
    for event in doc["timeline"]:
        assert set(event) >= {"line", "time", "rank", "kind", "name", "detail"}
        assert event["kind"] in ("phase", "backend", "warning", "error", "metric")
    for tb in doc["tracebacks"]:
        assert set(tb) >= {"line", "rank", "exception", "message", "frames"}
        for frame in tb["frames"]:
            assert set(frame) == {"file", "line", "function"}
    if doc["crash"] is not None:
        assert set(doc["crash"]) >= {"line", "phase", "exception", "message"}
    assert all(isinstance(v, str) for v in doc["backends"].values())
    assert all(isinstance(v, str) for v in doc["draft_backends"].values())
    if matched:
        assert set(doc) >= MATCH_FIELDS
        assert isinstance(doc["fingerprint"], str) and len(doc["fingerprint"]) >= 8
        int(doc["fingerprint"], 16)
        for match in doc["matches"]:
            assert set(match) >= {
                "id",
                "title",
                "failure_class",
                "confidence",
                "lines",
                "facts",
                "fix",
                "decisions",
            }
            assert 0 <= match["confidence"] <= 1
            assert set(match["fix"]) >= {"summary", "args", "env", "tried_and_failed"}

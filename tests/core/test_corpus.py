"""Every real log of the corpus (DISPATCHLAB_CORPUS, ../shared/corpus or /work/shared/corpus) parses into a
contract-conforming document. Without the corpus these tests skip, except under DISPATCHLAB_CI=1, where
they fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatchlab.core import analyze_paths

from . import helpers
from .helpers import CORPUS, assert_contract_document, corpus_candidates, find_corpus, require_corpus, run_cli

LOGS = sorted(CORPUS.glob("*.log"))


@pytest.fixture
def corpus() -> Path:
    return require_corpus()


# Without the corpus one placeholder case remains, so the `corpus` fixture fails it in CI instead of pytest
# skipping an empty parameter set.
@pytest.mark.parametrize("log", LOGS or [None], ids=[p.stem for p in LOGS] or ["no-corpus"])
def test_a_real_log_gives_a_contract_document(corpus, log):
    assert_contract_document(analyze_paths([log]), matched=True)


def test_the_cli_parses_every_corpus_log_with_exit_code_0(corpus):
    for log in LOGS:
        result = run_cli("parse", str(log))
        assert result.returncode == 0, f"{log.name}: {result.stderr}"
        assert result.stdout.startswith("server ")


def test_eval_over_the_corpus_ends_with_the_accuracy_line(corpus):
    result = run_cli("eval", str(corpus))
    assert result.returncode == 0
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("accuracy: ")
    correct, total = map(int, last.removeprefix("accuracy: ").split("/"))
    assert total >= 20 and correct / total >= 0.9
    assert "false alarms on clean logs: 0/" in result.stdout


def test_the_corpus_is_found_from_dispatchlab_corpus_first(tmp_path):
    (tmp_path / "a.log").write_text("x\n")
    assert find_corpus({"DISPATCHLAB_CORPUS": str(tmp_path)}) == tmp_path
    assert corpus_candidates({})[-1] == Path("/work/shared/corpus")


def test_a_missing_corpus_fails_under_ci_and_skips_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("DISPATCHLAB_CORPUS", str(tmp_path))
    monkeypatch.setattr(helpers, "find_corpus", lambda environ=None: None)
    monkeypatch.setenv("DISPATCHLAB_CI", "1")
    with pytest.raises(pytest.fail.Exception, match="DISPATCHLAB_CI"):
        require_corpus()
    monkeypatch.setenv("DISPATCHLAB_CI", "0")
    with pytest.raises(pytest.skip.Exception):
        require_corpus()

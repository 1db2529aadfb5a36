"""Every real log of ../shared/corpus parses into a contract-conforming document (runs when the folder exists)."""

from __future__ import annotations

import pytest

from dispatchlab.core import analyze_paths

from .helpers import CORPUS, assert_contract_document, run_cli

LOGS = sorted(CORPUS.glob("*.log")) if CORPUS.exists() else []
pytestmark = pytest.mark.skipif(not LOGS, reason="../shared/corpus is not on this machine")


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_a_real_log_gives_a_contract_document(log):
    assert_contract_document(analyze_paths([log]), matched=True)


def test_the_cli_parses_every_corpus_log_with_exit_code_0():
    for log in LOGS:
        result = run_cli("parse", str(log))
        assert result.returncode == 0, f"{log.name}: {result.stderr}"
        assert result.stdout.startswith("server ")


def test_eval_over_the_corpus_ends_with_the_accuracy_line():
    result = run_cli("eval", str(CORPUS))
    assert result.returncode == 0
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("accuracy: ")
    correct, total = map(int, last.removeprefix("accuracy: ").split("/"))
    assert total >= 20 and correct / total >= 0.9
    assert "false alarms on clean logs: 0/" in result.stdout

"""`dispatchlab eval --loso`: a signature written from the case under test does not count for it."""

from __future__ import annotations

import json
from pathlib import Path

from dispatchlab.core.evaluate import score, signature_from_case
from dispatchlab.core.signatures import Example, Signature

from .helpers import require_corpus, run_cli

CRASH_LINE = "RuntimeError: CUDA error: unspecified launch failure while running fused_moe_kernel"


def signature(references: list[str], positive: str) -> Signature:
    return Signature(
        id="s", path="s.toml", title="t", failure_class="cuda_error", severity="critical", level="failure",
        explanation="e", references=references, any_patterns=["unspecified launch failure"], all_patterns=[],
        sequence=[], within=200, conditions={}, fix_summary="f", fix_args={}, fix_env={}, fix_by_server={},
        tried_and_failed=[], examples=[Example("match", positive, {}), Example("no_match", "other text here", {})],
    )  # fmt: skip


def case_lines(text: str) -> set[str]:
    from dispatchlab.core.evaluate import _lines_of

    return _lines_of(text)


def test_a_signature_citing_the_cases_thread_is_held_out():
    sig = signature(["owner/repo#12", "sglang:python/x.py"], "unrelated example line that is long enough")
    assert signature_from_case(sig, "owner/repo#12", set())
    assert not signature_from_case(sig, "owner/repo#13", set())


def test_a_signature_whose_example_is_a_line_of_the_case_is_held_out():
    sig = signature([], f"[2026-01-01 10:00:00 TP0] {CRASH_LINE}\n")
    log = f"noise\n[2025-05-05 01:02:03 TP3] {CRASH_LINE}\n"
    assert signature_from_case(sig, "", case_lines(log))
    assert not signature_from_case(
        sig, "", case_lines("RuntimeError: CUDA error: unspecified launch failure\n")
    )


def test_traceback_scaffolding_alone_does_not_tie_a_signature_to_a_case():
    scaffold = 'Traceback (most recent call last):\n  File "/usr/lib/python3.12/site-packages/torch/nn/modules/module.py", line 1\n'
    assert not signature_from_case(signature([], scaffold), "", case_lines(scaffold))


def test_per_class_precision_and_recall_count_accepted_classes():
    fields = {f: {"expected": None, "predicted": None} for f in ("server", "arch", "outcome")}
    cases = [
        {"expected": "oom", "predicted": "oom", "correct": True, "scored": True, "fields": fields},
        {"expected": "oom", "predicted": "other", "correct": False, "scored": True, "fields": fields},
        {"expected": "none", "predicted": "oom", "correct": False, "scored": True, "fields": fields},
    ]
    result = score(cases)
    assert result["per_class"]["oom"] == {"precision": 0.5, "recall": 0.5, "support": 2}
    assert (result["correct"], result["total"], result["false_alarms"]) == (1, 3, 1)


def _eval_json(*args: str) -> dict:
    result = run_cli("eval", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_loso_over_the_corpus_prints_the_per_class_table_and_its_accuracy_last():
    loso = run_cli("eval", "--loso", str(require_corpus()))
    assert loso.returncode == 0, loso.stderr
    assert "precision" in loso.stdout and "recall" in loso.stdout and "[held out: " in loso.stdout
    assert loso.stdout.strip().splitlines()[-1].startswith("accuracy: ")


def test_loso_scores_below_the_plain_eval_of_the_same_folders():
    """`--loso DIR` adds the repository's labelled fixtures (tests/fixtures/longtail): compare it with
    the plain eval of every folder it read, case by case, never with the plain eval of DIR alone."""
    loso = _eval_json("--loso", str(require_corpus()))
    plain: dict[str, dict] = {}
    for folder in loso["folders"]:
        plain |= {f"{Path(folder).name}/{case['case']}": case for case in _eval_json(folder)["cases"]}
    assert sorted(plain) == sorted(case["case"] for case in loso["cases"])
    plain_correct = sum(1 for case in plain.values() if case["scored"] and case["correct"])
    assert loso["total"] == sum(1 for case in plain.values() if case["scored"])
    assert loso["correct"] <= plain_correct
    held = [case for case in loso["cases"] if case["held_out"]]
    assert held, "no signature was held out for any case: the mode tested nothing"
    # a case with nothing held out runs against the whole knowledge base, as the plain eval does; the learned
    # fallback is retrained without the case's thread in LOSO, so a class it decides may differ
    for case in loso["cases"]:
        decided_by_model = "model" in (case["class_source"], plain[case["case"]]["class_source"])
        if not case["held_out"] and not decided_by_model:
            assert case["predicted"] == plain[case["case"]]["predicted"], case["case"]


def test_loso_reads_several_folders(tmp_path: Path):
    (tmp_path / "mine.log").write_text(f"[2026-01-01 10:00:00 TP0] {CRASH_LINE}\n")
    (tmp_path / "mine.json").write_text(json.dumps({"failure_class": "cuda_error", "source": "me/x#1"}))
    result = run_cli("eval", "--loso", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert next(c["case"] for c in data["cases"]) == f"{tmp_path.name}/mine"
    assert str(tmp_path) in data["folders"]

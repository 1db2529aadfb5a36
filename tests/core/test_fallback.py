"""The learned fallback: a class for the failures no rule explains, saying when it is unsure, never over a signature."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dispatchlab.core.evaluate import calibration, score
from dispatchlab.core.fallback import Model, load_model
from dispatchlab.core.matching import diagnose_sources
from dispatchlab.core.reading import open_sources

from .helpers import LOGS, ROOT, run_cli

CASES = ROOT / "tests" / "fixtures" / "cases"
CLASSES = ("cuda_error", "none", "oom")


def _certain(cls: str) -> Model:
    """A model sure of one class whatever the log says."""
    prior = tuple(0.0 if c == cls else -50.0 for c in CLASSES)
    return Model(CLASSES, prior, {}, temperature=1.0, threshold=0.5, alarm_threshold=0.5)


def _diagnose(path: Path, model: Model | None = None):  # type: ignore[no-untyped-def]
    return diagnose_sources(open_sources([path]), model=(lambda: model) if model else None)


def test_a_sure_model_never_overrides_the_signature_that_matched_at_the_crash():
    diagnosis = _diagnose(LOGS / "sglang_dsv4_eagle_sm120.log", _certain("oom"))
    assert diagnosis.failure_class == "arch_unsupported_kernel"
    assert diagnosis.class_source == "signature"
    assert not diagnosis.low_confidence


def test_a_crash_no_rule_explains_gets_other_with_low_confidence_and_best_guesses(tmp_path: Path):
    log = tmp_path / "one.log"
    log.write_text("RuntimeError: something nobody has seen before\n")
    doc = _diagnose(log).to_dict()
    assert doc["class_source"] == "model"
    assert doc["failure_class"] != "none"
    if doc["low_confidence"]:
        assert doc["failure_class"] == "other"
        assert len(doc["best_guesses"]) == 3
        assert all(g["class"] != "none" for g in doc["best_guesses"])
        # the guesses keep the model's probabilities; the confidence is that of `other` being right
        assert doc["best_guesses"][0]["probability"] < (load_model() or _certain("none")).threshold
        assert 0 < doc["class_confidence"] < 1


def test_a_crash_no_rule_explains_takes_the_models_class_when_it_is_sure(tmp_path: Path):
    log = tmp_path / "one.log"
    log.write_text("RuntimeError: something nobody has seen before\n")
    doc = _diagnose(log, _certain("cuda_error")).to_dict()
    assert (doc["failure_class"], doc["class_source"], doc["low_confidence"]) == (
        "cuda_error",
        "model",
        False,
    )


def test_a_clean_log_stays_none_even_with_a_model_sure_it_failed():
    diagnosis = _diagnose(LOGS / "sglang_h100_serving.log", _certain("cuda_error"))
    assert diagnosis.failure_class == "none"


def test_a_doubtful_none_on_a_log_that_never_served_says_so_with_its_best_guesses(tmp_path: Path):
    log = tmp_path / "cut.log"
    log.write_text("[2026-01-01 00:00:00] Load weight begin. avail mem=78.50 GB\n")
    doc = _diagnose(log, _certain("cuda_error")).to_dict()
    assert (doc["failure_class"], doc["low_confidence"]) == ("none", True)
    assert doc["best_guesses"][0]["class"] == "cuda_error"


def test_a_serving_log_is_not_doubted_whatever_the_model_thinks():
    doc = _diagnose(LOGS / "sglang_h100_serving.log", _certain("cuda_error")).to_dict()
    assert (doc["failure_class"], doc["low_confidence"], doc["best_guesses"]) == ("none", False, [])


def test_the_shipped_model_raises_no_false_alarm_on_the_clean_labelled_logs():
    assert load_model() is not None
    labels = {log: json.loads(log.with_suffix(".json").read_text()) for log in sorted(CASES.glob("*.log"))}
    clean = [log for log, label in labels.items() if label["failure_class"] == "none"]
    alarms = [
        log.stem
        for log in clean
        if (d := _diagnose(log)).class_source == "model"
        and d.failure_class not in {"none", *labels[log].get("accept", [])}
    ]
    assert clean and not alarms


def test_kb_train_rebuilds_a_byte_identical_model_from_the_same_cases(tmp_path: Path):
    data = tmp_path / "cases"
    data.mkdir()
    for log in sorted(CASES.glob("*.log"))[:24]:
        shutil.copy(log, data / log.name)
        shutil.copy(log.with_suffix(".json"), data / log.with_suffix(".json").name)
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert run_cli("kb", "train", str(data), "--out", str(first)).returncode == 0
    assert run_cli("kb", "train", str(data), "--out", str(second)).returncode == 0
    assert first.read_bytes() == second.read_bytes()
    model = json.loads(first.read_text())
    assert model["trained_on"] > 0 and 0 < model["threshold"] <= 1
    assert "signature" in model["calibration"]


def test_the_calibration_table_counts_every_scored_case_once():
    cases = [
        {"case": f"c{i}", "expected": "oom", "predicted": "oom", "correct": i % 3 != 0, "exact": True, "scored": i != 7,
         "top_match": None, "confidence": None if i == 5 else i / 12, "class_source": "model",
         "fields": {f: {"expected": None, "predicted": None} for f in ("server", "arch", "outcome")}}
        for i in range(13)
    ]  # fmt: skip
    table = calibration(cases)
    assert sum(row["count"] for row in table["bins"]) + table["without_confidence"] == 12
    assert table["without_confidence"] == 1
    assert 0 <= table["ece"] <= 1
    assert score(cases)["calibration"] == table


def test_the_shipped_model_and_index_are_what_kb_train_makes_from_the_repositorys_cases(tmp_path: Path):
    """A change to the parser, the cases or the trainer that is not followed by `dispatchlab kb train`
    would ship a model and an index of another time."""
    from dispatchlab.core.fallback import MODEL_PATH
    from dispatchlab.core.similar import INDEX_PATH

    out = tmp_path / MODEL_PATH.name
    assert run_cli("kb", "train", "--out", str(out)).returncode == 0
    assert out.read_bytes() == MODEL_PATH.read_bytes(), "run `dispatchlab kb train` and commit the model"
    assert (tmp_path / INDEX_PATH.name).read_bytes() == INDEX_PATH.read_bytes(), "run `dispatchlab kb train`"

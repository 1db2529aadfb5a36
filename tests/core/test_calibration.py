"""The confidence a document shows: for every kind of decision, the share of such decisions that were right."""

from __future__ import annotations

from pathlib import Path

from dispatchlab.core.evaluate import score
from dispatchlab.core.fallback import (
    DECISION_KINDS,
    Calibrator,
    Decision,
    features,
    fit_calibration,
    fit_calibrator,
    load_model,
)
from dispatchlab.core.matching import diagnose_sources, match_signatures
from dispatchlab.core.parse import parse_sources
from dispatchlab.core.reading import open_sources
from dispatchlab.core.signatures import load_knowledge_base

from .helpers import LOGS


def _monotone(c: Calibrator) -> bool:
    return list(c.at) == sorted(set(c.at)) and all(a <= b for a, b in zip(c.p, c.p[1:], strict=False))


def test_the_fitted_map_never_gives_a_higher_score_a_lower_probability():
    # right-or-wrong that is noisy and even falls at one point: isotonic pooling smooths it
    points = [(0.1, False), (0.2, True), (0.3, False), (0.5, True), (0.6, False), (0.7, True), (0.9, True)]
    calibrator = fit_calibrator(points, prior=0.5)
    assert _monotone(calibrator)
    assert calibrator(0.95) >= calibrator(0.55) >= calibrator(0.05)
    assert 0 < calibrator(0.0) < calibrator(1.0) < 1  # shrunk: a few right are not a certainty


def test_the_fitted_map_says_how_often_such_decisions_were_right():
    decisions = [Decision(f"t{i}", "signature", 0.9, i % 10 != 0) for i in range(200)]
    decisions += [Decision(f"u{i}", "none", 0.1, i % 2 == 0) for i in range(100)]
    maps = fit_calibration(decisions)
    assert abs(maps["signature"](0.9) - 0.9) < 0.01
    assert abs(maps["none"](0.1) - 0.5) < 0.02


def test_every_map_of_the_shipped_model_is_monotone_and_for_a_known_kind_of_decision():
    model = load_model()
    assert model is not None and model.calibration
    assert set(model.calibration) <= set(DECISION_KINDS)
    assert all(_monotone(c) for c in model.calibration.values())


def test_a_crash_a_signature_explains_shows_a_high_calibrated_confidence_and_is_never_unsure():
    model = load_model()
    assert model is not None
    log = LOGS / "sglang_dsv4_eagle_sm120.log"
    diagnosis = diagnose_sources(open_sources([log]))
    assert diagnosis.class_source == "signature" and not diagnosis.low_confidence
    raw = match_signatures(diagnosis.parsed, diagnosis.parsed.pattern_hits, load_knowledge_base())[
        0
    ].confidence
    assert diagnosis.class_confidence == model.calibration["signature"](raw)
    assert diagnosis.class_confidence is not None and diagnosis.class_confidence >= 0.9


def test_every_fixture_log_gets_a_confidence_for_its_class_even_a_clean_one():
    for log in sorted(LOGS.glob("*.log")):
        diagnosis = diagnose_sources(open_sources([log]))
        assert diagnosis.class_confidence is not None, log.name
        if diagnosis.failure_class == "none":
            assert diagnosis.class_confidence > 0.5, log.name


def test_the_reliability_table_is_given_per_kind_of_decision():
    cases = [
        {"case": f"c{i}", "expected": "oom", "predicted": "oom", "correct": i % 4 != 0, "exact": True,
         "scored": True, "top_match": None, "confidence": 0.75, "class_source": "signature",
         "kind": "signature" if i < 8 else "none",
         "fields": {f: {"expected": None, "predicted": None} for f in ("server", "arch", "outcome")}}
        for i in range(12)
    ]  # fmt: skip
    by_kind = score(cases)["calibration_by_kind"]
    assert set(by_kind) == {"signature", "none"}
    assert sum(r["count"] for r in by_kind["signature"]["bins"]) == 8
    assert by_kind["signature"]["ece"] == 0.0  # 6 of 8 right at 0.75


def test_the_fallback_reads_not_found_and_not_supported_as_word_pairs(tmp_path: Path):
    log = tmp_path / "one.log"
    log.write_text("RuntimeError: operator is not supported on this device\nkernel image not found\n")
    tokens = features(parse_sources(open_sources([log])))
    assert "not_supported" in tokens and "not_found" in tokens
    assert "not" not in tokens

"""`dispatchlab eval DIR`: match every X.log that has a label X.json and score the result.

`dispatchlab eval --loso DIR [DIR...]` scores the same way, leaving one source out at a time: for each
case, the signatures written from that case's own thread do not count. A signature counts as written from
a case when every one of its `match` examples comes from it, and an example comes from a case when

* the signature's `references` cite the case's thread (the label's `source`, `owner/repo#N`): a signature
  that cites a thread was written with that thread's log in view, so all its examples are taken as from it;
* or the example shares a line of 30 or more characters (log prefixes and traceback scaffolding left
  aside) with the case's log.

The learned fallback is held out the same way: each case is diagnosed by a model retrained without the
cases of its thread (`fallback.Counts`: naive Bayes, a subtraction of counts), on all labelled folders of the
evaluation. Its temperature and thresholds are fitted once on these out-of-fold predictions (three numbers).

Every case's `class_confidence` is then mapped by a calibration (`fallback.fit_calibration`, one isotonic map
per kind of decision) fitted on the out-of-fold decisions of the other threads only; `dispatchlab kb train`
fits the shipped maps on all of them (`out_of_fold_decisions`).

The figure is then what the knowledge base does for a log that no signature was modelled on."""

from __future__ import annotations

import importlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dispatchlab.core.fallback import (
    DECISION_KINDS,
    Calibrator,
    Decision,
    Model,
    decision_kind,
    fit_calibration,
)
from dispatchlab.core.matching import analyze_sources
from dispatchlab.core.reading import LogReadError, open_sources
from dispatchlab.core.records import replace
from dispatchlab.core.signatures import FAILURE_CLASSES, KnowledgeBase, Signature, load_knowledge_base

FIELDS = ("server", "arch", "outcome")
# Labelled real excerpts kept in the repository; `eval --loso` adds them when they are there.
FIXTURE_DIRS = (Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "longtail",)
SHARED_LINE_CHARS = 30
GENERIC_STARTS = ("Traceback (most recent call last)", 'File "', "The above exception", "During handling")
LOG_PREFIX = re.compile(
    r"^\s*(?:\[[^\]]{0,80}\]\s*|\([^)]{0,60}pid=\d+\)\s*|(?:INFO|WARNING|ERROR|DEBUG)\s+\S+\s+\S+\s*(?:\[[^\]]*\])?\s*)+"
)


def _labelled_logs(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    if not folder.is_dir():
        raise LogReadError(f"{folder}: not a directory")
    return [
        (log, json.loads(log.with_suffix(".json").read_text(encoding="utf-8")))
        for log in sorted(folder.glob("*.log"))
        if log.with_suffix(".json").exists()
    ]


def _run_case(
    log: Path, label: dict[str, Any], kb: KnowledgeBase, model: Callable[[], Model | None] | None = None
) -> dict[str, Any]:
    confidence: float | None = None
    class_source, kind = "rules", "rules"
    try:
        doc = analyze_sources(open_sources([log]), kb=kb, model=model)
        confidence, class_source = doc["class_confidence"], doc["class_source"]
        kind = decision_kind(
            class_source, doc["failure_class_source"], doc["failure_class"], doc["low_confidence"]
        )
        predicted = doc["failure_class"]
        facts = {
            "server": doc["server"] if doc["server"] != "unknown" else (doc.get("engine") or "unknown"),
            "arch": doc["gpu"]["arch"],
            "outcome": doc["outcome"],
        }
        top = doc["matches"][0]["id"] if doc["matches"] else None
    except LogReadError as error:
        predicted, facts, top = "other", {}, f"unreadable: {error}"
    expected = label.get("failure_class", "other")
    accepted = {expected, *label.get("accept", [])}
    return {
        "case": log.stem,
        "expected": expected,
        "predicted": predicted,
        "correct": predicted in accepted,
        "exact": predicted == expected,
        "scored": bool(label.get("scored", True)),
        "top_match": top,
        "confidence": confidence,
        "class_source": class_source,
        "kind": kind,
        "fields": {f: {"expected": label.get(f), "predicted": facts.get(f)} for f in FIELDS},
    }


def evaluate_directory(directory: str | Path) -> dict[str, Any]:
    kb = load_knowledge_base()
    return score([_run_case(log, label, kb) for log, label in _labelled_logs(Path(directory))])


def _lines_of(text: str) -> set[str]:
    """The distinctive lines of a text: long enough, and not the traceback scaffolding every Python
    crash prints (`Traceback (most recent call last):`, `File "..."` frames)."""
    lines = (LOG_PREFIX.sub("", line).strip() for line in text.splitlines())
    return {line for line in lines if len(line) >= SHARED_LINE_CHARS and not line.startswith(GENERIC_STARTS)}


def signature_from_case(signature: Signature, source: str, case_lines: set[str]) -> bool:
    """True when every `match` example of the signature comes from the case (see the module docstring)."""
    positives = [e for e in signature.examples if e.expect == "match"]
    if source and any(ref.strip().split()[0] == source for ref in signature.references if ref.strip()):
        return True
    return bool(positives) and all(_lines_of(e.log) & case_lines for e in positives)


def evaluate_leave_one_source_out(directories: list[str | Path]) -> dict[str, Any]:
    folders = [Path(d) for d in directories]
    folders += [d for d in FIXTURE_DIRS if d.is_dir() and d.resolve() not in {f.resolve() for f in folders}]
    cases = out_of_fold_cases(folders)
    decisions = [_decision(c) for c in cases]
    # each case's confidence is mapped by a calibration fitted without its own thread's decisions
    maps: dict[str, dict[str, Calibrator]] = {}
    for case in cases:
        thread = case["thread"]
        if thread not in maps:
            maps[thread] = fit_calibration(d for d in decisions if d.thread != thread and d.kind != "")
        calibrator = maps[thread].get(case["kind"])
        case["raw_confidence"] = case["confidence"]
        if calibrator is not None:
            case["confidence"] = calibrator(1.0 if case["confidence"] is None else case["confidence"])
    return {**score(cases), "folders": [str(f) for f in folders], **_similar_hit_rate(folders)}


def out_of_fold_decisions(folders: list[Path]) -> list[Decision]:
    """Every scored labelled case's decision, diagnosed without its thread's signatures and model counts:
    what `dispatchlab kb train` fits the calibration on."""
    return [d for d in map(_decision, out_of_fold_cases(folders)) if d.kind]


def _decision(case: dict[str, Any]) -> Decision:
    # an unscored case's label is not its log's: it neither fits nor tests the calibration (kind "")
    kind = case["kind"] if case["scored"] else ""
    return Decision(case["thread"], kind, case["confidence"], bool(case["correct"]))


def out_of_fold_cases(folders: list[Path]) -> list[dict[str, Any]]:
    """Each labelled case of the folders diagnosed leave-one-source-out, with raw (uncalibrated) confidences."""
    from dispatchlab.core import fallback

    kb = load_knowledge_base()
    examples = fallback.labelled_examples(folders)
    counts = fallback.Counts(sorted({e.label for e in examples}), examples)
    out_of_fold = fallback.out_of_fold(counts, examples)
    temperature = fallback.fit_temperature(counts.classes, out_of_fold)
    threshold, alarm = fallback.choose_thresholds(counts.classes, out_of_fold, temperature)
    by_source: dict[str, list[fallback.Example]] = defaultdict(list)
    for example in examples:
        by_source[example.source].append(example)
    subsets: dict[frozenset[str], KnowledgeBase] = {}
    cases: list[dict[str, Any]] = []
    for folder in folders:
        for log, label in _labelled_logs(folder):
            case_lines = _lines_of(log.read_text(encoding="utf-8", errors="replace"))
            source = str(label.get("source") or "")
            held_out = frozenset(s.id for s in kb.signatures if signature_from_case(s, source, case_lines))
            if held_out not in subsets:
                kept = [replace(s) for s in kb.signatures if s.id not in held_out]
                subsets[held_out] = KnowledgeBase.from_signatures(kept, f"{kb.digest}-loso")
            thread = str(label.get("source") or label.get("url") or log.stem)
            fold = counts.model(
                without=by_source.get(thread, []),
                temperature=temperature,
                threshold=threshold,
                alarm_threshold=alarm,
            )
            case = _run_case(log, label, subsets[held_out], _fixed(fold))
            cases.append(
                {**case, "case": f"{folder.name}/{log.stem}", "held_out": sorted(held_out), "thread": thread}
            )
    return cases


def _fixed(model: Model) -> Callable[[], Model]:
    return lambda: model


def _similar_hit_rate(folders: list[Path]) -> dict[str, Any]:
    """The similar-incidents measure, where `dispatchlab.core.similar` provides it."""
    try:
        similar = importlib.import_module("dispatchlab.core.similar")
    except ImportError:
        return {}
    measure = getattr(similar, "similar_hit_rate", None)
    return {"similar": measure(folders)} if measure else {}


def calibration(cases: list[dict[str, Any]], bins: int = 10) -> dict[str, Any]:
    """Reliability of `class_confidence` over the scored cases: per bin of confidence, how many cases, their
    mean confidence and how many were right; the expected calibration error; cases without a confidence
    (the rules' `none` or `other` that nothing scored) are counted apart."""
    scored = [c for c in cases if c["scored"]]
    rated = [c for c in scored if c.get("confidence") is not None]
    table = []
    for b in range(bins):
        low, high = b / bins, (b + 1) / bins
        inside = [
            c for c in rated if low <= c["confidence"] < high or (b == bins - 1 and c["confidence"] >= 1)
        ]
        mean = sum(c["confidence"] for c in inside) / len(inside) if inside else 0.0
        accuracy = sum(1 for c in inside if c["correct"]) / len(inside) if inside else 0.0
        table.append(
            {
                "low": low,
                "high": high,
                "count": len(inside),
                "confidence": round(mean, 3),
                "accuracy": round(accuracy, 3),
            }
        )
    ece = sum(row["count"] * abs(row["confidence"] - row["accuracy"]) for row in table) / (len(rated) or 1)
    return {"bins": table, "ece": round(ece, 4), "without_confidence": len(scored) - len(rated)}


def score(cases: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [c for c in cases if c["scored"]]
    classes = [c for c in FAILURE_CLASSES if any(x["expected"] == c or x["predicted"] == c for x in scored)]
    per_class: dict[str, dict[str, float | int]] = {}
    for cls in classes:
        tp = sum(1 for c in scored if c["predicted"] == cls and c["correct"] and c["expected"] == cls)
        predicted = sum(1 for c in scored if c["predicted"] == cls)
        actual = sum(1 for c in scored if c["expected"] == cls)
        per_class[cls] = {
            "precision": round(tp / predicted, 3) if predicted else 0.0,
            "recall": round(tp / actual, 3) if actual else 0.0,
            "support": actual,
        }
    confusion: dict[str, Counter[str]] = defaultdict(Counter)
    for c in scored:
        confusion[c["expected"]][c["predicted"]] += 1
    field_accuracy = {}
    for f in FIELDS:
        known = [c for c in cases if c["fields"][f]["expected"] is not None]
        right = sum(1 for c in known if str(c["fields"][f]["predicted"]) == str(c["fields"][f]["expected"]))
        field_accuracy[f] = {"correct": right, "total": len(known)}
    clean = [c for c in cases if c["expected"] == "none"]
    return {
        "cases": cases,
        "correct": sum(1 for c in scored if c["correct"]),
        "total": len(scored),
        "all_correct": sum(1 for c in cases if c["correct"]),
        "all_total": len(cases),
        "false_alarms": sum(1 for c in clean if not c["correct"]),
        "clean_logs": len(clean),
        "per_class": per_class,
        "confusion": {k: dict(v) for k, v in confusion.items()},
        "fields": field_accuracy,
        "calibration": calibration(cases),
        "model_calibration": calibration([c for c in cases if c.get("class_source") == "model"]),
        "calibration_by_kind": {
            kind: calibration([c for c in cases if c.get("kind") == kind])
            for kind in DECISION_KINDS
            if any(c.get("kind") == kind and c["scored"] for c in cases)
        },
    }


def render_evaluation(result: dict[str, Any]) -> str:
    out: list[str] = []
    for case in result["cases"]:
        mark = "ok " if case["correct"] else "BAD"
        scored = "" if case["scored"] else " (unscored)"
        held = f" [held out: {', '.join(case['held_out'])}]" if case.get("held_out") else ""
        out.append(
            f"{mark} {case['case']:<22} expected {case['expected']:<27} got {case['predicted']:<27} {case['top_match'] or ''}{scored}{held}"
        )
    out.append("")
    out.append(f"{'class':<28} {'precision':>9} {'recall':>7} {'support':>8}")
    for cls, row in result["per_class"].items():
        out.append(f"{cls:<28} {row['precision']:>9.2f} {row['recall']:>7.2f} {row['support']:>8}")
    out.append("")
    out.append("confusion (rows expected, columns predicted):")
    classes = list(result["per_class"])
    short = {c: c[:6] for c in classes}
    out.append(" " * 28 + " ".join(f"{short[c]:>6}" for c in classes))
    for expected in classes:
        row = result["confusion"].get(expected, {})
        out.append(f"{expected:<28}" + " ".join(f"{row.get(p, 0):>6}" for p in classes))
    out.append("")
    for field_name, acc in result["fields"].items():
        out.append(f"{field_name} accuracy: {acc['correct']}/{acc['total']}")
    out.append(f"false alarms on clean logs: {result['false_alarms']}/{result['clean_logs']}")
    out.append(f"all cases (scored and unscored): {result['all_correct']}/{result['all_total']}")
    cal = result["calibration"]
    out.append("")
    out.append("calibration of class_confidence (scored cases):")
    out.append(f"{'confidence':<12} {'count':>6} {'mean':>6} {'accuracy':>9}")
    for row in cal["bins"]:
        out.append(
            f"{row['low']:.1f}-{row['high']:.1f}     {row['count']:>6} {row['confidence']:>6.2f} {row['accuracy']:>9.2f}"
        )
    out.append(f"without a confidence: {cal['without_confidence']}")
    out.append(f"expected calibration error: {cal['ece']:.3f}")
    model_cal = result["model_calibration"]
    decided = sum(row["count"] for row in model_cal["bins"])
    out.append(
        f"expected calibration error of the learned fallback's {decided} decisions: {model_cal['ece']:.3f}"
    )
    out.append("")
    out.append("calibration per kind of decision (ECE over 10 bins; gap: |mean - accuracy| of the kind):")
    out.append(f"{'decided by':<14} {'count':>6} {'mean':>6} {'accuracy':>9} {'ECE':>6} {'gap':>6}")
    for kind, cal_kind in result.get("calibration_by_kind", {}).items():
        rows = [r for r in cal_kind["bins"] if r["count"]]
        n = sum(r["count"] for r in rows)
        mean = sum(r["count"] * r["confidence"] for r in rows) / (n or 1)
        acc = sum(r["count"] * r["accuracy"] for r in rows) / (n or 1)
        out.append(
            f"{kind:<14} {n:>6} {mean:>6.2f} {acc:>9.2f} {cal_kind['ece']:>6.3f} {abs(mean - acc):>6.3f}"
        )
    if "similar" in result:
        hit = result["similar"]
        out.append(f"similar incidents: top-3 class hit rate {hit['hits']}/{hit['total']}")
    if "folders" in result:
        out.append(f"leave-one-source-out over {', '.join(result['folders'])}")
    out.append(f"accuracy: {result['correct']}/{result['total']}")
    return "\n".join(out) + "\n"

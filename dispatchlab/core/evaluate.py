"""`dispatchlab eval DIR`: match every X.log that has a label X.json and score the result."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from dispatchlab.core.matching import analyze_sources
from dispatchlab.core.reading import LogReadError, open_sources
from dispatchlab.core.signatures import FAILURE_CLASSES, load_knowledge_base

FIELDS = ("server", "arch", "outcome")


def evaluate_directory(directory: str | Path) -> dict[str, Any]:
    folder = Path(directory)
    if not folder.is_dir():
        raise LogReadError(f"{directory}: not a directory")
    kb = load_knowledge_base()
    cases: list[dict[str, Any]] = []
    for log in sorted(folder.glob("*.log")):
        label_path = log.with_suffix(".json")
        if not label_path.exists():
            continue
        label = json.loads(label_path.read_text(encoding="utf-8"))
        try:
            doc = analyze_sources(open_sources([log]), kb=kb)
            predicted = doc["failure_class"]
            facts = {
                "server": doc["server"] if doc["server"] != "unknown" else doc.get("engine"),
                "arch": doc["gpu"]["arch"],
                "outcome": doc["outcome"],
            }
            top = doc["matches"][0]["id"] if doc["matches"] else None
        except LogReadError as error:
            predicted, facts, top = "other", {}, f"unreadable: {error}"
        expected = label.get("failure_class", "other")
        accepted = {expected, *label.get("accept", [])}
        cases.append(
            {
                "case": log.stem,
                "expected": expected,
                "predicted": predicted,
                "correct": predicted in accepted,
                "exact": predicted == expected,
                "scored": bool(label.get("scored", True)),
                "top_match": top,
                "fields": {f: {"expected": label.get(f), "predicted": facts.get(f)} for f in FIELDS},
            }
        )
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
    }


def render_evaluation(result: dict[str, Any]) -> str:
    out: list[str] = []
    for case in result["cases"]:
        mark = "ok " if case["correct"] else "BAD"
        scored = "" if case["scored"] else " (unscored)"
        out.append(
            f"{mark} {case['case']:<22} expected {case['expected']:<27} got {case['predicted']:<27} {case['top_match'] or ''}{scored}"
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
    out.append(f"accuracy: {result['correct']}/{result['total']}")
    return "\n".join(out) + "\n"

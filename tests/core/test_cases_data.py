"""The labelled real cases (tests/fixtures/cases, cases-locked) stay usable and the locked split stays
locked: every label names a class of the taxonomy and its thread, every log is there, no thread is in
both folders, and the locked files are exactly those of its manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from dispatchlab.core.signatures import FAILURE_CLASSES as CLASSES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = FIXTURES / "cases"
LOCKED = FIXTURES / "cases-locked"
LOCKED_MANIFEST_SHA256 = "48cd6f5dead4b7d158fdaa8122070a2882c71aa33edae0b7d1d8507e51c7e1c7"
REQUIRED = ("source", "title", "server", "failure_class", "accept", "scored", "outcome", "key_signature")


def _labels(folder: Path) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def _thread(label: dict) -> str:
    return str(label.get("source") or label.get("url")).rstrip("/").lower()


@pytest.mark.parametrize("folder", [CASES, LOCKED], ids=["cases", "cases-locked"])
def test_every_case_has_its_log_a_thread_url_and_a_class_of_the_taxonomy(folder: Path):
    labels = _labels(folder)
    assert labels
    for slug, label in labels.items():
        missing = [name for name in REQUIRED if name not in label]
        assert not missing, f"{slug}: no {missing}"
        assert _thread(label).startswith("https://github.com/"), slug
        assert label["failure_class"] in CLASSES, f"{slug}: {label['failure_class']}"
        assert set(label["accept"]) <= set(CLASSES), f"{slug}: {label['accept']}"
        assert (folder / f"{slug}.log").read_text(errors="replace").strip(), f"{slug}: empty log"


def test_there_are_at_least_400_cases_and_every_class_has_15():
    labels = [*_labels(CASES).values(), *_labels(LOCKED).values()]
    assert len(labels) >= 400
    per_class = {name: sum(label["failure_class"] == name for label in labels) for name in CLASSES}
    assert min(per_class.values()) >= 15, per_class


def test_no_thread_is_in_both_the_tuning_data_and_the_locked_split():
    tuning = {_thread(label) for label in _labels(CASES).values()}
    locked = {_thread(label) for label in _labels(LOCKED).values()}
    assert not tuning & locked


def test_the_locked_split_is_exactly_its_manifest():
    manifest = (LOCKED / "MANIFEST.sha256").read_text()
    assert hashlib.sha256(manifest.encode()).hexdigest() == LOCKED_MANIFEST_SHA256
    listed = dict(reversed(line.split("  ", 1)) for line in manifest.splitlines())
    present = {path.name for path in LOCKED.iterdir() if path.suffix in (".log", ".json")}
    assert present == set(listed)
    for name, digest in listed.items():
        assert hashlib.sha256((LOCKED / name).read_bytes()).hexdigest() == digest, f"{name} changed"

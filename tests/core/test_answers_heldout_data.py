"""The second held-out answer set (tests/fixtures/answers-heldout) stays usable for scoring the garbage
detector: every answer has a text, a garbage/clean label and a public source URL, no source is
quoted more than three times, and no source thread is shared with the spent set
(tests/fixtures/answers), which would leak tuning data into the evaluation."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HELDOUT = FIXTURES / "answers-heldout"
SPENT = FIXTURES / "answers"
REQUIRED = ("text", "label", "source", "title", "model", "server", "why", "tags")
SERVERS = {"sglang", "vllm", "trtllm", "llama.cpp", "other", None}


def _answers(folder: Path) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def _thread(answer: dict) -> str:
    """The thread or page an answer was quoted from: no comment anchor, no pinned commit."""
    url = answer["source"].split("#")[0].rstrip("/").lower()
    parts = url.split("/")
    if len(parts) > 6 and parts[5] == "blob":
        parts[6] = "*"
    return "/".join(parts)


def test_every_heldout_answer_has_a_text_a_label_and_a_public_source():
    answers = _answers(HELDOUT)
    assert answers
    for slug, answer in answers.items():
        missing = [name for name in REQUIRED if name not in answer]
        assert not missing, f"{slug}: no {missing}"
        assert isinstance(answer["text"], str) and answer["text"], slug
        assert answer["label"] in {"garbage", "clean"}, f"{slug}: {answer['label']}"
        assert answer["source"].startswith("https://"), slug
        assert answer["server"] in SERVERS, f"{slug}: {answer['server']}"
        assert isinstance(answer["tags"], list) and answer["tags"], slug


def test_heldout_set_has_both_labels_and_at_most_three_answers_per_source():
    answers = _answers(HELDOUT).values()
    assert {answer["label"] for answer in answers} == {"garbage", "clean"}
    crowded = {thread: n for thread, n in Counter(map(_thread, answers)).items() if n > 3}
    assert not crowded, crowded


def test_no_heldout_source_thread_or_text_comes_from_the_spent_set():
    spent = _answers(SPENT).values()
    spent_threads = {_thread(answer) for answer in spent}
    spent_texts = {" ".join(answer["text"].split()) for answer in spent}
    for slug, answer in _answers(HELDOUT).items():
        assert _thread(answer) not in spent_threads, f"{slug}: thread already in tests/fixtures/answers"
        assert " ".join(answer["text"].split()) not in spent_texts, (
            f"{slug}: text already in tests/fixtures/answers"
        )

"""The garbage bench counts what it says: confusion counts, precision and recall for 'garbage', the
same by tag, on tiny folders made here (never on the held-out answers, which the bench alone reads)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from garbage_detector import Answer, Counts, load_answers, score  # noqa: E402


def _write(folder: Path, slug: str, text: str, label: str, tags: list[str]) -> None:
    record = {"text": text, "label": label, "source": "https://example.org/made-up", "tags": tags}
    (folder / f"{slug}.json").write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")


def test_precision_and_recall_come_out_as_counted_by_hand():
    # 5 garbage (3 flagged, 2 missed), 5 clean (1 flagged): precision 3/4, recall 3/5.
    answers = [Answer(f"g{n}", f"g{n}", True, ("loop",) if n < 2 else ("salad",)) for n in range(5)]
    answers += [Answer(f"c{n}", f"c{n}", False, ("loop",) if n == 0 else ("code",)) for n in range(5)]
    flagged = {"g0", "g2", "g3", "c0"}
    result = score(
        answers, judge=lambda text: (text in flagged, "repeated_token" if text in flagged else None)
    )
    overall = result.overall
    assert (overall.tp, overall.fn, overall.fp, overall.tn) == (3, 2, 1, 4)
    assert overall.precision == pytest.approx(0.75)
    assert overall.recall == pytest.approx(0.6)
    assert overall.f1 == pytest.approx(2 * 0.75 * 0.6 / 1.35)
    assert overall.false_alarm_rate == pytest.approx(0.2)
    loop = result.by_tag["loop"]
    assert (loop.tp, loop.fn, loop.fp, loop.tn) == (1, 1, 1, 0)
    salad = result.by_tag["salad"]
    assert (salad.tp, salad.fn, salad.fp, salad.tn) == (2, 1, 0, 0)
    assert result.by_kind == {"repeated_token": {"tp": 3, "fp": 1}}


def test_precision_is_not_a_number_when_nothing_is_flagged():
    counts = Counts(tp=0, fn=4, fp=0, tn=6)
    assert counts.precision is None and counts.recall == 0.0
    assert counts.to_dict()["precision"] is None


def test_the_script_scores_a_folder_prints_the_figures_and_writes_the_same_json(tmp_path: Path):
    answers = tmp_path / "answers"
    answers.mkdir()
    _write(answers, "bang", "!" * 60, "garbage", ["exclamation"])
    _write(answers, "loop", "The answer is" + " the" * 30, "garbage", ["loop"])
    _write(answers, "paris", "The capital of France is Paris.", "clean", ["english"])
    _write(answers, "code", "```python\nprint(sum(range(10)))\n```\nIt prints 45.", "clean", ["code"])
    (answers / "README.md").write_text("# not an answer\n")
    out = tmp_path / "out" / "garbage.json"
    run = subprocess.run(
        [sys.executable, str(BENCH / "garbage_detector.py"), str(answers), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "precision 1.000   recall 1.000" in run.stdout
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["answers"] == 4
    assert written["overall"] == {
        "tp": 2,
        "fn": 0,
        "fp": 0,
        "tn": 2,
        "garbage": 2,
        "clean": 2,
        "precision": 1.0,
        "recall": 1.0,
        "f1": 1.0,
        "false_alarm_rate": 0.0,
    }
    assert written["by_tag"]["english"]["tn"] == 1
    assert json.loads(run.stdout[run.stdout.index("\n{") :]) == written


def test_a_file_without_a_label_stops_the_bench(tmp_path: Path):
    _write(tmp_path, "odd", "Paris.", "fine", [])
    with pytest.raises(ValueError, match="label"):
        load_answers(tmp_path)
    run = subprocess.run(
        [sys.executable, str(BENCH / "garbage_detector.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2 and "label" in run.stderr

"""The report page says how sure the diagnosis is, and says so loudest when it is doubtful."""

from __future__ import annotations

import copy

from django.urls import reverse
from fixtures_docs import CRASH_DOC
from test_pages import Cast, login


def _page(client, cast: Cast, **fields: object) -> str:
    doc = copy.deepcopy(CRASH_DOC)
    doc.update(fields)
    report = cast.report(doc, title="confidence")
    login(client, cast.alice)
    return client.get(reverse("front:report", args=[report.pk])).content.decode()


def test_a_class_from_the_learned_fallback_says_so_with_its_confidence(client, db, tmp_path):
    html = _page(client, Cast(tmp_path), class_source="model", class_confidence=0.87, low_confidence=False)
    assert "from the learned fallback" in html and "confidence 0.87" in html
    assert "low confidence" not in html


def test_a_doubtful_none_shows_low_confidence_and_the_best_guesses(client, db, tmp_path):
    html = _page(
        client,
        Cast(tmp_path),
        failure_class="none",
        class_source="rules",
        class_confidence=0.22,
        low_confidence=True,
        best_guesses=[{"class": "timeout_hang", "probability": 0.41}, {"class": "none", "probability": 0.3}],
    )
    assert "low confidence" in html and "the log never shows the server answering" in html
    assert "timeout_hang" in html and "0.41" in html

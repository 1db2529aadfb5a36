"""The report page of a file that holds several runs says how they ended."""

from __future__ import annotations

import copy

from django.urls import reverse
from fixtures_docs import CRASH_DOC, XSS
from test_pages import Cast, login


def _run(index: int, first: int, last: int, **ending: object) -> dict:
    run = {"index": index, "first_line": first, "last_line": last, "crash_line": None, "phase": None}
    run.update({"outcome": "crashed", "exception": None, "fingerprint": "a" * 16, "message": None})
    run.update(ending)
    return run


def _page(client, cast: Cast, runs: list[dict]) -> str:
    doc = copy.deepcopy(CRASH_DOC)
    doc["runs"] = runs
    report = cast.report(doc, title="crash loop")
    login(client, cast.alice)
    return client.get(reverse("front:report", args=[report.pk])).content.decode()


def test_a_crash_loop_says_all_its_runs_crashed_the_same_way(client, db, tmp_path):
    cast = Cast(tmp_path)
    oom = {"exception": "torch.OutOfMemoryError", "message": "CUDA out of memory", "crash_line": 6}
    html = _page(client, cast, [_run(1, 1, 17, **oom), _run(2, 18, 34, **oom), _run(3, 35, 51, **oom)])
    assert "3 runs, all crashed the same way" in html
    assert "the diagnosis is run 3's, lines 35-51" in html


def test_the_page_names_the_run_that_ended_differently_and_how(client, db, tmp_path):
    cast = Cast(tmp_path)
    crashed = {"exception": "RuntimeError", "message": XSS, "crash_line": 12, "phase": "cuda_graph_capture"}
    html = _page(
        client,
        cast,
        [
            _run(1, 1, 30, **crashed),
            _run(2, 31, 60, **crashed),
            _run(3, 61, 90, outcome="serving", fingerprint="b" * 16),
        ],
    )
    assert "3 runs ended 2 different ways" in html
    assert "in cuda graph capture" in html and "RuntimeError" in html
    assert 'outcome-serving">serving</span>' in html
    assert "<script>alert(1)" not in html


def test_a_file_of_one_run_shows_no_runs_section(client, db, tmp_path):
    cast = Cast(tmp_path)
    report = cast.report(CRASH_DOC, title="one run")
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    assert 'id="runs"' not in html

"""The report page reads a crash against the last good run of the same launch (issue #21, item 6)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from dispatchlab.reports.analysis import report_analyze
from dispatchlab.reports.last_good import last_good_report
from dispatchlab.reports.models import Report
from dispatchlab.reports.submit import report_create

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "lastgood"


def _analysed(project, user, name: str, *, days_ago: int) -> Report:
    upload = SimpleUploadedFile(name, (LOGS / name).read_bytes())
    report = report_create(project=project, user=user, files=[upload], title=name)
    report_analyze(report_id=report.pk)
    Report.objects.filter(pk=report.pk).update(created_at=timezone.now() - timedelta(days=days_ago))
    report.refresh_from_db()
    assert report.status == Report.Status.DONE, report.error
    return report


def _serving(make_report, make_document, project, *, days_ago: int, **overrides) -> Report:
    document = make_document(outcome="serving", crash=None, matches=[], failure_class="none", **overrides)
    report = make_report(project, document=document, title="Qwen3 serving")
    Report.objects.filter(pk=report.pk).update(created_at=timezone.now() - timedelta(days=days_ago))
    report.refresh_from_db()
    return report


def _panel(client, report: Report) -> str:
    html = client.get(f"/reports/{report.pk}/").content.decode()
    found = re.search(r'<section class="panel" id="last-good">.*?</section>', html, re.S)
    return found.group(0) if found else ""


def test_a_crash_shows_what_changed_since_the_last_good_run_and_the_lines_it_never_printed(
    alice_client, alice, acme
):
    good = _analysed(acme, alice, "good.log", days_ago=4)
    crash = _analysed(acme, alice, "crash.log", days_ago=0)
    assert (good.outcome, crash.outcome) == ("serving", "crashed")

    panel = _panel(alice_client, crash)
    assert f'href="/reports/{good.pk}/"' in panel
    assert re.search(
        r"<code>mem_fraction_static</code></th><td><code>0.85</code></td><td><code[^>]*>0.92</code>", panel
    )
    # lines both runs print (with other times, sizes and pids) are not new; the crash's own lines are
    assert "Load weight end" not in panel
    assert "KV Cache is allocated" not in panel
    assert "torch.OutOfMemoryError: CUDA out of memory" in panel
    assert "Received sigquit from a child process" in panel
    out_of_memory = next(
        n
        for n, line in enumerate((LOGS / "crash.log").read_text().splitlines(), 1)
        if "OutOfMemoryError:" in line
    )
    assert f'href="/reports/{crash.pk}/log/?line={out_of_memory}#L{out_of_memory}"' in panel


def test_a_crash_without_a_good_run_before_it_shows_no_panel(alice_client, alice, acme):
    crash = _analysed(acme, alice, "crash.log", days_ago=3)
    _analysed(acme, alice, "good.log", days_ago=0)  # came up later: the fix, not a predecessor
    assert _panel(alice_client, crash) == ""
    assert alice_client.get(f"/reports/{crash.pk}/").status_code == 200


def test_the_good_run_is_the_most_recent_clean_run_of_the_same_model_and_server(
    make_report, make_document, acme
):
    older = _serving(make_report, make_document, acme, days_ago=9)
    newer = _serving(make_report, make_document, acme, days_ago=2)
    _serving(make_report, make_document, acme, days_ago=1, model="meta-llama/Llama-3.1-8B")
    _serving(make_report, make_document, acme, days_ago=1, server="vllm")
    crash = make_report(acme, document=make_document())
    assert older != newer
    assert last_good_report(crash) == newer


def test_a_good_run_on_the_crashs_own_arch_comes_before_a_newer_one_elsewhere(
    make_report, make_document, acme
):
    same_arch = _serving(make_report, make_document, acme, days_ago=5)
    _serving(
        make_report,
        make_document,
        acme,
        days_ago=1,
        gpu={"name": "NVIDIA B200", "arch": "sm_100", "count": 8},
    )
    crash = make_report(acme, document=make_document())
    assert last_good_report(crash) == same_arch


def test_a_good_run_of_another_project_is_never_shown(
    alice_client, make_report, make_document, acme, umbrella
):
    _serving(make_report, make_document, umbrella, days_ago=2)
    crash = make_report(acme, document=make_document())
    assert _panel(alice_client, crash) == ""


@pytest.mark.parametrize("outcome", ["serving", "incomplete"])
def test_a_report_that_did_not_crash_is_not_compared(make_report, make_document, acme, outcome):
    _serving(make_report, make_document, acme, days_ago=2)
    report = make_report(acme, document=make_document(outcome=outcome, crash=None))
    assert last_good_report(report) is None


def test_the_panel_says_when_the_setup_is_the_same(alice_client, make_report, make_document, acme):
    _serving(make_report, make_document, acme, days_ago=2)
    crash = make_report(acme, document=make_document())
    panel = _panel(alice_client, crash)
    assert "Same arguments, versions and resolved backends as the good run." in panel

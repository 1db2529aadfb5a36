"""Retention: reports older than their project's retention are deleted by beat's task, with their files;
decision records that name them stay."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from django.conf import settings as django_settings
from django.core.files.storage import default_storage
from django.utils import timezone

from dispatchlab.decisions.models import Decision
from dispatchlab.decisions.services import decision_create
from dispatchlab.reports.models import FailureGroup, Project, Report
from dispatchlab.reports.submit import report_submit
from dispatchlab.reports.tasks import reports_prune_expired_task


def aged(report: Report, days: int) -> Report:
    Report.objects.filter(id=report.id).update(created_at=timezone.now() - timedelta(days=days))
    return report


def test_beat_runs_the_pruning_task():
    entry = django_settings.CELERY_BEAT_SCHEDULE["prune-old-reports"]
    assert entry["task"] == reports_prune_expired_task.name


def test_old_reports_and_their_files_go_new_ones_and_decisions_stay(
    alice, acme, make_upload, settings, django_capture_on_commit_callbacks
):
    settings.DISPATCHLAB_RETENTION_DAYS = 30
    with django_capture_on_commit_callbacks(execute=True):
        old, _ = report_submit(project=acme, user=alice, files=[make_upload()])
        new, _ = report_submit(project=acme, user=alice, files=[make_upload("b.log", b"INFO fine\n")])
    old.refresh_from_db()
    files, text = [item.file.name for item in old.files.all()], old.text_path
    decision = decision_create(
        project=acme, user=alice, data={"title": "keep me", "links": {"reports": [old.id]}}
    )
    aged(old, 31)
    aged(new, 29)
    assert reports_prune_expired_task() == 1
    assert list(Report.objects.values_list("id", flat=True)) == [new.id]
    assert not any(default_storage.exists(name) for name in files)
    assert text and not Path(text).exists()
    assert Decision.objects.filter(id=decision.id).exists()
    assert not FailureGroup.objects.filter(reports__isnull=True).exists()


def test_zero_keeps_forever_and_a_projects_own_setting_wins(acme, umbrella, make_report, settings):
    settings.DISPATCHLAB_RETENTION_DAYS = 0
    kept = aged(make_report(acme), 4000)
    Project.objects.filter(id=umbrella.id).update(retention_days=7)
    pruned = aged(make_report(umbrella), 8)
    assert reports_prune_expired_task() == 1
    assert Report.objects.filter(id=kept.id).exists() and not Report.objects.filter(id=pruned.id).exists()


def test_a_report_being_parsed_waits_for_the_next_run(acme, make_report, settings):
    settings.DISPATCHLAB_RETENTION_DAYS = 1
    busy = aged(make_report(acme, status=Report.Status.PARSING), 5)
    assert reports_prune_expired_task() == 0
    assert Report.objects.filter(id=busy.id).exists()


def left_by_a_stopped_parse(report_id: int) -> Path:
    folder = Path(django_settings.MEDIA_ROOT) / "reports" / str(report_id)
    (folder / ".parts-x1y2").mkdir(parents=True)
    (folder / ".parts-x1y2" / "part-0").write_bytes(b"x" * 1000)
    (folder / "text.log.tmp").write_bytes(b"y" * 1000)
    (folder / "text.log").write_bytes(b"the viewer's copy\n")
    return folder


def test_the_pruning_run_sweeps_what_killed_and_refused_parses_left_but_not_a_running_one(acme, make_report):
    finished = left_by_a_stopped_parse(make_report(acme).id)
    running = left_by_a_stopped_parse(make_report(acme, status=Report.Status.PARSING).id)
    orphan = left_by_a_stopped_parse(987654)  # its report was deleted
    assert reports_prune_expired_task() == 0  # retention is off: no report goes, the leftovers do
    assert sorted(p.name for p in finished.iterdir()) == ["text.log"]
    assert sorted(p.name for p in running.iterdir()) == [".parts-x1y2", "text.log", "text.log.tmp"]
    assert not orphan.exists()

"""Celery tasks: thin wrappers taking ids; the work and its safety live in analysis.py, submit.py,
retention.py and redaction.py. A finished analysis is announced (dispatchlab.events.ReportParsed)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from dispatchlab.taskpolicy import REDELIVERED_UNTIL_DONE

# A duplicate task finding the report claimed by a live worker looks again this many times, once
# each stale-claim period; after that the periodic reports.requeue_stale is the safety net.
BUSY_RECHECKS = 3


# Safe to repeat: report_analyze claims the row before any work and replaces what it stores.
@shared_task(name="reports.analyze", bind=True, max_retries=5, **REDELIVERED_UNTIL_DONE)
def report_analyze_task(self: Any, report_id: int) -> str:
    from dispatchlab.reports.analysis import Outcome, report_analyze, report_busy_seconds

    outcome = report_analyze(report_id=int(report_id))
    if outcome in (Outcome.DONE, Outcome.FAILED):
        from dispatchlab.events import ReportParsed, announce

        # Its subscribers (decisions, the GPU side) each run as a task of their own.
        announce(ReportParsed(report_id=int(report_id), succeeded=outcome == Outcome.DONE))
    if outcome == Outcome.BUSY and self.request.retries < BUSY_RECHECKS:
        # Another worker holds the claim (a holder killed on this machine would have been taken over
        # already); look again the moment the claim goes stale, which a dead holder's does.
        raise self.retry(countdown=report_busy_seconds(report_id=int(report_id)), max_retries=BUSY_RECHECKS)
    return outcome.value


@shared_task(name="reports.requeue_stale", acks_late=False)
def reports_requeue_stale_task() -> int:
    from dispatchlab.reports.submit import reports_requeue_stale

    return reports_requeue_stale()


@shared_task(name="reports.prune_expired", acks_late=False)
def reports_prune_expired_task() -> int:
    from dispatchlab.reports.retention import reports_prune_expired

    return reports_prune_expired()


# A redaction waits behind a parse of its report and behind the report's earlier redactions: it looks
# again every few seconds, for about as long as a parse may take, then gives up (refused, saying so).
REDACTION_WAIT_SECONDS = 3


def _redaction_rechecks() -> int:
    from django.conf import settings

    return 2 * settings.DISPATCHLAB_TASK_TIME_LIMIT // REDACTION_WAIT_SECONDS + 10


# Safe to repeat: redaction_run claims the request under the report's row lock; a dead worker's claim
# goes stale after the redaction time limit.
@shared_task(name="reports.redact", bind=True, max_retries=None, **REDELIVERED_UNTIL_DONE)
def redaction_run_task(self: Any, redaction_id: int) -> str:
    from dispatchlab.reports.redaction import RunOutcome, redaction_give_up, redaction_run

    outcome = redaction_run(redaction_id=int(redaction_id))
    if outcome == RunOutcome.WAITING:
        if self.request.retries >= _redaction_rechecks():
            redaction_give_up(redaction_id=int(redaction_id))
            return "gave up"
        raise self.retry(countdown=REDACTION_WAIT_SECONDS, max_retries=None)
    return outcome.value

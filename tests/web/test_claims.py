"""A parse killed on this machine is taken over at once: the claim token says which process held it."""

from __future__ import annotations

import subprocess
import sys
import uuid

from django.utils import timezone

from dispatchlab.reports.analysis import report_busy_seconds, report_claim
from dispatchlab.reports.claims import claim_holder_is_dead, new_claim_token
from dispatchlab.reports.models import Report

TOKEN_OF_A_CHILD = (
    "from dispatchlab.reports.claims import new_claim_token; print(new_claim_token(), flush=True)"
)


def token_of_a_process_that_exited() -> str:
    done = subprocess.run(
        [sys.executable, "-c", TOKEN_OF_A_CHILD], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_a_token_of_a_process_that_exited_names_a_dead_holder():
    token = token_of_a_process_that_exited()
    assert len(token) == 32 and claim_holder_is_dead(token)


def test_a_live_process_an_old_token_and_our_own_are_never_called_dead():
    child = subprocess.Popen(
        [sys.executable, "-c", TOKEN_OF_A_CHILD + "; import time; time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert not claim_holder_is_dead(child.stdout.readline().strip())
    finally:
        child.kill()
        child.wait()
    assert not claim_holder_is_dead(uuid.uuid4().hex)  # another host's, or before this version
    assert not claim_holder_is_dead("dead-worker")
    assert not claim_holder_is_dead(new_claim_token())


def test_a_fresh_claim_of_a_killed_process_is_taken_over_without_waiting(acme, make_report, settings):
    settings.DISPATCHLAB_STALE_CLAIM_SECONDS = 600
    killed = make_report(
        acme,
        status=Report.Status.PARSING,
        claimed_at=timezone.now(),
        claim_token=token_of_a_process_that_exited(),
    )
    assert report_claim(report_id=killed.id, token=new_claim_token())
    killed.refresh_from_db()
    assert killed.status == Report.Status.PARSING and not claim_holder_is_dead(killed.claim_token)


def test_a_fresh_claim_of_a_live_process_is_left_to_it_until_it_goes_stale(acme, make_report, settings):
    settings.DISPATCHLAB_STALE_CLAIM_SECONDS = 600
    busy = make_report(
        acme, status=Report.Status.PARSING, claimed_at=timezone.now(), claim_token=new_claim_token()
    )
    assert not report_claim(report_id=busy.id, token=new_claim_token())
    # the duplicate task looks again when the claim would go stale, not a whole window after now
    Report.objects.filter(id=busy.id).update(claimed_at=timezone.now() - timezone.timedelta(seconds=500))
    assert 100 <= report_busy_seconds(report_id=busy.id) <= 102

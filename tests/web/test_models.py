from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from dispatchlab.reports import selectors
from dispatchlab.reports.models import FailureGroup, Membership, Report


def test_a_project_holds_a_checksum_once(acme, make_report):
    report = make_report(acme)
    with pytest.raises(IntegrityError), transaction.atomic():
        Report.objects.create(project=acme, checksum=report.checksum)


def test_a_delivery_id_is_unique_in_a_project_but_may_be_absent_many_times(acme, umbrella):
    Report.objects.create(project=acme, checksum="1", delivery_id="run-7")
    Report.objects.create(project=umbrella, checksum="1", delivery_id="run-7")
    Report.objects.create(project=acme, checksum="2")
    Report.objects.create(project=acme, checksum="3")
    with pytest.raises(IntegrityError), transaction.atomic():
        Report.objects.create(project=acme, checksum="4", delivery_id="run-7")


def test_a_fingerprint_makes_one_group_per_project(acme, umbrella):
    FailureGroup.objects.create(project=acme, fingerprint="abc")
    FailureGroup.objects.create(project=umbrella, fingerprint="abc")
    with pytest.raises(IntegrityError), transaction.atomic():
        FailureGroup.objects.create(project=acme, fingerprint="abc")


def test_a_user_is_a_member_of_a_project_once(acme, alice):
    with pytest.raises(IntegrityError), transaction.atomic():
        Membership.objects.create(user=alice, project=acme, role=Membership.Role.VIEWER)


def test_members_see_their_projects_reports_and_charlie_sees_none(acme, alice, bob, charlie, make_report):
    report = make_report(acme)
    assert list(selectors.reports_visible_to(alice)) == [report]
    assert list(selectors.reports_visible_to(bob)) == [report]
    assert not selectors.reports_visible_to(charlie).exists()


def test_viewers_read_but_do_not_upload(acme, alice, bob, charlie):
    assert selectors.user_can_upload(user=alice, project=acme)
    assert not selectors.user_can_upload(user=bob, project=acme)
    assert not selectors.user_can_upload(user=charlie, project=acme)


def test_groups_are_scoped_like_reports(acme, alice, charlie):
    group = FailureGroup.objects.create(project=acme, fingerprint="abc")
    assert list(selectors.groups_visible_to(alice)) == [group]
    assert not selectors.groups_visible_to(charlie).exists()


def test_a_report_without_a_line_index_has_none(acme, make_report):
    assert selectors.report_line_index(make_report(acme)) is None

"""An SGLang crash dump uploaded alone makes a report page with the server's facts and the requests in flight,
and no diagnosis."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from test_crash_pointers import report_from_log

DUMP = (
    Path(__file__).resolve().parents[1]
    / "fixtures"
    / "crashdump"
    / "gpu-node-07"
    / "crash_dump_2026-03-14_09-26-53.pkl"
)


def test_a_crash_dump_alone_shows_the_model_backends_and_requests_in_flight(alice_in_lab, tmp_path):
    client, project, alice = alice_in_lab
    report = report_from_log(project, alice, DUMP, tmp_path / "r")
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    assert "deepseek-ai/DeepSeek-V3.2-Exp" in html
    assert "deep_gemm" in html and "fp8_e4m3" in html
    assert "37 requests in flight" in html
    assert "Jump to crash" not in html


def test_an_outsider_cannot_see_a_crash_dump_report(alice_in_lab, tmp_path):
    _client, project, alice = alice_in_lab
    report = report_from_log(project, alice, DUMP, tmp_path / "r")
    User.objects.create_user("bob", password="password")
    bob = Client()
    bob.login(username="bob", password="password")
    assert bob.get(reverse("front:report", args=[report.pk])).status_code == 404

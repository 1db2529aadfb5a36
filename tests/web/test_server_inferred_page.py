"""The report page says how it knows the server, and offers no flag the server does not have."""

from __future__ import annotations

import re
from pathlib import Path

from django.urls import reverse
from test_crash_pointers import report_from_log

SERVERS = Path(__file__).resolve().parents[1] / "fixtures" / "servers"


def test_a_vllm_log_with_a_foreign_prefix_shows_vllm_inferred_and_no_sglang_flag(alice_in_lab, tmp_path):
    client, project, alice = alice_in_lab
    report = report_from_log(project, alice, SERVERS / "vllm_wrapped_nccl_timeout.log", tmp_path / "r")
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    assert re.search(
        r"<strong>vllm</strong> 0\.24\.0\s*<span class=\"muted server-inferred\"[^>]*>inferred from <a[^>]*#L1\">L1</a>",
        html,
    )
    patch = re.search(r'<pre id="patch-top">(.*?)</pre>', html, re.S)
    assert patch is None or "--dist-timeout" not in patch.group(1)
    assert "Not offered: <code>--dist-timeout</code>, which vllm does not take." in html


def test_a_log_that_names_no_server_says_why_a_flag_is_not_offered(alice_in_lab, tmp_path):
    client, project, alice = alice_in_lab
    report = report_from_log(project, alice, SERVERS / "unnamed_nccl_timeout.log", tmp_path / "r")
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    assert "<strong>unknown</strong>" in html and "no line names it" in html
    assert "The log does not say which server ran" in html and "<code>--dist-timeout</code>" in html
    assert (
        'id="patch-top"' not in html
        or "--dist-timeout" not in html.split('id="patch-top"')[1].split("</pre>")[0]
    )

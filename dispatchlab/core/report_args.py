"""The arguments of `dispatchlab report`, apart from the reporter so that other commands start fast."""

from __future__ import annotations

import argparse

ENV_URL = "DISPATCHLAB_URL"
ENV_TOKEN = "DISPATCHLAB_TOKEN"
ENV_SECRET = "DISPATCHLAB_WEBHOOK_SECRET"
ENV_PROJECT = "DISPATCHLAB_PROJECT"


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="log files (.log/.txt/.gz/.zip), or - for stdin; one report"
    )
    parser.add_argument("--url", help=f"the dashboard's address (default: ${ENV_URL})")
    parser.add_argument("--token", help=f"an API token from `manage.py apitoken` (default: ${ENV_TOKEN})")
    parser.add_argument(
        "--webhook-secret",
        metavar="S",
        help=f"sign for the CI webhook with the project's secret instead (default: ${ENV_SECRET})",
    )
    parser.add_argument(
        "--wait",
        type=int,
        default=60,
        metavar="N",
        help="wait up to N seconds for the diagnosis (default 60; 0: print the link at once)",
    )
    parser.add_argument("--json", action="store_true", help="print the API's answer as one JSON object")
    parser.add_argument("--title", default="", help="the report's title (default: job, branch, commit)")
    parser.add_argument(
        "--project",
        default="",
        help=f"project slug: names the webhook's project, or picks one of a token's (default: ${ENV_PROJECT})",
    )
    ci = parser.add_argument_group("CI fields (read from GitHub Actions or GitLab CI when not given)")
    ci.add_argument("--job", help="the CI job's name")
    ci.add_argument("--commit", help="the commit under test")
    ci.add_argument("--branch", help="the branch under test")
    ci.add_argument("--ci-url", help="the CI job's page")

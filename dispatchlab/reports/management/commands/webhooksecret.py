"""`manage.py webhooksecret --project NAME [--rotate]`: print the CI webhook secret on the last line."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from dispatchlab.reports.accounts import project_rotate_webhook_secret
from dispatchlab.reports.management.options import add_project_argument, project_option


class Command(BaseCommand):
    help = "Print a project's CI webhook secret (HMAC-SHA256 key for POST /api/v1/hooks/ci)."

    def add_arguments(self, parser: CommandParser) -> None:
        add_project_argument(parser, required=True)
        parser.add_argument("--rotate", action="store_true", help="replace the secret with a new one first")

    def handle(self, *args: Any, **options: Any) -> None:
        project = project_option(options["project"])
        if options["rotate"]:
            project_rotate_webhook_secret(project=project)
            self.stdout.write(f"new webhook secret for {project.name} (the old one no longer verifies):")
        else:
            self.stdout.write(f"webhook secret for {project.name} (send ?project={project.slug}):")
        self.stdout.write(project.webhook_secret)

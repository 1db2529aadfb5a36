"""`manage.py webhooksecret --project NAME [--rotate]`: print the CI webhook secret on the last line."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q

from dispatchlab.reports.models import Project
from dispatchlab.reports.services import project_rotate_webhook_secret


class Command(BaseCommand):
    help = "Print a project's CI webhook secret (HMAC-SHA256 key for POST /api/v1/hooks/ci)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", required=True, help="project name or slug")
        parser.add_argument("--rotate", action="store_true", help="replace the secret with a new one first")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["project"]
        project = Project.objects.filter(Q(name=name) | Q(slug=name)).first()
        if project is None:
            raise CommandError(f"no project {name!r}")
        if options["rotate"]:
            project_rotate_webhook_secret(project=project)
            self.stdout.write(f"new webhook secret for {project.name} (the old one no longer verifies):")
        else:
            self.stdout.write(f"webhook secret for {project.name} (send ?project={project.slug}):")
        self.stdout.write(project.webhook_secret)

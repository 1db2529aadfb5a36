"""`manage.py rematch [--project X] [--all] [--include-failed]`: analyse stored reports again.

Run it after the knowledge base changed: by default it queues the done reports whose matches came
from another knowledge-base version (their kb_digest differs); --all queues every done report (after
a parser change). The workers re-read the stored uploads and replace the documents; reports stay
readable, with their old document, until the new one is stored.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from dispatchlab.reports.management.options import add_project_argument, project_option
from dispatchlab.reports.submit import reports_rematch


class Command(BaseCommand):
    help = "Queue done reports (of one project, or all) for another analysis."

    def add_arguments(self, parser: CommandParser) -> None:
        add_project_argument(parser, required=False, help="project name or slug (default: every project)")
        parser.add_argument("--all", action="store_true", help="every done report, not only outdated ones")
        parser.add_argument("--include-failed", action="store_true", help="also retry reports that failed")

    def handle(self, *args: Any, **options: Any) -> None:
        project = project_option(options["project"]) if options["project"] else None
        digest = None
        if not options["all"]:
            from dispatchlab.core.signatures import load_knowledge_base

            digest = load_knowledge_base().digest
            self.stdout.write(f"knowledge base digest {digest}: re-matching reports made with another one")
        count = reports_rematch(
            project=project, include_failed=options["include_failed"], outdated_for=digest
        )
        scope = f"in {project.name}" if project else "in every project"
        self.stdout.write(f"queued {count} report{'s' if count != 1 else ''} {scope} for re-matching")

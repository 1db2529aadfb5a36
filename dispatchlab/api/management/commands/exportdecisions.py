"""`manage.py exportdecisions --project NAME [--output FILE]`: the project's decision records as
`dispatchlab match LOG --decisions FILE` reads them (the same JSON as GET /api/v1/decisions?format=export)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from dispatchlab.api.decision_shapes import decision_json
from dispatchlab.decisions.models import Decision
from dispatchlab.reports.management.options import project_option


class Command(BaseCommand):
    help = "Export a project's decision records for `dispatchlab match LOG --decisions FILE`."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", required=True, help="project slug or name")
        parser.add_argument("--output", "-o", default="-", help="file to write (default: standard output)")

    def handle(self, *args: Any, **options: Any) -> None:
        project = project_option(options["project"])
        decisions = (
            Decision.objects.filter(project=project)
            .select_related("project", "author")
            .prefetch_related("links")
            .order_by("number")
        )
        text = json.dumps({"decisions": [decision_json(d) for d in decisions]}, indent=1, ensure_ascii=False)
        if options["output"] == "-":
            self.stdout.write(text)
        else:
            Path(options["output"]).write_text(text + "\n", encoding="utf-8")
            self.stderr.write(
                f"{len(decisions)} decision records of {project.slug} written to {options['output']}"
            )

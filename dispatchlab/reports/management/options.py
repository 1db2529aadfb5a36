"""What the management commands share: the --project option, naming a project by its name or slug."""

from __future__ import annotations

from django.core.management.base import CommandError, CommandParser

from dispatchlab.reports.models import Project
from dispatchlab.reports.selectors import project_named


def add_project_argument(
    parser: CommandParser, *, required: bool, help: str = "project name or slug"
) -> None:
    parser.add_argument("--project", required=required, help=help)


def project_option(name: str) -> Project:
    """The project whose name or slug is `name`, or the CommandError that says there is none."""
    project = project_named(Project.objects.all(), name)
    if project is None:
        raise CommandError(f"no project {name!r}")
    return project

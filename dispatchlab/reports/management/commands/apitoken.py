"""`manage.py apitoken --user NAME --project NAME [--create] [--read-only]`: print a new API token.

The token is printed alone on the last line (scripts take `| tail -n 1`); only its hash is stored.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from dispatchlab.reports.models import Membership, Project
from dispatchlab.reports.services import apitoken_create, membership_ensure, project_create


class Command(BaseCommand):
    help = "Create an API token for a user in a project and print it on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True, help="username")
        parser.add_argument("--project", required=True, help="project name or slug")
        parser.add_argument(
            "--create", action="store_true", help="create the user, the project and the membership if missing"
        )
        parser.add_argument("--read-only", action="store_true", help="the token can read but not upload")

    def handle(self, *args: Any, **options: Any) -> None:
        username, project_name = options["user"], options["project"]
        user_model = get_user_model()
        with transaction.atomic():
            user = user_model.objects.filter(username=username).first()
            project = (
                Project.objects.filter(name=project_name).first()
                or Project.objects.filter(slug=project_name).first()
            )
            if options["create"]:
                if user is None:
                    user = user_model.objects.create_user(username=username)  # no password: token only
                    self.stderr.write(f"created user {username}")
                if project is None:
                    project = project_create(name=project_name)
                    self.stderr.write(f"created project {project.name} ({project.slug})")
                membership_ensure(user=user, project=project)
            if user is None:
                raise CommandError(f"no user {username!r} (add --create to make it)")
            if project is None:
                raise CommandError(f"no project {project_name!r} (add --create to make it)")
            if not Membership.objects.filter(user=user, project=project).exists():
                raise CommandError(f"{username} is not a member of {project.name} (add --create to add them)")
            token, key = apitoken_create(user=user, project=project, read_only=options["read_only"])
        kind = "read-only token" if token.read_only else "token"
        self.stdout.write(f"{kind} {token.prefix}… for {username} in {project.name}:")
        self.stdout.write(key)

"""API tokens of a user in a project.

    manage.py apitoken --user NAME --project NAME [--create] [--read-only] [--days N]   print a new token
    manage.py apitoken --list [--user NAME] [--project NAME]                           list tokens
    manage.py apitoken --revoke PREFIX                                                 revoke a token

A new token is printed alone on the last line (scripts take `| tail -n 1`); only its hash is stored.
It expires after --days (default DISPATCHLAB_API_TOKEN_DAYS; 0: never).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from dispatchlab.reports.accounts import apitoken_create, apitoken_revoke, membership_ensure, project_create
from dispatchlab.reports.models import ApiToken, Membership, Project
from dispatchlab.reports.selectors import project_named


def _find_project(name: str) -> Project | None:
    return project_named(Project.objects.order_by("id"), name)


class Command(BaseCommand):
    help = "Create (and print), list or revoke API tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", help="username")
        parser.add_argument("--project", help="project name or slug")
        parser.add_argument(
            "--create", action="store_true", help="create the user, the project and the membership if missing"
        )
        parser.add_argument("--read-only", action="store_true", help="the token can read but not upload")
        parser.add_argument("--days", type=int, help="expire after this many days (0: never)")
        parser.add_argument("--list", action="store_true", help="list tokens (of --user, in --project)")
        parser.add_argument(
            "--revoke", metavar="PREFIX", help="revoke the token with this prefix (as listed)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["revoke"]:
            try:
                count = apitoken_revoke(prefix=options["revoke"].strip().rstrip("…"))
            except ValueError as problem:
                raise CommandError(str(problem)) from None
            if not count:
                raise CommandError(f"no live token {options['revoke']!r} (see --list)")
            self.stdout.write(f"revoked {count} token{'s' if count > 1 else ''}")
            return
        if options["list"]:
            self._list(options["user"], options["project"])
            return
        if not options["user"] or not options["project"]:
            raise CommandError("give --user and --project to create a token (or --list, --revoke PREFIX)")
        if options["days"] is not None and options["days"] < 0:
            raise CommandError("--days must be 0 (never expires) or more")
        self._create(options)

    def _list(self, username: str | None, project_name: str | None) -> None:
        tokens = ApiToken.objects.select_related("user", "project").order_by("created_at")
        if username:
            tokens = tokens.filter(user__username=username)
        if project_name:
            tokens = tokens.filter(Q(project__name=project_name) | Q(project__slug=project_name))
        now = timezone.now()
        for token in tokens:
            if token.revoked_at is not None:
                state = f"revoked {token.revoked_at:%Y-%m-%d}"
            elif token.is_expired(now):
                state = f"expired {token.expires_at:%Y-%m-%d}"
            else:
                state = f"expires {token.expires_at:%Y-%m-%d}" if token.expires_at else "never expires"
            used = f"{token.last_used_at:%Y-%m-%d}" if token.last_used_at else "never"
            self.stdout.write(
                f"{token.prefix}  {token.user.get_username()}  {token.project.slug}  "
                f"{'read-only' if token.read_only else 'read-write'}  {state}  last used {used}"
            )

    def _create(self, options: dict[str, Any]) -> None:
        username, project_name = options["user"], options["project"]
        user_model = get_user_model()
        with transaction.atomic():
            user = user_model.objects.filter(username=username).first()
            project = _find_project(project_name)
            if options["create"]:
                if user is None:
                    user = user_model.objects.create_user(username=username)  # no password: token only
                    self.stderr.write(f"created user {username}")
                if project is None:
                    project = project_create(name=project_name)
                    self.stderr.write(
                        f"created project {project.name} ({project.slug}): only its members open its "
                        "reports on the dashboard; add people in the admin (/admin/), or make the token "
                        "for the project of your login"
                    )
                membership_ensure(user=user, project=project)
            if user is None:
                raise CommandError(f"no user {username!r} (add --create to make it)")
            if project is None:
                raise CommandError(f"no project {project_name!r} (add --create to make it)")
            if not Membership.objects.filter(user=user, project=project).exists():
                raise CommandError(f"{username} is not a member of {project.name} (add --create to add them)")
            token, key = apitoken_create(
                user=user, project=project, read_only=options["read_only"], days=options["days"]
            )
        kind = "read-only token" if token.read_only else "token"
        expiry = f", expires {token.expires_at:%Y-%m-%d}" if token.expires_at else ", never expires"
        self.stdout.write(f"{kind} {token.prefix}… for {username} in {project.name}{expiry}:")
        self.stdout.write(key)

"""`manage.py bootstrap`: what a first user needs after `migrate`.

Checks that the knowledge base loads, and when the database has no user yet, creates a superuser,
a project and the membership, and prints the login and password.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatchlab.reports.accounts import user_bootstrap


class Command(BaseCommand):
    help = "Create the first user and project (when there is no user) and check the knowledge base."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default="", help="default: a random one, printed")
        parser.add_argument("--project", default="default", help="name of the first project")

    def handle(self, *args: Any, **options: Any) -> None:
        self._check_knowledge_base()
        created = user_bootstrap(
            username=options["username"], password=options["password"], project_name=options["project"]
        )
        if created is None:
            self.stdout.write("users exist already; nothing created")
            return
        self.stdout.write(self.style.SUCCESS("created the first user (a superuser) and project"))
        self.stdout.write(f"  project:  {created.project.name}")
        self.stdout.write(f"  login:    {created.username}")
        self.stdout.write(f"  password: {created.password}")

    def _check_knowledge_base(self) -> None:
        from dispatchlab.core.signatures import load_knowledge_base

        try:
            kb = load_knowledge_base()
        except Exception as failure:
            raise CommandError(f"the knowledge base does not load: {failure}") from failure
        self.stdout.write(f"knowledge base: {len(kb.signatures)} signatures, digest {kb.digest}")

"""`manage.py notifyendpoint --project NAME --url URL [--kind generic|slack] [--event KIND ...] [--name TEXT]`:
add a webhook endpoint to a project and print its signing secret on the last line."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q

from dispatchlab.notify.payloads import SUBSCRIBABLE, EndpointKind
from dispatchlab.notify.services import endpoint_create
from dispatchlab.reports.models import Project


class Command(BaseCommand):
    help = "Add a notification webhook to a project; prints the HMAC secret of X-Dispatchlab-Signature last."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", required=True, help="project name or slug")
        parser.add_argument("--url", required=True, help="http(s) URL the events are POSTed to")
        parser.add_argument(
            "--kind", choices=[k.value for k in EndpointKind], default=EndpointKind.GENERIC.value
        )
        parser.add_argument(
            "--event",
            action="append",
            choices=[k.value for k in SUBSCRIBABLE],
            help="an event to send (repeat it; default: all of them)",
        )
        parser.add_argument("--name", default="", help="a label for people, e.g. '#inference-oncall'")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["project"]
        project = Project.objects.filter(Q(name=name) | Q(slug=name)).first()
        if project is None:
            raise CommandError(f"no project {name!r}")
        try:
            endpoint = endpoint_create(
                project=project,
                user=None,
                url=options["url"],
                kind=options["kind"],
                events=options["event"] or [k.value for k in SUBSCRIBABLE],
                name=options["name"],
            )
        except ValidationError as invalid:
            raise CommandError(
                "; ".join(
                    f"{field}: {' '.join(messages)}" for field, messages in invalid.message_dict.items()
                )
            ) from None
        self.stdout.write(
            f"endpoint {endpoint.id} of {project.name} ({endpoint.kind}: {', '.join(endpoint.events)}); "
            "its signing secret:"
        )
        self.stdout.write(endpoint.secret)

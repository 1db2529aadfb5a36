"""`manage.py notifyendpoint --project NAME --url URL [--kind generic|slack] [--event KIND ...] [--name TEXT]`:
add a webhook endpoint to a project and print its signing secret on the last line."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatchlab.notify.payloads import SUBSCRIBABLE, EndpointKind
from dispatchlab.notify.services import endpoint_create
from dispatchlab.reports.management.options import add_project_argument, project_option


class Command(BaseCommand):
    help = "Add a notification webhook to a project; prints the HMAC secret of X-Dispatchlab-Signature last."

    def add_arguments(self, parser: CommandParser) -> None:
        add_project_argument(parser, required=True)
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
        project = project_option(options["project"])
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

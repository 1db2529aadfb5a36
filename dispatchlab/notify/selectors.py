"""Read-only queries about endpoints and their deliveries, scoped to the user's projects."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Prefetch, Q, QuerySet

from dispatchlab.notify.models import Attempt, Delivery, Endpoint


def endpoints_of_project(project_id: int) -> QuerySet[Endpoint]:
    """With per-status delivery counts (`delivered`, `failed`, `skipped`, `pending`)."""
    statuses = {
        "delivered": [Delivery.Status.DELIVERED],
        "failed": [Delivery.Status.FAILED],
        "skipped": [Delivery.Status.SKIPPED],
        "pending": [Delivery.Status.PENDING, Delivery.Status.SENDING],
    }
    counts: dict[str, Any] = {
        name: Count("deliveries", filter=Q(deliveries__status__in=values))
        for name, values in statuses.items()
    }
    return Endpoint.objects.filter(project_id=project_id).annotate(**counts).order_by("created_at", "id")


def endpoint_deliveries(endpoint: Endpoint, *, limit: int = 50) -> list[Delivery]:
    """The newest deliveries, each with its attempts in order."""
    return list(
        Delivery.objects.filter(endpoint=endpoint)
        .select_related("event")
        .prefetch_related(Prefetch("attempt_rows", queryset=Attempt.objects.order_by("number")))
        .order_by("-created_at", "-id")[:limit]
    )

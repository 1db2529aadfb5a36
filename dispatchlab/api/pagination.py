"""The one way the API pages a list: `?page=` (from 1) and `?limit=` (20 by default, at most 100), answered
as `{"results", "count", "next", "previous"}` where next/previous are the absolute URLs of the
neighbouring pages (same filters), or null."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar
from urllib.parse import urlencode

from django.db.models import QuerySet
from django.http import HttpRequest
from pydantic import Field
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# For the text of query parameters: PostgreSQL refuses a NUL in text, so a filter holding one is a 400
# (dispatchlab.api.schema says so in words), never a failed query.
NO_NUL = r"^[^\x00]*$"

T = TypeVar("T")


class PageQuery(TypedDict, total=False):
    # Field(description=...), not docstrings: the query TypedDicts inherit these fields.
    page: Annotated[
        int, Field(ge=1, description="which page, from 1; past the last page the results are empty")
    ]
    limit: Annotated[
        int, Field(ge=1, description="items per page: 20 unless said, at most 100 (a larger limit gives 100)")
    ]


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    count: int
    next: str | None
    previous: str | None


def _page_url(request: HttpRequest, page: int) -> str:
    query = request.GET.copy()
    query["page"] = str(page)
    return request.build_absolute_uri(request.path) + "?" + urlencode(sorted(query.items()))


def paginate(
    request: HttpRequest,
    query: PageQuery | Any,
    items: QuerySet[Any] | Sequence[T],
    *,
    default_limit: int = DEFAULT_LIMIT,
) -> Page[Any]:
    """One page of `items` (a queryset is counted, then sliced: one COUNT and one query)."""
    page = int(query.get("page") or 1)
    limit = min(int(query.get("limit") or default_limit), MAX_LIMIT)
    count = items.count() if isinstance(items, QuerySet) else len(items)
    start = (page - 1) * limit
    # Past the end nothing is read: an absurd page number must not reach the database as an OFFSET.
    found = list(items[start : start + limit]) if start < count else []
    return Page(
        items=found,
        count=count,
        next=_page_url(request, page + 1) if start + limit < count else None,
        previous=_page_url(request, min(page - 1, max(1, -(-count // limit)))) if page > 1 else None,
    )


def page_answer(
    request: HttpRequest,
    query: PageQuery | Any,
    items: QuerySet[Any] | Sequence[T],
    serialize: Callable[[Any], Any],
    *,
    default_limit: int = DEFAULT_LIMIT,
) -> dict[str, Any]:
    """The fields every page answer shares: `results` (each item serialized), `count`, `next`, `previous`."""
    page = paginate(request, query, items, default_limit=default_limit)
    return {
        "results": [serialize(item) for item in page.items],
        "count": page.count,
        "next": page.next,
        "previous": page.previous,
    }

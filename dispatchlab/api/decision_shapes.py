"""Decision records as JSON, where they leave the process (API, export): the docs/contract.md shape, declared
once as the TypedDicts below, which the API builds its answers with and the OpenAPI document is generated
from (dispatchlab.api.schema)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, Required

from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from pydantic import ConfigDict, Field, WithJsonSchema, with_config
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from dispatchlab.api.pagination import NO_NUL, PageQuery
from dispatchlab.core.decisions import REVISIT_PACKAGES, DecisionStatus
from dispatchlab.decisions import models
from dispatchlab.decisions.selectors import decision_links
from dispatchlab.decisions.validation import FINGERPRINT, MAX_ALTERNATIVES, MAX_LINKS, MAX_TEXT, SIGNATURE_ID

Status = Literal[tuple(s.value for s in DecisionStatus)]  # type: ignore[valid-type]
RevisitPackage = Literal[REVISIT_PACKAGES]  # type: ignore[valid-type]
DateTime = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
Date = Annotated[str, WithJsonSchema({"type": "string", "format": "date"})]
Url = Annotated[str, WithJsonSchema({"type": "string", "format": "uri"})]
RevisitWhen = Annotated[
    dict[str, str],
    Field(
        description=(
            "PEP 440 specifiers by package (" + ", ".join(REVISIT_PACKAGES) + "): the first log of the "
            "project that shows a version meeting one makes the record stale; a changed condition clears it"
        ),
        examples=[{"flashinfer": ">=0.7", "sglang": ">0.5.23"}],
    ),
]
described = with_config(ConfigDict(use_attribute_docstrings=True))


@described
class DecisionRef(TypedDict):
    """A record as a report's document lists it."""

    id: int
    number: int
    title: str
    status: Status
    stale: bool
    stale_reason: str | None
    status_since: Date | None


@described
class Alternative(TypedDict):
    what: str
    outcome: NotRequired[str]


@described
class Links(TypedDict):
    groups: list[str]
    """failure-group fingerprints"""
    signatures: list[str]
    """signature ids"""
    reports: list[int]
    """report ids"""
    upstream: list[Url]
    """http(s) links: issues, pull requests"""


# What the services take (dispatchlab.decisions.validation.decision_clean), as far as JSON Schema can say
# it: a request that passes these may still name a report or record that does not exist.
Title = Annotated[str, Field(max_length=300, pattern=r"^[^\x00]*[^\x00\s][^\x00]*$")]
Text = Annotated[str, Field(max_length=MAX_TEXT, pattern=NO_NUL, description="Markdown")]
# The specifiers the core can check against a log's versions (dispatchlab.core.versions).
_CLAUSE = r" *(?:(?:==|!=|<=|>=|<|>) *[0-9]+(?:\.[0-9]+)*|~= *[0-9]+(?:\.[0-9]+)+) *"
Specifier = Annotated[str, Field(pattern=rf"^{_CLAUSE}(?:,{_CLAUSE})*$")]


@with_config(ConfigDict(use_attribute_docstrings=True, extra="forbid"))
class AlternativeInput(TypedDict):
    what: Annotated[str, Field(max_length=500, pattern=r"^[^\x00]*[^\x00\s][^\x00]*$")]
    """what was tried"""
    outcome: NotRequired[Annotated[str, Field(max_length=5000, pattern=NO_NUL)]]
    """how it went"""


@with_config(ConfigDict(use_attribute_docstrings=True, extra="forbid"))
class LinksInput(TypedDict, total=False):
    """Kinds not sent stay as they are."""

    groups: Annotated[list[Annotated[str, Field(pattern=FINGERPRINT.pattern)]], Field(max_length=MAX_LINKS)]
    """failure-group fingerprints"""
    signatures: Annotated[
        list[Annotated[str, Field(pattern=SIGNATURE_ID.pattern)]], Field(max_length=MAX_LINKS)
    ]
    """signature ids"""
    reports: Annotated[list[Annotated[int, Field(ge=1)]], Field(max_length=MAX_LINKS)]
    """ids of the project's reports"""
    upstream: Annotated[
        list[
            Annotated[
                str,
                Field(
                    max_length=500,
                    pattern=r"^https?://[A-Za-z0-9][A-Za-z0-9.-]*\.[A-Za-z]{2,}(/[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*)?$",
                ),
            ]
        ],
        Field(max_length=MAX_LINKS),
    ]
    """http(s) links: issues, pull requests"""


@described
class _Editable(TypedDict, total=False):
    status: Status
    context: Text
    decision: Text
    consequences: Text
    alternatives: Annotated[list[AlternativeInput], Field(max_length=MAX_ALTERNATIVES)]
    """what was tried, and how it went"""
    links: LinksInput
    revisit_when: Annotated[
        dict[RevisitPackage, Specifier],
        Field(
            description=(
                "PEP 440 specifiers by package: the first log of the project that shows a version meeting "
                "one makes the record stale; a changed condition clears it"
            ),
            examples=[{"flashinfer": ">=0.7", "sglang": ">0.5.23"}],
        ),
    ]
    superseded_by: int | None
    """the id of the record that replaces this one (then the status is superseded)"""


@described
class DecisionFields(_Editable, total=False):
    """The fields people edit; fields not sent stay as they are. Fields the server sets (id, number,
    stale ...) may be sent back unchanged."""

    title: Title


@with_config(ConfigDict(use_attribute_docstrings=True, extra="forbid"))
class DecisionCreate(_Editable, total=False):
    """A new record: the title is needed."""

    title: Required[Title]
    project: Annotated[str, Field(max_length=100, pattern=NO_NUL)]
    """the project's slug; needed only by a member of several projects"""


@described
class Decision(TypedDict):
    id: int
    number: int
    """DR-<number>, a sequence per project"""
    label: str
    """DR-7"""
    project: str
    title: str
    status: Status
    context: str
    decision: str
    consequences: str
    alternatives: list[Alternative]
    links: Links
    revisit_when: RevisitWhen
    superseded_by: int | None
    stale: bool
    stale_reason: str | None
    """e.g. report 123 shows flashinfer 0.7.1, which matches flashinfer>=0.7"""
    stale_since: DateTime | None
    stale_report: int | None
    status_since: Date
    author: str | None
    created: DateTime
    updated: DateTime
    url: Url
    """the record's page"""
    history_url: Url


@described
class DecisionEdit(TypedDict):
    id: int
    kind: Literal["created", "edited", "stale"]
    user: str | None
    """null for a change a log made (stale)"""
    at: DateTime
    changes: dict[str, Any]
    """each changed field as {"from": old, "to": new}; links per kind, e.g. links.upstream"""


@described
class DecisionPage(TypedDict):
    """A page of records, by project, newest first."""

    results: list[Decision]
    count: int
    next: Url | None
    previous: Url | None


@described
class DecisionExport(TypedDict):
    """?format=export: every matching record, no pages; the file `dispatchlab match --decisions` reads."""

    decisions: list[Decision]
    count: int
    exported: DateTime


@described
class DecisionHistory(TypedDict):
    """Every change of a record, oldest first."""

    id: int
    label: str
    results: list[DecisionEdit]
    count: int


@described
class DecisionListQuery(PageQuery, total=False):
    project: Annotated[str, Field(max_length=100, pattern=NO_NUL)]
    """a project's slug (404 when the caller has no such project)"""
    status: Status
    stale: bool
    group: Annotated[str, Field(max_length=64, pattern=NO_NUL)]
    """a failure group's fingerprint"""
    signature: Annotated[str, Field(max_length=200, pattern=NO_NUL)]
    """a signature id"""
    report: Annotated[int, Field(ge=0)]
    """a report id"""
    format: Literal["export"]
    """export: every matching record as {"decisions": [...]}, no pages"""


def _absolute(request: HttpRequest | None, path: str) -> str:
    return request.build_absolute_uri(path) if request is not None else path


def _page(decision: models.Decision) -> str:
    try:
        return reverse("front:decision", args=[decision.id])
    except NoReverseMatch:  # a checkout without the pages
        return f"/decisions/{decision.id}/"


def decision_json(decision: models.Decision, *, request: HttpRequest | None = None) -> Decision:
    return Decision(
        id=decision.id,
        number=decision.number,
        label=decision.label,
        project=decision.project.slug,
        title=decision.title,
        status=decision.status,
        context=decision.context,
        decision=decision.decision,
        consequences=decision.consequences,
        alternatives=list(decision.alternatives or []),
        links=decision_links(decision),  # type: ignore[typeddict-item]
        revisit_when=dict(decision.revisit_when or {}),
        superseded_by=decision.superseded_by_id,
        stale=decision.stale,
        stale_reason=(decision.stale_reason or None) if decision.stale else None,
        stale_since=decision.stale_since.isoformat() if decision.stale_since else None,
        stale_report=decision.stale_report_id,
        status_since=decision.status_changed_at.date().isoformat(),
        author=decision.author.get_username() if decision.author else None,
        created=decision.created_at.isoformat(),
        updated=decision.updated_at.isoformat(),
        url=_absolute(request, _page(decision)),
        history_url=_absolute(request, reverse("api:decision_history", args=[decision.id])),
    )


def edit_json(edit: models.DecisionEdit) -> DecisionEdit:
    return DecisionEdit(
        id=edit.id,
        kind=edit.kind,  # type: ignore[typeddict-item]
        user=edit.user.get_username() if edit.user else None,
        at=edit.at.isoformat(),
        changes=edit.changes,
    )

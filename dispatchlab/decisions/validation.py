"""Checking a decision record as people wrote it (page, API, import): `decision_clean` answers the stored
fields or raises DecisionInvalid with a message per field; the limits here are the API's too."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from dispatchlab.core import versions as core_versions
from dispatchlab.core.decisions import (
    REVISIT_PACKAGES,
    normalise_package,
)
from dispatchlab.decisions.models import Decision, DecisionLink
from dispatchlab.decisions.selectors import decision_links
from dispatchlab.reports.models import Project, Report

logger = logging.getLogger(__name__)

EDITABLE = (
    "title",
    "status",
    "context",
    "decision",
    "consequences",
    "alternatives",
    "links",
    "revisit_when",
    "superseded_by",
)
LINK_KINDS = ("groups", "signatures", "reports", "upstream")
# RFC 3986: unreserved, reserved and percent-escapes only.
URI_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")
KIND_OF = {
    "groups": DecisionLink.Kind.GROUP,
    "signatures": DecisionLink.Kind.SIGNATURE,
    "reports": DecisionLink.Kind.REPORT,
    "upstream": DecisionLink.Kind.UPSTREAM,
}
MAX_TEXT = 50_000
MAX_ALTERNATIVES = 50
MAX_LINKS = 100
FINGERPRINT = re.compile(r"^[0-9a-f]{8,64}$")
SIGNATURE_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,199}$")
# What the history keeps of each field: the links per kind, so an edit says "links.upstream changed".
HISTORY_FIELDS = tuple(
    field
    for name in EDITABLE
    for field in ([f"links.{kind}" for kind in LINK_KINDS] if name == "links" else [name])
)


class DecisionInvalid(ValidationError):
    """The record cannot be stored as given; `message_dict` maps each field (`title`,
    `alternatives[1].what`, `revisit_when.flashinfer`) to what is wrong with it, for people."""


# ---------------------------------------------------------------- validation


class _Errors:
    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = {}

    def add(self, field: str, message: str) -> None:
        self.by_field.setdefault(field, []).append(message)

    def raise_any(self) -> None:
        if self.by_field:
            raise DecisionInvalid(self.by_field)


def _text(errors: _Errors, field: str, value: Any, *, limit: int = MAX_TEXT, required: bool = False) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        errors.add(field, "must be a string")
        return ""
    value = value.strip()
    if "\x00" in value:
        errors.add(field, "must not hold a NUL character")
        return ""
    if required and not value:
        errors.add(field, "is required")
    if len(value) > limit:
        errors.add(field, f"is {len(value):,} characters long; at most {limit:,}")
    return value


def _alternatives(errors: _Errors, value: Any) -> list[dict[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        errors.add("alternatives", 'must be a list of {"what": ..., "outcome": ...}')
        return []
    if len(value) > MAX_ALTERNATIVES:
        errors.add("alternatives", f"has {len(value)} items; at most {MAX_ALTERNATIVES}")
    out = []
    for index, item in enumerate(value):
        where = f"alternatives[{index}]"
        if not isinstance(item, dict):
            errors.add(where, 'must be an object {"what": ..., "outcome": ...}')
            continue
        unknown = sorted(set(item) - {"what", "outcome"})
        if unknown:
            errors.add(where, f"unknown key {', '.join(unknown)}; an alternative has 'what' and 'outcome'")
        what = _text(errors, f"{where}.what", item.get("what"), limit=500, required=True)
        outcome = _text(errors, f"{where}.outcome", item.get("outcome"), limit=5000)
        out.append({"what": what, "outcome": outcome})
    return out


def _links(
    errors: _Errors, value: Any, *, project: Project, current: dict[str, list[Any]]
) -> dict[str, list[Any]]:
    """The links given replace those of their kind; kinds not given stay as they are."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        errors.add("links", "must be an object with groups, signatures, reports and upstream lists")
        return current
    unknown = sorted(set(value) - set(LINK_KINDS))
    if unknown:
        errors.add("links", f"unknown kind {', '.join(unknown)}; links are {', '.join(LINK_KINDS)}")
    out = {kind: list(current.get(kind, [])) for kind in LINK_KINDS}
    for kind in LINK_KINDS:
        if kind not in value:
            continue
        items = value[kind]
        field = f"links.{kind}"
        if items is None:
            items = []
        if not isinstance(items, list):
            errors.add(field, "must be a list")
            continue
        if len(items) > MAX_LINKS:
            errors.add(field, f"has {len(items)} items; at most {MAX_LINKS}")
            continue
        cleaned: list[Any] = []
        for item in items:
            one = _link(errors, kind, field, item)
            if one is not None and one not in cleaned:
                cleaned.append(one)
        out[kind] = cleaned
    if "reports" in value and out["reports"]:
        found = set(
            Report.objects.filter(project=project, id__in=out["reports"]).values_list("id", flat=True)
        )
        for report_id in out["reports"]:
            if report_id not in found:
                errors.add("links.reports", f"project {project.slug} has no report {report_id}")
    return out


def _link(errors: _Errors, kind: str, field: str, item: Any) -> Any:
    if kind == "reports":
        if isinstance(item, str) and item.strip().isascii() and item.strip().isdigit():
            item = int(item.strip())
        if not isinstance(item, int) or isinstance(item, bool) or item < 1:
            errors.add(field, f"{item!r} is not a report id (a positive integer)")
            return None
        return item
    if not isinstance(item, str) or not item.strip():
        errors.add(field, f"{item!r} is not a string")
        return None
    text = item.strip()
    if "\x00" in text:
        errors.add(field, "must not hold a NUL character")
        return None
    if kind == "groups":
        text = text.lower()
        if not FINGERPRINT.match(text):
            errors.add(
                field, f"{text!r} is not a fingerprint (8 to 64 hex digits, as a report's page shows it)"
            )
            return None
    elif kind == "signatures":
        if not SIGNATURE_ID.match(text):
            errors.add(field, f"{text!r} is not a signature id (lower-case letters, digits, '-', '.', '_')")
            return None
    else:
        try:
            URLValidator(schemes=["http", "https"])(text)
        except ValidationError:
            errors.add(field, f"{text[:200]!r} is not an http(s) URL")
            return None
        if not URI_CHARACTERS.fullmatch(text):
            # Django's validator lets `{`, `<`, `|` ... through; a link people click must be a real URI.
            errors.add(field, f"{text[:200]!r} holds characters a URL may not (escape them as %XX)")
            return None
        if len(text) > 500:
            errors.add(field, "a URL of more than 500 characters")
            return None
    return text


def _revisit_when(errors: _Errors, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.add(
            "revisit_when", 'must be an object of package to PEP 440 specifier, e.g. {"flashinfer": ">=0.7"}'
        )
        return {}
    out: dict[str, str] = {}
    for raw_package, spec in value.items():
        package = normalise_package(str(raw_package))
        field = f"revisit_when.{raw_package}"
        if package not in REVISIT_PACKAGES:
            errors.add(field, f"unknown package {raw_package!r}; one of {', '.join(REVISIT_PACKAGES)}")
            continue
        if not isinstance(spec, str) or not spec.strip():
            errors.add(field, 'must be a PEP 440 specifier such as ">=0.7" or ">0.5.23,<0.6"')
            continue
        spec = spec.strip()
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            errors.add(field, f'{spec!r} is not a PEP 440 specifier (such as ">=0.7" or ">0.5.23,<0.6")')
            continue
        try:
            core_versions.SpecifierSet(spec)
        except core_versions.InvalidSpecifier:
            # Valid PEP 440 that the core's subset (which the CLI uses too) cannot evaluate, e.g. `===`.
            errors.add(field, f"{spec!r} cannot be checked against logs; use ==, !=, <, <=, >, >= or ~=")
            continue
        if package in out:
            errors.add(field, f"{package} is named twice")
            continue
        out[package] = spec
    return out


def _superseded_by(errors: _Errors, value: Any, *, project: Project, instance: Decision | None) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        errors.add("superseded_by", "must be the id of the record that replaces this one, or null")
        return None
    target = Decision.objects.filter(project=project, id=value).first()
    if target is None:
        errors.add("superseded_by", f"project {project.slug} has no decision record with id {value}")
        return None
    if instance is not None:
        seen = {instance.id}
        step: Decision | None = target
        while step is not None:
            if step.id in seen:
                errors.add("superseded_by", f"{target.label} is (or is superseded by) this record: a cycle")
                return None
            seen.add(step.id)
            step = step.superseded_by
    return target.id


def decision_clean(
    data: Mapping[str, Any], *, project: Project, instance: Decision | None = None
) -> dict[str, Any]:
    """The editable fields of `data`, checked and normalised; on create (no instance) every field, with
    defaults for the missing ones. Raises DecisionInvalid with every problem at once."""
    errors = _Errors()
    unknown = sorted(set(data) - set(EDITABLE))
    for name in unknown:
        errors.add(name, f"unknown field; the fields are {', '.join(EDITABLE)}")
    creating = instance is None
    out: dict[str, Any] = {}
    if creating or "title" in data:
        out["title"] = _text(errors, "title", data.get("title"), limit=300, required=True)
    if creating or "status" in data:
        status = data.get("status", Decision.Status.PROPOSED)
        if status not in Decision.Status.values:
            errors.add("status", f"must be one of {', '.join(Decision.Status.values)}, not {status!r}")
        out["status"] = status
    for name in ("context", "decision", "consequences"):
        if creating or name in data:
            out[name] = _text(errors, name, data.get(name))
    if creating or "alternatives" in data:
        out["alternatives"] = _alternatives(errors, data.get("alternatives"))
    if creating or "links" in data:
        current = decision_links(instance) if instance is not None else {}
        out["links"] = _links(errors, data.get("links"), project=project, current=current)
    if creating or "revisit_when" in data:
        out["revisit_when"] = _revisit_when(errors, data.get("revisit_when"))
    if creating or "superseded_by" in data:
        out["superseded_by"] = _superseded_by(
            errors, data.get("superseded_by"), project=project, instance=instance
        )
    # A record names its successor exactly when it is superseded.
    status = out.get("status", instance.status if instance is not None else None)
    successor = out.get("superseded_by", instance.superseded_by_id if instance is not None else None)
    if out.get("superseded_by") is not None and "status" not in data:
        out["status"] = status = Decision.Status.SUPERSEDED
    elif "status" in out and status != Decision.Status.SUPERSEDED and "superseded_by" not in data:
        out["superseded_by"] = successor = None
    if status == Decision.Status.SUPERSEDED and successor is None and "superseded_by" not in errors.by_field:
        errors.add("superseded_by", "a superseded record names the record that replaces it (its id)")
    elif status != Decision.Status.SUPERSEDED and successor is not None:
        errors.add("superseded_by", f"only a superseded record names a successor; the status is {status}")
    errors.raise_any()
    return out

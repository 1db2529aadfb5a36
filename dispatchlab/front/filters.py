"""Filters of the reports and groups lists: GET parameters, validated by a form, applied server-side.

A filter value is taken as given, whether or not a visible report has it yet: a value that matches
nothing lists nothing, and a value that cannot be read (an unknown status, a malformed backend key)
lists nothing too, with the form's error, never the unfiltered list.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.db.models import Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from dispatchlab.core.signatures import FAILURE_CLASSES as TAXONOMY
from dispatchlab.reports.models import FailureGroup, Report

FAILURE_CLASSES = list(TAXONOMY)
BACKEND_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,80}$")


def _choices(values: list[str], *, blank: str = "any") -> list[tuple[str, str]]:
    return [("", blank)] + [(value, value) for value in values if value]


class SuggestionsInput(forms.TextInput):
    """A text input with a <datalist> of known values: it suggests them, and takes any other."""

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs={"placeholder": "any", **(attrs or {})})
        self.suggestions: list[str] = []

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        list_id = f"{(attrs or {}).get('id') or f'id_{name}'}-suggestions"
        html = super().render(name, value, {**(attrs or {}), "list": list_id}, renderer)
        options = format_html_join("", '<option value="{}">', ((item,) for item in self.suggestions))
        return format_html('{}<datalist id="{}">{}</datalist>', html, list_id, options)


def _suggested(max_length: int, **kwargs: Any) -> forms.CharField:
    return forms.CharField(required=False, max_length=max_length, widget=SuggestionsInput(), **kwargs)


class ReportFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="text")
    project = _suggested(100)
    server = _suggested(20)
    arch = _suggested(20)
    failure_class = forms.ChoiceField(required=False, label="failure class")
    signature = _suggested(200)
    backend = forms.CharField(
        required=False,
        max_length=120,
        help_text="a backend value, or key=value (draft keys match too), e.g. moe_runner_backend=triton",
    )
    status = forms.ChoiceField(required=False, choices=_choices([s.value for s in Report.Status]))

    def __init__(self, data: Any, *, reports: QuerySet[Report], projects: QuerySet[Any]) -> None:
        super().__init__(data)

        def distinct(column: str) -> list[str]:
            values = reports.order_by(column).values_list(column, flat=True).distinct()
            return [str(v) for v in values[:200] if v]

        # Suggestions only: a value no visible report has yet still filters (and lists nothing).
        suggestions = {
            "project": [p.slug for p in projects],
            "server": distinct("server"),
            "arch": distinct("arch"),
            "signature": distinct("top_match_id"),
        }
        for name, values in suggestions.items():
            self.fields[name].widget.suggestions = values  # type: ignore[attr-defined]
        self.fields["failure_class"].choices = _choices(
            sorted(set(FAILURE_CLASSES) | set(distinct("failure_class")))
        )

    def clean_backend(self) -> str:
        value = str(self.cleaned_data.get("backend") or "").strip()
        if "=" in value:
            key = value.split("=", 1)[0].strip()
            if not BACKEND_KEY_RE.match(key):
                raise forms.ValidationError("key=value: the key is a backend name such as attention_backend")
        return value


def backend_filter(reports: QuerySet[Report], value: str) -> QuerySet[Report]:
    """key=value matches that key of the main or the draft model; a bare value matches the value of
    any key (never a key's name)."""
    if "=" in value:
        key, wanted = (part.strip() for part in value.split("=", 1))
        key = key.removeprefix("draft_")
        return reports.alias(
            _main=KeyTextTransform(key, "backend_values"),
            _draft=KeyTextTransform(f"draft_{key}", "backend_values"),
        ).filter(Q(_main__iexact=wanted) | Q(_draft__iexact=wanted))
    # The column's JSON text ({"key": "value", ...}, as json.dumps and PostgreSQL's jsonb both write
    # it) holds each string value after a colon and a space; a key is preceded by "{" or ", ".
    # A colon inside a string is written escaped before its quote, so it cannot fake the pattern.
    needle = json.dumps(value, ensure_ascii=False)
    return reports.alias(_backends=Cast("backend_values", TextField())).filter(
        _backends__icontains=f": {needle}"
    )


def text_filter(reports: QuerySet[Report], text: str) -> QuerySet[Report]:
    query = Q()
    for column in (
        "title",
        "top_match_title",
        "top_match_id",
        "model_name",
        "gpu_name",
        "server_version",
        "failure_class",
        "launch_command",
        "ci_job",
        "files__original_name",
    ):
        query |= Q(**{f"{column}__icontains": text})
    query |= Q(fingerprint__istartswith=text)
    if text.isascii() and text.isdigit() and len(text) <= 12:
        query |= Q(pk=int(text))
    # the join on files can repeat a report: keep ids in a subquery instead of .distinct() on big rows
    return reports.filter(pk__in=Report.objects.filter(query).values("pk"))


def filter_reports(reports: QuerySet[Report], form: ReportFilterForm) -> QuerySet[Report]:
    if not form.is_valid():
        # Leaving the bad field out would widen the list to reports the user did not ask for.
        return reports.none()
    data = form.cleaned_data
    for field, column in (
        ("project", "project__slug"),
        ("server", "server"),
        ("arch", "arch"),
        ("failure_class", "failure_class"),
        ("signature", "top_match_id"),
        ("status", "status"),
    ):
        if data.get(field):
            reports = reports.filter(**{column: data[field]})
    if data.get("backend"):
        reports = backend_filter(reports, data["backend"])
    if data.get("q"):
        reports = text_filter(reports, data["q"])
    return reports


class GroupFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="text")
    failure_class = forms.ChoiceField(
        required=False, choices=_choices(FAILURE_CLASSES), label="failure class"
    )
    arch = forms.CharField(required=False, max_length=20)


def filter_groups(groups: QuerySet[FailureGroup], form: GroupFilterForm) -> QuerySet[FailureGroup]:
    if not form.is_valid():
        return groups.none()
    data = form.cleaned_data
    if data.get("failure_class"):
        groups = groups.filter(failure_class=data["failure_class"])
    if data.get("arch"):
        groups = groups.filter(pk__in=Report.objects.filter(arch=data["arch"]).values("group_id"))
    if data.get("q"):
        text = data["q"]
        groups = groups.filter(Q(title__icontains=text) | Q(fingerprint__istartswith=text))
    return groups

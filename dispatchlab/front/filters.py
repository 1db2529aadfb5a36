"""Filters of the reports and groups lists: GET parameters, validated by a form, applied server-side."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.db.models import Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from dispatchlab.core.signatures import FAILURE_CLASSES as TAXONOMY
from dispatchlab.reports.models import FailureGroup, Report

FAILURE_CLASSES = list(TAXONOMY)
BACKEND_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,80}$")


def _choices(values: list[str], *, blank: str = "any") -> list[tuple[str, str]]:
    return [("", blank)] + [(value, value) for value in values if value]


class ReportFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="text")
    project = forms.ChoiceField(required=False)
    server = forms.ChoiceField(required=False)
    arch = forms.ChoiceField(required=False)
    failure_class = forms.ChoiceField(required=False, label="failure class")
    signature = forms.ChoiceField(required=False)
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

        self.fields["project"].choices = _choices([p.slug for p in projects])
        self.fields["server"].choices = _choices(distinct("server"))
        self.fields["arch"].choices = _choices(distinct("arch"))
        self.fields["failure_class"].choices = _choices(
            sorted(set(FAILURE_CLASSES) | set(distinct("failure_class")))
        )
        self.fields["signature"].choices = _choices(distinct("top_match_id"))

    def clean_backend(self) -> str:
        value = str(self.cleaned_data.get("backend") or "").strip()
        if "=" in value:
            key = value.split("=", 1)[0].strip()
            if not BACKEND_KEY_RE.match(key):
                raise forms.ValidationError("key=value: the key is a backend name such as attention_backend")
        return value


def backend_filter(reports: QuerySet[Report], value: str) -> QuerySet[Report]:
    """key=value matches that key of the main or the draft model; a bare value matches any key."""
    if "=" in value:
        key, wanted = (part.strip() for part in value.split("=", 1))
        key = key.removeprefix("draft_")
        return reports.alias(
            _main=KeyTextTransform(key, "backend_values"),
            _draft=KeyTextTransform(f"draft_{key}", "backend_values"),
        ).filter(Q(_main__iexact=wanted) | Q(_draft__iexact=wanted))
    # the JSON text of the column holds every value as "value" (quoted)
    return reports.alias(_backends=Cast("backend_values", TextField())).filter(
        _backends__icontains=f'"{value}"'
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
    if text.isdigit():
        query |= Q(pk=int(text))
    # the join on files can repeat a report: keep ids in a subquery instead of .distinct() on big rows
    return reports.filter(pk__in=Report.objects.filter(query).values("pk"))


def filter_reports(reports: QuerySet[Report], form: ReportFilterForm) -> QuerySet[Report]:
    form.is_valid()  # an invalid field is left out; the valid ones still filter
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
    form.is_valid()
    data = form.cleaned_data
    if data.get("failure_class"):
        groups = groups.filter(failure_class=data["failure_class"])
    if data.get("arch"):
        groups = groups.filter(pk__in=Report.objects.filter(arch=data["arch"]).values("group_id"))
    if data.get("q"):
        text = data["q"]
        groups = groups.filter(Q(title__icontains=text) | Q(fingerprint__istartswith=text))
    return groups

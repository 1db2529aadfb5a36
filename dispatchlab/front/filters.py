"""Filters of the reports and groups lists: GET parameters, validated by a form, applied server-side by
the selectors the API's lists use too (dispatchlab.reports.selectors.reports_filtered / groups_filtered).

A filter value is taken as given, whether or not a visible report has it yet: a value that matches
nothing lists nothing, and a value that cannot be read (an unknown status, a malformed backend key)
lists nothing too, with the form's error, never the unfiltered list.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.db.models import Q, QuerySet
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from dispatchlab.core.signatures import FAILURE_CLASSES as TAXONOMY
from dispatchlab.reports.models import FailureGroup, Report
from dispatchlab.reports.selectors import backend_filter_problem, groups_filtered, reports_filtered

FAILURE_CLASSES = list(TAXONOMY)


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
        problem = backend_filter_problem(value)
        if problem:
            raise forms.ValidationError(problem)
        return value


# What people type for an arch, and the `gpu.arch` values (the Report.arch column) each one means.
ARCH_FAMILIES = {
    "blackwell": ("sm_100", "sm_101", "sm_103", "sm_110", "sm_120", "sm_121"),
    "hopper": ("sm_90",),
    "ada": ("sm_89",),
    "lovelace": ("sm_89",),
    "ampere": ("sm_80", "sm_86", "sm_87"),
    "turing": ("sm_75",),
    "volta": ("sm_70",),
}
ARCH_TOKEN = re.compile(r"^(?:sm|compute)[ _-]?(\d{2,3})[afk]?$", re.IGNORECASE)


def arches_named(text: str) -> set[str]:
    """The archs a free text names: `sm_120`, `SM120a`, `compute_90`, or a family (`Blackwell`)."""
    arches: set[str] = set()
    for word in text.lower().split():
        token = ARCH_TOKEN.match(word)
        if token:
            arches.add(f"sm_{token.group(1)}")
        arches.update(ARCH_FAMILIES.get(word, ()))
    return arches


def gpu_text_query(text: str) -> Q:
    """The reports whose GPU the free text names: every word of it in the GPU name (`pro 6000` finds
    `NVIDIA RTX PRO 6000 Blackwell ...`), or an arch it names in the arch column (`sm120`, `hopper`).
    Both are columns Report stores from the document's gpu.name and gpu.arch (report_columns)."""
    by_name = Q()
    for word in text.split():
        by_name &= Q(gpu_name__icontains=word)
    # the text itself too: an arch the names above do not cover (gfx942)
    arches = arches_named(text) | {text.strip().lower()}
    return by_name | Q(arch__in=sorted(arches))


def filter_reports(reports: QuerySet[Report], form: ReportFilterForm) -> QuerySet[Report]:
    """The page's filters; its free text finds what the API's does (title, signature, model, file
    names...) and, besides, the GPU by name and arch (gpu_text_query)."""
    if not form.is_valid():
        # Leaving the bad field out would widen the list to reports the user did not ask for.
        return reports.none()
    fields = dict(form.cleaned_data)
    text = str(fields.pop("q", "") or "").strip()
    filtered = reports_filtered(reports, **fields)
    if not text:
        return filtered
    by_text = reports_filtered(reports, q=text).values("pk")
    return filtered.filter(Q(pk__in=by_text) | gpu_text_query(text))


class GroupFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="text")
    failure_class = forms.ChoiceField(
        required=False, choices=_choices(FAILURE_CLASSES), label="failure class"
    )
    arch = forms.CharField(required=False, max_length=20)


def filter_groups(groups: QuerySet[FailureGroup], form: GroupFilterForm) -> QuerySet[FailureGroup]:
    if not form.is_valid():
        return groups.none()
    return groups_filtered(groups, **form.cleaned_data)

"""The report page's "Sweep backends" panel gets its data here, so the page itself only includes the
partial (front/gpu/partials/sweep_panel.html): `{% sweep_panel_context as sweep_panel %}`."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.simple_tag(takes_context=True)
def sweep_panel_context(context: Any) -> dict[str, Any]:
    from dispatchlab.front.sweep_views import report_panel_context

    request, report = context.get("request"), context.get("report")
    if request is None or report is None:
        return {}
    return report_panel_context(request, report)

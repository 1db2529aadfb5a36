from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import template
from django.urls import reverse
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString

from dispatchlab.decisions.markdown import render_markdown, render_markdown_excerpt
from dispatchlab.front.compare import show
from dispatchlab.front.figures import UNKNOWN_YEAR
from dispatchlab.front.presenters import ORIGIN_HELP
from dispatchlab.front.report_page import reference_url

register = template.Library()


@register.simple_tag
def log_url(report_id: int, line: int | None = None, **params: Any) -> str:
    """/reports/<id>/log/?line=N#L<N>: the window centred on line N, scrolled to it."""
    url = reverse("front:log", args=[report_id])
    query = {k: v for k, v in params.items() if v not in (None, "")}
    if line:
        query = {"line": int(line), **query}
    if query:
        url += "?" + urlencode(query)
    if line:
        url += f"#L{int(line)}"
    return url


@register.simple_tag
def origin_badge(report_id: int, side: Any) -> str:
    """Where a backend value came from: flag / args / message / default, linked to its line."""
    if side is None or side.value is None:
        return ""
    source = side.source or "unknown"
    tip = ORIGIN_HELP.get(source, "origin unknown")
    if side.text:
        tip = f"{tip}: {side.text}"
    if side.line:
        return format_html(
            '<a class="badge origin origin-{}" href="{}" title="{}">{} · L{}</a>',
            source,
            log_url(report_id, side.line),
            tip,
            source,
            side.line,
        )
    return format_html('<span class="badge origin origin-{}" title="{}">{}</span>', source, tip, source)


@register.filter
def seconds(value: Any) -> str:
    if not isinstance(value, int | float):
        return "—"
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


@register.filter
def signed_seconds(value: Any) -> str:
    if not isinstance(value, int | float):
        return ""
    return ("+" if value > 0 else "−" if value < 0 else "±") + seconds(abs(value))


@register.filter
def report_name(report: Any) -> str:
    return str(report.title or report.top_match_title or f"report {report.pk}")


@register.filter
def underscores_to_spaces(value: Any) -> str:
    return str(value or "").replace("_", " ")


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.filter
def safe_url(value: Any) -> str:
    """Only http(s) references become links; anything else (javascript:, data:) is shown as text."""
    text = str(value or "")
    return text if text.lower().startswith(("http://", "https://")) else ""


@register.filter
def shown(value: Any) -> str:
    """A JSON value as people read it: strings bare, null as a dash, the rest as JSON."""
    return show(value)


@register.filter
def ticks(value: Any) -> SafeString:
    """Knowledge-base prose marks code with backticks: show those parts as <code>. Every part is
    escaped; the only markup added is our own <code> tag."""
    text = str(value or "")
    parts = text.split("`")
    if len(parts) % 2 == 0:  # the last backtick is unpaired (a cut text): keep it as text
        parts = [*parts[:-2], parts[-2] + "`" + parts[-1]]
    out = SafeString()
    for i, part in enumerate(parts):
        out += format_html("<code>{}</code>", part) if i % 2 else conditional_escape(part)
    return out


@register.filter
def markdown(value: Any) -> SafeString:
    """Knowledge-base prose is Markdown: rendered, then sanitised (dispatchlab.decisions.markdown)."""
    return render_markdown(str(value or ""))


@register.filter
def log_time(value: Any) -> str:
    """A log's own ISO time to the minute, as the log printed it: no year where the log has none."""
    text = str(value or "").replace("T", " ")[:16]
    return text[5:] if text.startswith(f"{UNKNOWN_YEAR}-") else text


@register.filter
def markdown_excerpt(value: Any, limit: int = 420) -> SafeString:
    """The first `limit` characters of Markdown prose, inline, cut where no markup is left open."""
    return render_markdown_excerpt(str(value or ""), int(limit))


@register.simple_tag
def reference_link(reference: Any) -> str:
    """A reference as a link where it names a GitHub thread, a project file or an http(s) URL."""
    text = str(reference or "")
    url = reference_url(text)
    if url:
        return format_html('<a href="{}" rel="noreferrer noopener">{}</a>', url, text)
    return format_html("<code>{}</code>", text)

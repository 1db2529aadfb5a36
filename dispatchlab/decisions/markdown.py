"""Markdown of decision records (context, decision, consequences) as safe HTML.

markdown-it-py (CommonMark, tables, strikethrough) renders without raw HTML: a `<script>` people type is
text. nh3 (the Ammonia sanitiser) then keeps only the tags and attributes below and http(s)/mailto links,
so a `javascript:` link or an `onerror` attribute cannot survive even a parser bug. Only this module's
output is marked safe.
"""

from __future__ import annotations

import re
from functools import lru_cache

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

TAGS = {
    "p", "br", "hr", "em", "strong", "del", "code", "pre", "blockquote",
    "ul", "ol", "li", "a", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}, "th": {"style"}, "td": {"style"}}
URL_SCHEMES = {"http", "https", "mailto"}


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(["table", "strikethrough"])


def render_markdown(text: str) -> SafeString:
    if not text.strip():
        return SafeString("")
    html = _parser().render(text)
    clean = nh3.clean(
        html,
        tags=TAGS,
        attributes=ATTRIBUTES,
        url_schemes=URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        filter_style_properties={"text-align"},
    )
    return mark_safe(clean)  # sanitised by nh3 just above


_CODE_SPAN = re.compile(r"`[^`]*`")
# `_` opens or closes emphasis only beside a space or punctuation, never inside moe_runner_backend.
_EMPHASIS_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def _closes_its_markup(text: str) -> bool:
    """Whether every code span, emphasis and link opened in `text` is closed in it."""
    if text.count("`") % 2:
        return False
    outside = _CODE_SPAN.sub("", text)
    return (
        outside.count("*") % 2 == 0
        and len(_EMPHASIS_UNDERSCORE.findall(outside)) % 2 == 0
        and outside.count("[") == outside.count("]")
        and outside.count("(") == outside.count(")")
    )


def markdown_cut(text: str, limit: int) -> str:
    """At most `limit` characters of Markdown prose on one line, cut at a space where every code span,
    emphasis and link is closed (a summary that shows a raw `*` or backtick reads as broken), with "…"
    when something was cut."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cuts = [m.start() for m in re.finditer(r" ", flat[: limit + 1])]
    for cut in reversed(cuts):
        if _closes_its_markup(flat[:cut]):
            return flat[:cut].rstrip(" ,;:") + " …"
    # no clean place (one long code span): the words, without their markup
    return re.sub(r"[`*_\[\]]", "", flat[:limit]).rstrip() + " …"


def render_markdown_excerpt(text: str, limit: int) -> SafeString:
    """markdown_cut() rendered inline (no paragraph), sanitised as render_markdown() is."""
    cut = markdown_cut(text, limit)
    if not cut:
        return SafeString("")
    html = _parser().renderInline(cut)
    clean = nh3.clean(
        html,
        tags=TAGS,
        attributes=ATTRIBUTES,
        url_schemes=URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
    )
    return mark_safe(clean)  # sanitised by nh3 just above

"""Markdown of decision records (context, decision, consequences) as safe HTML.

markdown-it-py (CommonMark, tables, strikethrough) renders without raw HTML: a `<script>` people type is
text. nh3 (the Ammonia sanitiser) then keeps only the tags and attributes below and http(s)/mailto links,
so a `javascript:` link or an `onerror` attribute cannot survive even a parser bug. Only this module's
output is marked safe.
"""

from __future__ import annotations

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

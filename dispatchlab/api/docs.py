"""The API page (/api/): the generated OpenAPI document as HTML, drawn by a template from the document
itself, so it cannot say other than /api/schema/ does. Nothing is fetched at run time (no CDN)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.safestring import SafeString
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from dispatchlab.api.schema import openapi_schema
from dispatchlab.decisions.markdown import render_markdown

REF = "#/components/schemas/"
METHODS = ("get", "post", "put", "patch", "delete")


def _md(text: str) -> SafeString:
    """A description (CommonMark: `code`, links) as sanitised HTML; one paragraph loses its <p>."""
    html = render_markdown(text).strip()
    if html.startswith("<p>") and html.endswith("</p>") and html.count("<p>") == 1:
        return SafeString(html[3:-4])  # the sanitiser's output, less one balanced wrapper
    return SafeString(html)


def type_label(schema: dict[str, Any] | None) -> dict[str, Any]:
    """A schema as a short label for people ("array of ReportSummary", "string or null", "one of: a, b"),
    with the component it names (for a link), if any."""
    if not schema:
        return {"text": "any", "ref": None}
    if "$ref" in schema:
        name = schema["$ref"].removeprefix(REF)
        return {"text": name, "ref": name}
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [type_label(item) for item in schema[key]]
            refs = [part["ref"] for part in parts if part["ref"]]
            return {"text": " or ".join(part["text"] for part in parts), "ref": refs[0] if refs else None}
    if "enum" in schema:
        return {"text": "one of: " + ", ".join(str(value) for value in schema["enum"]), "ref": None}
    kind = schema.get("type", "any")
    if kind == "array":
        inner = type_label(schema.get("items"))
        return {"text": f"array of {inner['text']}", "ref": inner["ref"]}
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        inner = type_label(schema["additionalProperties"])
        return {"text": f"object of {inner['text']}", "ref": inner["ref"]}
    text = " or ".join(kind) if isinstance(kind, list) else str(kind)
    if schema.get("format"):
        text += f" ({schema['format']})"
    limits = [
        f"{label} {schema[key]}"
        for key, label in (("minimum", "≥"), ("maximum", "≤"), ("maxLength", "length ≤"))
        if key in schema
    ]
    if limits:
        text += ", " + ", ".join(limits)
    return {"text": text, "ref": None}


def _fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    required = set(schema.get("required", ()))
    return [
        {
            "name": name,
            "type": type_label(prop),
            "required": name in required,
            "description": _md(prop.get("description", "")),
        }
        for name, prop in schema.get("properties", {}).items()
    ]


def _content(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"media": media, "type": type_label(item.get("schema"))} for media, item in content.items()]


def api_page(document: dict[str, Any]) -> dict[str, Any]:
    """The template's context: operations by tag, in the document's order, and the shapes."""
    sections: dict[str, list[dict[str, Any]]] = {}
    for path, item in document["paths"].items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            sections.setdefault((op.get("tags") or ["other"])[0], []).append(
                {
                    "id": op["operationId"],
                    "method": method.upper(),
                    "path": path,
                    "summary": _md(op.get("summary", "")),
                    "description": _md(op.get("description", "")),
                    "public": op.get("security") == [],
                    "parameters": [
                        {
                            "name": p["name"],
                            "in": p["in"],
                            "required": p.get("required", False),
                            "type": type_label(p.get("schema")),
                            "description": _md(p.get("description", "")),
                        }
                        for p in op.get("parameters", [])
                    ],
                    "body": _content(op["requestBody"]["content"]) if "requestBody" in op else [],
                    "responses": [
                        {
                            "status": status,
                            "description": _md(answer.get("description", "")),
                            "content": _content(answer.get("content", {})),
                        }
                        for status, answer in op["responses"].items()
                    ],
                }
            )
    shapes = [
        {
            "name": name,
            "description": _md(schema.get("description", "")),
            "fields": _fields(schema),
            "open": schema.get("additionalProperties") is True,
        }
        for name, schema in sorted(document["components"]["schemas"].items())
    ]
    info = {**document["info"], "description": _md(document["info"].get("description", ""))}
    return {"info": info, "sections": list(sections.items()), "shapes": shapes}


@csrf_exempt  # a page that changes nothing: any other method is a 405, not a CSRF refusal
@require_GET
def api_docs(request: HttpRequest) -> HttpResponse:
    """Public, as the document is: it holds no project data."""
    document = openapi_schema(server_url=request.build_absolute_uri("/"))
    return render(
        request,
        "api/docs.html",
        {**api_page(document), "schema_url": reverse("api:schema"), "openapi": document["openapi"]},
    )

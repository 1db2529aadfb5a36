"""The OpenAPI document, generated from the code that answers the requests (served at /api/schema/).

Nothing here describes an endpoint by hand:

- paths, their parameters and methods come from the URLconf (`path("api/v1/reports/<int:report_id>",
  ...)` is `/api/v1/reports/{id}`) and from the `@operation` declaration of each view;
- every request and response body, query string and header set is a TypedDict (dispatchlab/api/shapes.py,
  dispatchlab.api.decision_shapes.py) that the views build their answers with; pydantic's TypeAdapter
  turns those types into JSON Schema (components/schemas, by class name);
- the same query TypedDict validates the query string before the view runs, so a value the document
  refuses is a 400 naming the parameter and what it takes.

`@operation(...)` makes a view: it answers a method it does not declare with a JSON 405 (and `Allow`),
never Django's HTML page, and is CSRF-exempt (authenticate() checks session callers itself). `route(a, b)`
joins the views of one path's methods into one.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, URLResolver, get_resolver
from django.views.decorators.csrf import csrf_exempt
from pydantic import TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema

from dispatchlab.api.pagination import NO_NUL
from dispatchlab.api.shapes import ERROR, INVALID

TITLE = "dispatchlab API"
REF_TEMPLATE = "#/components/schemas/{model}"
STATUS_TEXT = {
    200: "OK.",
    201: "Created.",
    400: "The request is malformed; the message says what to change.",
    401: "Missing or invalid credentials (`WWW-Authenticate: Bearer`).",
    403: "Not allowed: a read-only token, a viewer, or a failed CSRF check.",
    404: "No such thing, or not in the caller's projects.",
    411: "A body without Content-Length that this server cannot read.",
    413: "The body is larger than the server takes.",
    507: "Over the project's storage quota.",
}
# Django's path converters as JSON Schema.
CONVERTERS: dict[str, dict[str, Any]] = {
    "int": {"type": "integer", "minimum": 0},
    "slug": {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"},
    "str": {"type": "string", "pattern": "^[^/]+$"},
}
ROUTE_PARAM = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")

View = Callable[..., HttpResponse]


@dataclass(frozen=True)
class Operation:
    """One method of one path, as the document shows it."""

    method: str
    id: str
    summary: str
    answers: Mapping[int, tuple[Any, str]]  # status -> (shape or None, description)
    description: str = ""
    query: Any = None  # a TypedDict of the query string, validated before the view runs
    headers: Any = None  # a TypedDict of request headers (documented; the view reads them)
    body: Mapping[str, Any] = field(default_factory=dict)  # media type -> shape
    body_required: bool = True
    public: bool = False  # no credentials needed (the schema itself, the signed CI webhook)
    tags: tuple[str, ...] = ()


# ---------------------------------------------------------------- views


def _not_allowed(allowed: list[str]) -> JsonResponse:
    response = JsonResponse(
        {"error": f"this endpoint answers {', '.join(allowed)}, not this method"}, status=405
    )
    response["Allow"] = ", ".join(allowed)
    return response


def _dispatcher(handlers: dict[str, tuple[Operation, View]]) -> View:
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        handler = handlers.get(request.method or "")
        if handler is None:
            return _not_allowed(list(handlers))
        op, func = handler
        if op.query is not None:
            query = parse_query(request, op.query)
            if isinstance(query, JsonResponse):
                return query
            kwargs["query"] = query
        return func(request, **kwargs)

    first = next(iter(handlers.values()))[1]
    view.__name__ = first.__name__
    view.__qualname__ = first.__qualname__
    view.__module__ = first.__module__
    view.__doc__ = first.__doc__
    view.handlers = handlers  # type: ignore[attr-defined]
    view.operations = {method: op for method, (op, _) in handlers.items()}  # type: ignore[attr-defined]
    # Session callers are CSRF-checked in authenticate(); token callers and the signed webhook need not be.
    return csrf_exempt(view)


def operation(
    method: str,
    id: str,
    *,
    summary: str,
    answers: Mapping[int, Any],
    description: str = "",
    query: Any = None,
    headers: Any = None,
    body: Mapping[str, Any] | None = None,
    body_required: bool = True,
    public: bool = False,
    tags: tuple[str, ...] = (),
) -> Callable[[View], View]:
    """Declare a view's method for the document; `answers` maps a status to a shape (or to
    `(shape, description)`; None for a shape is an answer without a JSON body)."""
    declared = Operation(
        method=method.upper(),
        id=id,
        summary=summary,
        description=description,
        answers={
            status: answer if isinstance(answer, tuple) else (answer, STATUS_TEXT.get(status, ""))
            for status, answer in answers.items()
        },
        query=query,
        headers=headers,
        body=dict(body or {}),
        body_required=body_required,
        public=public,
        tags=tags,
    )

    def decorate(func: View) -> View:
        return _dispatcher({declared.method: (declared, func)})

    return decorate


def route(*views: View) -> View:
    """One view for one path from the views of its methods (each made by @operation)."""
    handlers: dict[str, tuple[Operation, View]] = {}
    for view in views:
        handlers.update(view.handlers)  # type: ignore[attr-defined]
    return _dispatcher(handlers)


def operations_of(view: Any) -> dict[str, Operation]:
    return dict(getattr(view, "operations", {}))


# ---------------------------------------------------------------- the query string


class _Quiet(GenerateJsonSchema):
    """JSON Schema without the titles pydantic derives from names ("Id" for id): noise in a document."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def generate(self, schema: Any, mode: Any = "validation") -> Any:
        out = super().generate(schema, mode)
        out.pop("title", None)
        return out


# pydantic reads a TypedDict's source (inspect, then ast.parse) when it first builds its schema, and CPython 3.11's
# ast.parse cannot run in two threads at once ("AST constructor recursion depth mismatch": a 500 when eight first
# requests reached a web process together): shapes are built one at a time
BUILDING = threading.RLock()


def _adapter(shape: Any) -> TypeAdapter[Any]:
    with BUILDING:
        return _built_adapter(shape)


@functools.cache
def _built_adapter(shape: Any) -> TypeAdapter[Any]:
    return TypeAdapter(shape)


def _properties(shape: Any) -> tuple[dict[str, Any], frozenset[str]]:
    with BUILDING:
        return _built_properties(shape)


@functools.cache
def _built_properties(shape: Any) -> tuple[dict[str, Any], frozenset[str]]:
    schema = _adapter(shape).json_schema(schema_generator=_Quiet, ref_template=REF_TEMPLATE)
    return dict(schema.get("properties", {})), frozenset(schema.get("required", ()))


def _problem(error: Mapping[str, Any], prop: Mapping[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if "enum" in prop:
        return "must be one of " + ", ".join(str(value) for value in prop["enum"])
    if kind in ("int_parsing", "int_type", "int_parsing_size", "int_from_float"):
        return "must be a whole number"
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')}"
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')}"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "string_pattern_mismatch":
        if ctx.get("pattern") == NO_NUL:
            return "must not hold a NUL character"
        return f"must match {ctx.get('pattern')}"
    if kind == "bool_parsing":
        return "must be true or false"
    if kind == "missing":
        return "is required"
    message = str(error.get("msg", "is not valid"))
    return message.removeprefix("Value error, ")


def parse_query(request: HttpRequest, shape: Any) -> Any:
    """The query string as `shape` (a TypedDict), or a 400 naming each bad parameter and what it takes.
    An empty value is no value (`?status=&project=acme`, as a filter form sends it; the document says so
    with allowEmptyValue); unknown parameters are ignored."""
    properties, _ = _properties(shape)
    raw = {name: request.GET[name] for name in properties if request.GET.get(name)}
    try:
        return _adapter(shape).validate_python(raw)
    except ValidationError as invalid:
        fields: dict[str, list[str]] = {}
        for item in invalid.errors():
            name = str(item["loc"][0]) if item["loc"] else "query"
            fields.setdefault(name, []).append(_problem(item, properties.get(name, {})))
        message = "; ".join(f"{name} {problem}" for name, problems in fields.items() for problem in problems)
        return JsonResponse({"error": message, "fields": fields}, status=400)


# ---------------------------------------------------------------- the document


@dataclass(frozen=True)
class Endpoint:
    path: str  # as OpenAPI writes it: /api/v1/reports/{id}
    route: str  # as Django wrote it: api/v1/reports/<int:report_id>
    name: str  # the URL name, "api:report"
    view: Any


def _walk(patterns: list[Any], prefix: str = "", namespace: str = "") -> Iterator[Endpoint]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            yield from _walk(pattern.url_patterns, route, inner)
        elif isinstance(pattern, URLPattern):
            yield Endpoint(openapi_path(route), route, f"{namespace}{pattern.name or ''}", pattern.callback)


def endpoints(urlconf: str | None = None) -> list[Endpoint]:
    """Every URL of the URLconf whose view declares operations."""
    return [found for found in _walk(get_resolver(urlconf).url_patterns) if operations_of(found.view)]


def _path_name(name: str, count: int) -> str:
    # A route's one `<int:report_id>` is `{id}`, as the contract writes the paths.
    return "id" if count == 1 and name.endswith("_id") else name


def openapi_path(route: str) -> str:
    found = ROUTE_PARAM.findall(route)
    path = ROUTE_PARAM.sub(lambda m: "{" + _path_name(m["name"], len(found)) + "}", route)
    return "/" + path.lstrip("^").rstrip("$")


def _path_parameters(route: str) -> list[dict[str, Any]]:
    found = ROUTE_PARAM.findall(route)
    return [
        {
            "name": _path_name(name, len(found)),
            "in": "path",
            "required": True,
            "description": f"the {name.removesuffix('_id').replace('_', ' ')}'s id",
            "schema": dict(CONVERTERS.get(converter or "str", CONVERTERS["str"])),
        }
        for converter, name in found
    ]


def _parameters(shape: Any, where: str) -> list[dict[str, Any]]:
    properties, required = _properties(shape)
    out = []
    for name, schema in properties.items():
        schema = _tidy(schema)
        description = schema.pop("description", "")
        parameter: dict[str, Any] = {"name": name, "in": where, "required": name in required}
        if description:
            parameter["description"] = description
        if where == "query" and name not in required:
            parameter["allowEmptyValue"] = True  # parse_query() reads an empty value as none
        parameter["schema"] = schema
        out.append(parameter)
    return out


@dataclass(frozen=True)
class _Slot:
    """Where a shape's schema goes, filled once every shape is known."""

    key: int


class _Shapes:
    """Every shape of the document, turned into JSON Schema at once so they share components."""

    def __init__(self) -> None:
        self.slots: dict[Any, _Slot] = {}

    def ref(self, shape: Any) -> _Slot:
        if shape not in self.slots:
            self.slots[shape] = _Slot(len(self.slots))
        return self.slots[shape]

    def generate(self) -> tuple[dict[_Slot, Any], dict[str, Any]]:
        with BUILDING:
            inputs = [(slot, "serialization", _adapter(shape)) for shape, slot in self.slots.items()]
            mapping, definitions = TypeAdapter.json_schemas(
                inputs, ref_template=REF_TEMPLATE, schema_generator=_Quiet
            )
        components = {name: _tidy(schema) for name, schema in definitions.get("$defs", {}).items()}
        return {slot: schema for (slot, _), schema in mapping.items()}, components


def _tidy(node: Any) -> Any:
    """A schema as people read it: no title that only repeats its name, descriptions on one line."""
    if isinstance(node, list):
        return [_tidy(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key in ("properties", "$defs", "patternProperties") and isinstance(value, dict):
            out[key] = {name: _tidy(item) for name, item in value.items()}  # names, not keywords
        else:
            out[key] = _tidy(value)
    if isinstance(out.get("description"), str):
        out["description"] = " ".join(out["description"].split())
    return out


def _operation(endpoint: Endpoint, op: Operation, shapes: _Shapes) -> dict[str, Any]:
    doc: dict[str, Any] = {"operationId": op.id, "summary": op.summary}
    if op.description:
        doc["description"] = op.description
    if op.tags:
        doc["tags"] = list(op.tags)
    parameters = _path_parameters(endpoint.route)
    if op.query is not None:
        parameters += _parameters(op.query, "query")
    if op.headers is not None:
        parameters += _parameters(op.headers, "header")
    if parameters:
        doc["parameters"] = parameters
    if op.body:
        doc["requestBody"] = {
            "required": op.body_required,
            "content": {media: {"schema": shapes.ref(shape)} for media, shape in op.body.items()},
        }
    answers = dict(op.answers)
    if op.query is not None:
        answers.setdefault(400, (INVALID, STATUS_TEXT[400]))
    if not op.public:
        answers.setdefault(401, (ERROR, STATUS_TEXT[401]))
        doc["security"] = [{"bearer": []}, {"session": []}]
    else:
        doc["security"] = []
    doc["responses"] = {}
    for status in sorted(answers):
        shape, description = answers[status]
        answer: dict[str, Any] = {"description": description or STATUS_TEXT.get(status, "")}
        if shape is not None:
            answer["content"] = {"application/json": {"schema": shapes.ref(shape)}}
        if status == 401:
            answer["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}}
        doc["responses"][str(status)] = answer
    return doc


def _resolve(node: Any, mapping: dict[_Slot, Any]) -> Any:
    if isinstance(node, dict):
        return {key: _resolve(value, mapping) for key, value in node.items()}
    if isinstance(node, list):
        return [_resolve(value, mapping) for value in node]
    if isinstance(node, _Slot):
        return mapping[node]
    return node


def openapi_document(*, urlconf: str | None = None, server_url: str = "/") -> dict[str, Any]:
    shapes = _Shapes()
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints(urlconf):
        item = paths.setdefault(endpoint.path, {})
        for method, op in operations_of(endpoint.view).items():
            item[method.lower()] = _operation(endpoint, op, shapes)
    mapping, components = shapes.generate()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": TITLE,
            "version": "1",
            "description": (
                "Upload SGLang/vLLM server logs and read the diagnosis. Parsing runs in a worker: POST answers "
                "at once, GET tells the status. Every call sees only the caller's projects: another "
                'project\'s report is a 404. Errors answer `{"error": "<one line for people>"}`; a '
                "refused parameter or field also comes back by name in `fields`. Lists answer a page "
                "(`results`, `count`, `next`, `previous`; `?page=`, `?limit=` up to 100). This document "
                "is generated from the code that answers."
            ),
        },
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}, {"session": []}],
        "paths": _resolve(paths, mapping),
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a token from `manage.py apitoken`",
                },
                "session": {"type": "apiKey", "in": "cookie", "name": "sessionid"},
            },
            "schemas": components,
        },
    }


@functools.cache
def _built() -> dict[str, Any]:
    return openapi_document()


def openapi_schema(*, server_url: str = "/") -> dict[str, Any]:
    """The document for a server at `server_url` (built once per process)."""
    return {**_built(), "servers": [{"url": server_url}]}

"""The authorization matrix as data: who may do what on every page and API endpoint.

One row per (URL name, method), one expected status per caller. test_authz_matrix.py turns each cell into
a test case (`front:report GET as outsider -> 404`) and fails when a URL pattern has neither a row here nor
a reason in EXEMPT_*, so a new page or endpoint cannot ship outside the matrix.

The callers (the app has no owner or admin role: a project has members and viewers, and the first user
`user_bootstrap` creates is a superuser member; "owner" is that user):

    owner           a staff superuser, member of acme; a session everywhere
    member          alice, member of acme; her session on pages, her read-write token on the API
    viewer          bob, viewer of acme; a session everywhere
    viewer_token    a read-write token of bob for acme: his role, not the token, keeps him from writing
    ro_token        a read-only token of alice for acme (on a page a token logs no one in)
    outsider        charlie, member of umbrella only; a session
    outsider_token  a read-write token of charlie for umbrella
    anonymous       no session, no token

Every object a path names belongs to acme (hosts and knowledge-base signatures are global): a report,
another report (compare), its failure group, a confirm run, a probe run, a backend sweep (done, with a proposed
fix), a decision record, a notification endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

CALLERS = ("owner", "member", "viewer", "viewer_token", "ro_token", "outsider", "outsider_token", "anonymous")
# A redirect to the login page (where a page sends anyone without a session).
LOGIN = "302 login"
# Statuses that say the request was refused: nothing may change, nothing may be queued.
REFUSED = (LOGIN, 400, 401, 403, 404, 405)
L = LOGIN

# The object each path parameter names: an attribute of the test's World.
PATH_OBJECTS = {
    "report_id": "report",
    "group_id": "group",
    "confirm_id": "confirm",
    "decision_id": "decision",
    "endpoint_id": "endpoint",
    "host_id": "host",
    "sweep_id": "sweep",
    "project_slug": "project_slug",
    "signature_id": "signature_id",
}


@dataclass(frozen=True)
class Row:
    name: str
    method: str
    expected: dict[str, int | str]
    note: str = ""


def row(name: str, method: str, *statuses: int | str, note: str = "") -> Row:
    assert len(statuses) == len(CALLERS), f"{name} {method}: one status per caller {CALLERS}"
    return Row(name, method, dict(zip(CALLERS, statuses, strict=True)), note)


# fmt: off
MATRIX: list[Row] = [
    #    url name                   method   owner member viewer vw_tok ro_tok outsider out_tok anon
    # ---- pages: anonymous and tokens -> login; another project's object -> 404; a viewer reads only
    row("front:report_list",        "GET",    200,  200,   200,   L,      L,     200,     L,     L),
    row("front:upload",             "GET",    200,  200,   200,   L,      L,     200,     L,     L),
    row("front:upload",             "POST",   302,  302,   403,   L,      L,     400,     L,     L,
        note="a viewer naming acme is refused; an outsider naming acme gets 'Choose a project you can upload to'"),
    row("front:report",             "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:report_status",      "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:log",                "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:redact",             "GET",    200,  200,   403,   L,      L,     404,     L,     L),
    row("front:redact",             "POST",   409,  409,   403,   L,      L,     404,     L,     L,
        note="the matrix's report has no stored log: a member gets as far as 'no stored log to redact'"),
    row("front:groups",             "GET",    200,  200,   200,   L,      L,     200,     L,     L),
    row("front:group",              "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:compare",            "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:hosts",              "GET",    200,  200,   200,   L,      L,     200,     L,     L),
    row("front:host_probe",         "POST",   302,  302,   403,   L,      L,     403,     L,     L,
        note="hosts are global, but a probe run is asked for on behalf of a project: naming acme is refused"),
    row("front:confirm_new",        "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:confirm_new",        "POST",   302,  302,   403,   L,      L,     404,     L,     L),
    row("front:confirm",            "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:confirm_status",     "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:confirm_cancel",     "POST",   302,  302,   403,   L,      L,     404,     L,     L),
    row("front:compat",             "GET",    200,  200,   200,   L,      L,     200,     L,     L),
    row("front:sweep_new",          "POST",   302,  302,   403,   L,      L,     404,     L,     L),
    row("front:sweep",              "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:sweep_status",       "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:sweep_confirm",      "POST",   302,  302,   403,   L,      L,     404,     L,     L,
        note="the one click: a confirm of the full launch with the sweep's proposed backend"),
    row("front:decisions",          "GET",    200,  200,   200,   L,      L,     200,     L,     L),
    row("front:decision_new",       "GET",    200,  200,   403,   L,      L,     404,     L,     L),
    row("front:decision_new",       "POST",   302,  302,   403,   L,      L,     400,     L,     L,
        note="charlie naming acme gets the form back, 'Choose a project you are a member of'"),
    row("front:decision",           "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:decision_edit",      "GET",    200,  200,   403,   L,      L,     404,     L,     L),
    row("front:decision_edit",      "POST",   302,  302,   403,   L,      L,     404,     L,     L),
    row("front:notifications",      "GET",    302,  302,   302,   L,      L,     302,     L,     L,
        note="one project: straight to its page (charlie's: umbrella's)"),
    row("front:notify_project",     "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:notify_project",     "POST",   302,  302,   403,   L,      L,     404,     L,     L),
    row("front:notify_endpoint",    "GET",    200,  200,   200,   L,      L,     404,     L,     L),
    row("front:notify_test",        "POST",   302,  302,   403,   L,      L,     404,     L,     L),
    row("front:notify_pause",       "POST",   302,  302,   403,   L,      L,     404,     L,     L),
    row("front:notify_resume",      "POST",   302,  302,   403,   L,      L,     404,     L,     L),
    row("front:notify_delete",      "POST",   302,  302,   403,   L,      L,     404,     L,     L),
    # ---- API: anonymous -> 401; another project's object -> 404; read-only token and viewer read only
    row("api:docs",                 "GET",    200,  200,   200,   200,    200,   200,     200,   200,
        note="the API page is public, as the document it draws"),
    row("api:schema",               "GET",    200,  200,   200,   200,    200,   200,     200,   200,
        note="the OpenAPI document is public: it holds no project data"),
    row("api:reports",              "GET",    200,  200,   200,   200,    200,   200,     200,   401),
    row("api:reports",              "POST",   201,  201,   403,   403,    403,   404,     404,   401),
    row("api:report",               "GET",    200,  200,   200,   200,    200,   404,     404,   401),
    row("api:ci_hook",              "POST",   401,  401,   401,   401,    401,   401,     401,   401,
        note="authenticated by the project's HMAC signature only: no session or token is enough"),
    row("api:report_redact",        "GET",    200,  200,   200,   200,    200,   404,     404,   401,
        note="a report's redactions (status, reason; never the pattern) are read like the report"),
    row("api:report_redact",        "POST",   409,  409,   403,   403,    403,   404,     404,   401,
        note="the matrix's report has no stored log: a member gets as far as 'no stored log to redact'"),
    row("api:report_confirm",       "POST",   201,  201,   403,   403,    403,   404,     404,   401),
    row("api:confirm",              "GET",    200,  200,   200,   200,    200,   404,     404,   401),
    row("api:confirm_cancel",       "POST",   200,  200,   403,   403,    403,   404,     404,   401),
    row("api:report_sweep",         "POST",   201,  201,   403,   403,    403,   404,     404,   401),
    row("api:sweep",                "GET",    200,  200,   200,   200,    200,   404,     404,   401),
    row("api:hosts",                "GET",    200,  200,   200,   200,    200,   200,     200,   401,
        note="hosts are global"),
    row("api:decisions",            "GET",    200,  200,   200,   200,    200,   200,     200,   401),
    row("api:decisions",            "POST",   201,  201,   403,   403,    403,   404,     404,   401),
    row("api:decision",             "GET",    200,  200,   200,   200,    200,   404,     404,   401),
    row("api:decision",             "PATCH",  200,  200,   403,   403,    403,   404,     404,   401),
    row("api:decision_history",     "GET",    200,  200,   200,   200,    200,   404,     404,   401),
    row("api:groups",               "GET",    200,  200,   200,   200,    200,   200,     200,   401),
    row("api:group",                "GET",    200,  200,   200,   200,    200,   404,     404,   401),
    row("api:signatures",           "GET",    200,  200,   200,   200,    200,   200,     200,   401,
        note="the knowledge base is global"),
    row("api:signature",            "GET",    200,  200,   200,   200,    200,   200,     200,   401,
        note="global, but its decision records and confirm runs are the caller's projects' only"),
]
# fmt: on

# A query string a row's request carries, formatted with the World's ids.
QUERIES = {
    ("front:compare", "GET"): "?a={report}&b={report2}",
    ("front:hosts", "GET"): "?probe={probe}",
    ("front:decision_new", "GET"): "?report={report}",
}

# URL patterns outside the matrix, and why. Static files are not a URL pattern (WhiteNoise serves them
# as middleware); MEDIA is deliberately not exempt: serving uploads by URL would bypass every check here.
EXEMPT_NAMESPACES = {
    "admin": "Django's admin site: guarded by is_staff and model permissions, not project roles "
    "(test_the_admin_site_is_for_staff_only checks that premise)",
}
_AUTH = "django.contrib.auth's views: how a caller gets (or ends) a session; no project data"
EXEMPT_NAMES = {
    "login": _AUTH,
    "logout": _AUTH,
    "password_change": _AUTH + " (the caller's own password)",
    "password_change_done": _AUTH,
    "password_reset": _AUTH + " (by e-mail)",
    "password_reset_done": _AUTH,
    "password_reset_confirm": _AUTH,
    "password_reset_complete": _AUTH,
}
EXEMPT_ROUTE_PREFIXES = {
    "static/": "static files (if ever routed, e.g. django.conf.urls.static under DEBUG): public assets",
}

# Lists that must show a caller its own projects' objects only: (url name, query, kinds of object it
# lists; a path parameter names the shared signature). The member must see acme's, charlie (session
# and, on the API, token) umbrella's and no trace of acme's: no title of any acme object, no link to
# one, no acme id among the listed kind's ids.
LISTS = [
    ("front:report_list", "", ("report",)),
    ("front:groups", "", ("group",)),
    ("front:compare", "", ("report",)),
    ("front:hosts", "?probe={probe}", ("probe",)),
    ("front:compat", "", ("probe",)),
    ("front:decisions", "", ("decision",)),
    ("front:notifications", "", ("endpoint",)),
    ("api:reports", "", ("report",)),
    ("api:decisions", "", ("decision",)),
    ("api:decisions", "?format=export", ("decision",)),
    ("api:groups", "", ("group",)),
    ("api:signature", "", ("decision",)),
]

from django.http import HttpRequest, JsonResponse


def _todo(request: HttpRequest, **kwargs: object) -> JsonResponse:
    return JsonResponse({"error": "not implemented yet"}, status=501)


schema = reports = report_detail = ci_hook = _todo

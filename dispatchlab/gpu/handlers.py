"""What the GPU side does when the report pipeline announces something (dispatchlab.events), subscribed
in GpuConfig.ready(); and the confirm runs' texts a redaction reaches (dispatchlab.reports.copies)."""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from dispatchlab.events import ReportParsed
from dispatchlab.gpu.confirm_outcomes import confirm_report_parsed
from dispatchlab.gpu.models import ConfirmOutput, ConfirmRun
from dispatchlab.reports.models import Report

# The confirm run's columns that may quote the report's launch (and so a secret in it).
CONFIRM_FIELDS = ("original_command", "args", "env", "fix_args", "fix_env", "job", "argv", "result", "error")


def report_parsed(event: ReportParsed) -> None:
    """The output of a confirm run parsed (or failed to): now its outcome can be decided. Safe to repeat:
    a finished confirm is left as it is."""
    confirm_report_parsed(report_id=event.report_id)


class ConfirmTexts:
    """A report's confirm runs (launch, result) and their streamed output; the reports made of that
    output follow the redaction."""

    def _confirms(self, report_id: int) -> Any:
        return ConfirmRun.objects.filter(Q(report_id=report_id) | Q(result_report_id=report_id))

    def read(self, report: Report) -> dict[str, Any]:
        confirms = self._confirms(report.id)
        outputs = ConfirmOutput.objects.filter(confirm__in=confirms).values_list("id", "text")
        return {
            "confirms": {
                str(confirm["id"]): confirm
                for confirm in confirms.values("id", *CONFIRM_FIELDS).order_by("id")
            },
            "outputs": {str(output_id): text for output_id, text in outputs},
        }

    def write(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        for key, fields in after["confirms"].items():
            if before["confirms"].get(key) != fields:
                ConfirmRun.objects.filter(id=int(key)).update(
                    **{field: fields[field] for field in CONFIRM_FIELDS}
                )
        for key, text in after["outputs"].items():
            if before["outputs"].get(key) != text:
                ConfirmOutput.objects.filter(id=int(key)).update(text=text)

    def followers(self, report_id: int) -> list[int]:
        outputs = ConfirmRun.objects.filter(report_id=report_id, result_report__isnull=False)
        return [int(output_id) for output_id in outputs.values_list("result_report_id", flat=True)]

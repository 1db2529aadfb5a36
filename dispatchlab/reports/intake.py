"""What an upload must be before it is stored: text logs, not empty, not binary, not a broken `.gz`.

Checked on the request, from each file's first bytes (the core's own reading rules), so a file that can
never become a report is refused with the reason while the person is still on the form, and nothing is
stored. A pasted log arrives as form text and becomes one more file.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.core.files import File
from django.core.files.uploadedfile import SimpleUploadedFile

from dispatchlab.core.reading import LogReadError, check_upload_head
from dispatchlab.reports.submit import UploadRejected

PASTED_NAME = "pasted.log"


def upload_check_readable(*, files: Sequence[File], names: Sequence[str] = ()) -> None:
    """UploadRejected naming every file that is empty, binary or unreadable (all of them, not the
    first only). `names`: how to call each file in the message (default: its own name)."""
    problems = []
    for position, file in enumerate(files):
        name = names[position] if position < len(names) else str(file.name or f"file {position + 1}")
        try:
            check_upload_head(file, name)  # type: ignore[arg-type]
        except LogReadError as refused:
            problems.append(str(refused))
        except OSError as failure:
            problems.append(f"{name}: cannot be read ({failure})")
    if problems:
        raise UploadRejected(problems)


def pasted_log(text: str) -> SimpleUploadedFile | None:
    """The pasted text as an uploaded file, or None when nothing but white space was pasted. Line
    ends are kept as typed: the parser normalises them."""
    if not text.strip():
        return None
    return SimpleUploadedFile(PASTED_NAME, text.encode("utf-8"), content_type="text/plain")

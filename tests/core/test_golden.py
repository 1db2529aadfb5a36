"""Golden files: each fixture log and the parsed document it must give.

Regenerate after a deliberate parser change with `DISPATCHLAB_REGEN_GOLDEN=1 pytest tests/core/test_golden.py`
and review the diff of tests/fixtures/golden/.
"""

from __future__ import annotations

import json
import os

import pytest

from dispatchlab.core import parse_paths

from .helpers import GOLDEN, LOGS, assert_contract_document

CASES = sorted(p.name for p in LOGS.glob("*.log"))


def _document(name: str) -> dict:
    doc = parse_paths([LOGS / name])
    for source in doc["sources"]:
        source["name"] = os.path.basename(source["name"])
    return json.loads(json.dumps(doc))


@pytest.mark.parametrize("name", CASES)
def test_the_parsed_document_matches_its_golden_file(name: str):
    doc = _document(name)
    assert_contract_document(doc)
    golden = GOLDEN / (name.removesuffix(".log") + ".json")
    if os.environ.get("DISPATCHLAB_REGEN_GOLDEN") or not golden.exists():
        golden.write_text(json.dumps(doc, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
        if not os.environ.get("DISPATCHLAB_REGEN_GOLDEN"):
            pytest.fail(f"{golden.name} did not exist: written, review it and commit it")
    expected = json.loads(golden.read_text())
    assert doc == expected

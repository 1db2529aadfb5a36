"""Where Chromium is missing: a developer's machine skips the browser flows, CI fails them."""

from __future__ import annotations

import pytest
from chromium import require_chromium


def test_a_missing_chromium_fails_the_run_in_ci(monkeypatch, tmp_path):
    monkeypatch.setenv("DISPATCHLAB_CI", "1")
    with pytest.raises(pytest.fail.Exception, match="DISPATCHLAB_CI"):
        require_chromium(str(tmp_path / "chromium"))


@pytest.mark.parametrize("value", [None, "", "0", "false"])
def test_a_missing_chromium_skips_the_browser_flows_outside_ci(monkeypatch, tmp_path, value):
    if value is None:
        monkeypatch.delenv("DISPATCHLAB_CI", raising=False)
    else:
        monkeypatch.setenv("DISPATCHLAB_CI", value)
    with pytest.raises(pytest.skip.Exception):
        require_chromium(str(tmp_path / "chromium"))


def test_an_installed_chromium_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("DISPATCHLAB_CI", "1")
    binary = tmp_path / "chromium"
    binary.write_text("")
    assert require_chromium(str(binary)) == str(binary)

"""Static files as production serves them (DISPATCHLAB_STATIC_MANIFEST): collected under hashed names with
gzip and Brotli copies, sent compressed to a browser that accepts it and cached for a year. The other
tests render pages with plain storage and need no collected files."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.http import HttpResponse
from django.templatetags.static import static
from django.test import RequestFactory, override_settings
from whitenoise.middleware import WhiteNoiseMiddleware

from dispatchlab.config.staticfiles import collect_if_stale

MANIFEST_STORAGE = "dispatchlab.config.staticfiles.CompressedManifestStorage"
YEAR = 315360000  # WhiteNoise's max-age for a file whose name holds its hash


def _served(path: str, accept_encoding: str) -> HttpResponse:
    middleware = WhiteNoiseMiddleware(lambda request: HttpResponse("not a static file", status=404))
    request = RequestFactory().get(path, HTTP_ACCEPT_ENCODING=accept_encoding)
    return middleware(request)


@pytest.fixture
def collected(tmp_path: Path, settings, db):  # db: closing a response signals request_finished
    root = tmp_path / "collected"
    storages = {**settings.STORAGES, "staticfiles": {"BACKEND": MANIFEST_STORAGE}}
    with override_settings(STATIC_ROOT=root, STORAGES=storages, WHITENOISE_USE_FINDERS=False):
        assert collect_if_stale() is True
        yield root


def test_collected_files_have_hashed_names_and_compressed_copies(collected: Path):
    url = static("vendor/plotly-basic.min.js")
    assert url.startswith("/static/vendor/plotly-basic.min.") and url != "/static/vendor/plotly-basic.min.js"
    hashed = collected / url.removeprefix("/static/")
    original = (Path(__file__).resolve().parents[2] / "static/vendor/plotly-basic.min.js").stat().st_size
    assert hashed.stat().st_size == original
    assert Path(f"{hashed}.gz").stat().st_size < original / 3
    assert Path(f"{hashed}.br").stat().st_size < Path(f"{hashed}.gz").stat().st_size


def test_a_hashed_file_is_sent_compressed_and_cached_for_a_year(collected: Path):
    url = static("vendor/plotly-basic.min.js")
    for accepted, encoding in (("gzip, deflate, br", "br"), ("gzip", "gzip")):
        response = _served(url, accepted)
        assert response.status_code == 200
        assert response["Content-Encoding"] == encoding
        assert f"max-age={YEAR}" in response["Cache-Control"] and "immutable" in response["Cache-Control"]
        response.close()
    plain = _served(url, "")
    assert "Content-Encoding" not in plain and plain["Content-Length"] == str(
        (collected / url.removeprefix("/static/")).stat().st_size
    )
    plain.close()


def test_a_second_collect_with_nothing_changed_does_nothing(collected: Path):
    before = (collected / "staticfiles.json").stat().st_mtime_ns
    assert collect_if_stale() is False
    assert (collected / "staticfiles.json").stat().st_mtime_ns == before
    assert static("css/app.css").startswith("/static/css/app.")


def test_a_changed_static_file_is_collected_again(collected: Path, settings, tmp_path: Path):
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "note.css").write_text("body { color: black }")
    with override_settings(STATICFILES_DIRS=[*settings.STATICFILES_DIRS, extra]):
        assert collect_if_stale() is True
        assert static("note.css").startswith("/static/note.")
